"""The compiled decode step's attention over the cache's written positions only (LeanDecoder.LIVE_ONLY,
the default since 2026-12-03) against over its whole window (the allocated positions, an empty tail
under -inf included; the behaviour before), as RL steps.

    python benchmarks/decode_window.py [--sizes small,large] [--precisions bf16] [--pairs 4]
                                       [--out benchmarks/results/decode_window.json]

The window grows in steps of 32 positions and at least doubles, so on vs_trl.py's benchmark step
(8 prompts x 8 completions of the reverse task, prompts of ~17 tokens, up to 64 new ones) the
attention read ~1.45x the positions it needed. Both compilations on (the eager step is unchanged);
bf16 needs a native-bf16 CPU. Paired steps (benchmarks/paired.py): one copied
state, one seed, ABBA, `--pairs` steps each, one thread.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def window_use(cfg, st) -> dict:
    """Rows x positions the attention reads over one generation call, whole window against written
    positions (from the decoder's state at every step)."""
    import tether.recipes.rl as rl
    from tether.policy import decode

    seen = []
    step = decode.LeanDecoder.step

    def spy(self, *a):
        out = step(self, *a)
        seen.append((self.batch, self.window, self.length))
        return out

    decode.LeanDecoder.step = spy
    try:
        rl.run_rl_step(copy.deepcopy(st), cfg)
    finally:
        decode.LeanDecoder.step = step
    whole, live = sum(b * w for b, w, _ in seen), sum(b * n for b, _, n in seen)
    return {"decode_steps": len(seen), "rows_x_window": whole, "rows_x_written": live, "whole_over_written": whole / live}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--precisions", default="bf16")
    ap.add_argument("--pairs", type=int, default=4, help="steps per setting")
    ap.add_argument("--out", default=str(HERE / "results" / "decode_window.json"))
    args = ap.parse_args(argv)

    import torch

    from paired import bench_state, paired_steps
    from tether.hardware import cpu_native_bf16
    from tether.policy import decode
    from vs_trl import build_model_dir, machine_description

    torch.set_num_threads(1)
    t0 = time.time()
    out = {"command": "python benchmarks/decode_window.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "steps": {}}
    precisions = [p for p in args.precisions.split(",") if p]
    if "bf16" in precisions and not cpu_native_bf16():
        print("  no native bf16 on this CPU: bf16 steps skipped", flush=True)
        precisions.remove("bf16")

    def live(flag: bool):
        return lambda: setattr(decode.LeanDecoder, "LIVE_ONLY", flag)

    try:
        with tempfile.TemporaryDirectory() as tmp:
            for size in args.sizes.split(","):
                md = build_model_dir(size, Path(tmp) / size)
                for precision in precisions:
                    cfg, st = bench_state(md, precision, True)
                    res = paired_steps(cfg, st, {"whole_window": live(False), "written_only": live(True)}, args.pairs,
                                       f"{size} {precision}")
                    res["window_use"] = window_use(cfg, st)
                    out["steps"][f"{size} {precision}"] = res
    finally:
        decode.LeanDecoder.LIVE_ONLY = True
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
