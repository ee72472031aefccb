"""The sampler's shared prefill, on and off, in one process (docs/performance.md, "The sampler").

    python benchmarks/archive/shared_prefill.py [--sizes small,large] [--rounds 9] [--precision fp32] [--out FILE]

GRPO samples n completions per prompt; tether's sampler runs the prompt forward (the prefill) once
per distinct prompt and copies its keys/values to the prompt's rows (tether.policy.sampling,
`_distinct_prompts`). This times generation of the vs_trl benchmark's batch (8 prompts x 8
completions x up to 64 tokens, one torch thread) with the sharing on and with it off (every row
prefilled, as before 2026-12-02 and as TRL's generate does), alternating the arms `--rounds` times
in one process, the same seeded generator for both; medians of all rounds but the first. Appends
one entry to `--out`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--out", default=str(HERE / "results" / "shared_prefill.json"))
    a = p.parse_args(argv)
    import torch

    from gen_speed import append_entry, benchmark_policies
    from tether.config import SamplingConfig
    from tether.policy import sampling
    from tether.policy.hf import run_generate

    real, rows = sampling._distinct_prompts, []
    try:
        for size, pol, prompts in benchmark_policies(a.sizes, a.precision, "tether-shared-prefill-"):
            cfg, times = SamplingConfig(max_new_tokens=64), {"shared": [], "per_row": []}
            for _ in range(a.rounds):
                for arm in times:
                    sampling._distinct_prompts = real if arm == "shared" else (lambda ps, dev: (None, None))
                    g = torch.Generator().manual_seed(0)
                    t0 = time.perf_counter()
                    run_generate(pol, prompts, cfg, g)
                    times[arm].append(time.perf_counter() - t0)
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            rows.append({"size": size, "precision": a.precision, "shared_s": round(med["shared"], 4),
                         "per_row_s": round(med["per_row"], 4), "ratio": round(med["shared"] / med["per_row"], 3),
                         "runs_s": {k: [round(x, 4) for x in v] for k, v in times.items()}})
            print(f"[shared-prefill] {size} {a.precision}: {med['shared']:.3f} s shared vs {med['per_row']:.3f} s "
                  f"per row ({rows[-1]['ratio']:.2f}x)", flush=True)
    finally:
        sampling._distinct_prompts = real
    return append_entry(a.out, rows)


if __name__ == "__main__":
    main()
