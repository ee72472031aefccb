"""Completion tokens and reward per step, tether vs TRL, on the vs_trl benchmark's step.

    python benchmarks/archive/completion_lengths.py [--size large] [--steps 8] [--seeds 0,1]
                                            [--out benchmarks/results/completion_lengths.json]

Both frameworks in bf16 from the same built model (vs_trl.build_model_dir), one fresh process per
framework and seed (vs_trl.run_worker), no warm-up steps. For each step it records the tokens sampled
over the step's 64 completions and the mean reward (the dense, length-penalised reversal reward).
It shows whether the two learn to stop earlier at the same rate. That matters for
benchmarks/step_floor.py, whose later steps are cheaper for both frameworks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="large")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default=str(HERE / "results" / "completion_lengths.json"))
    args = ap.parse_args(argv)

    from vs_trl import base_spec, build_model_dir, machine_description, run_worker

    out = {"command": "python benchmarks/archive/completion_lengths.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "size": args.size, "precision": "bf16", "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(args.size, Path(tmp) / args.size)
        for fw in ("tether", "trl"):
            for seed in (int(s) for s in args.seeds.split(",")):
                spec = base_spec(fw, model_dir, "bf16", 1, seed)
                spec.update(warmup=0, steps=args.steps)
                res = run_worker(spec, Path(tmp))
                run = [{"gen_tokens": round(s["gen_tokens"]), "reward": round(s["reward"], 3)} for s in res["steps"]]
                out["runs"][f"{fw}_seed{seed}"] = run
                print(f"  [{fw} seed {seed}] tokens per step: " + ", ".join(str(r["gen_tokens"]) for r in run), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
