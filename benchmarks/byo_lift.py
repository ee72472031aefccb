"""Own model, own data, the documented command: held-out pass@1 after SFT and after RL, 3 seeds.

    python benchmarks/byo_lift.py            # the measurement (its default --out benchmarks/results/byo_lift.json)
    python benchmarks/byo_lift.py --smoke    # one seed, a few steps (writes runs/byo-lift-smoke.json)

docs/byo.md's example: `tools/byo_example.py` builds a tiny Qwen2-format model and tether's
`reverse` task in verl's parquet layout, and each seed runs the documented command as a user
would, in its own process:

    tether pipeline configs/byo.yaml model.path=<dir>/tiny-qwen2 data.path=<dir>/reverse.parquet \\
        'reward.components=[{name: exact_match}]' run.seed=S

with configs/byo.yaml's `auto` settings fitted to that model and data (tether/config/fit.py;
the values are recorded per seed). The lift is the pipeline's own: held-out pass@1 (64 held-out
rows x 4 samples, configs/byo.yaml's eval) after the SFT stage and after the RL stage. Recorded
per seed: both, the greedy accuracies, the wall seconds and the CPU seconds of the command (user +
system of the child process: the figure to read on a machine shared with other jobs), the load
average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from byo_example import build_example  # noqa: E402
from harness_lift import _commit, _cpu_name, _write_result  # noqa: E402

FITTED = ("train.lr", "sft.lr", "train.steps", "sft.steps", "rollout.sampling.max_new_tokens", "rollout.max_prompt_tokens")


def _get(data: dict, key: str):
    for part in key.split("."):
        data = (data or {}).get(part)
    return data


def run_seed(model: Path, parquet: Path, seed: int, run_dir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tether.cli", "pipeline", str(ROOT / "configs/byo.yaml"), f"model.path={model}",
           f"data.path={parquet}", "reward.components=[{name: exact_match}]", f"run.seed={seed}",
           "logging.progress=false", *extra, "--run-dir", str(run_dir), "--overwrite"]
    load0, r0, t0 = os.getloadavg(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    (run_dir / "command.log").write_text(proc.stdout + proc.stderr) if run_dir.is_dir() else None
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: the command failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rl_cfg = yaml.safe_load((run_dir / summary["stages"][-1]["name"] / "config.yaml").read_text())
    sft_cfg = yaml.safe_load((run_dir / summary["stages"][0]["name"] / "config.yaml").read_text())
    return {"seed": seed, "after_sft": summary["baseline_accuracy"], "after_rl": summary["final_accuracy"],
            "lift_points": 100 * summary["accuracy_lift"], "greedy_after_sft": summary["baseline_greedy_accuracy"],
            "greedy_after_rl": summary["final_greedy_accuracy"], "wall_seconds": wall,
            "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "load_average_at_start": load0, "load_average_at_end": os.getloadavg(),
            "fitted": {k: _get(rl_cfg if not k.startswith("sft") else sft_cfg, k) for k in FITTED},
            "command": " ".join(cmd[2:]).replace(str(ROOT) + "/", "")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dir", default="runs/byo-lift", help="the example's files and the runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/byo_lift.json"))
    ap.add_argument("--smoke", action="store_true", help="seed 0, 2 SFT + 2 RL steps")
    args = ap.parse_args(argv)
    extra = []
    if args.smoke:
        args.seeds, extra = "0", ["sft.steps=2", "train.steps=2", "eval.problems=4", "eval.samples=1"]
        if "--out" not in (argv if argv is not None else sys.argv):
            args.out = "runs/byo-lift-smoke.json"
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    root = Path(args.dir)
    model, parquet = build_example(root / "example")
    seeds = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        row = run_seed(model, parquet, seed, root / f"seed-{seed}", extra)
        print(f"[byo-lift] seed {seed}: held-out pass@1 after SFT {row['after_sft']:.3f} -> after RL {row['after_rl']:.3f} "
              f"({row['lift_points']:+.1f} points); {row['wall_seconds']:.0f}s wall, {row['cpu_seconds']:.0f} CPU seconds, "
              f"load {row['load_average_at_start'][0]:.1f}", flush=True)
        seeds.append(row)
    lifts = [r["lift_points"] for r in seeds]
    result = {
        "command": "python benchmarks/byo_lift.py " + " ".join(sys.argv[1:]),
        "documented_command": seeds[0]["command"], "example": "tools/byo_example.py (tiny Qwen2, reverse in verl's layout)",
        "seeds": seeds, "lift_points_mean": sum(lifts) / len(lifts), "lift_points_min": min(lifts),
        "every_seed_lifts_10_points": all(x >= 10 for x in lifts),
        "max_wall_seconds": max(r["wall_seconds"] for r in seeds), "max_cpu_seconds": max(r["cpu_seconds"] for r in seeds),
        "cpus": os.cpu_count(), "cpu": _cpu_name(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "note": "wall times on a machine shared with other jobs are upper bounds; CPU seconds (the command's own user + "
                "system time, all threads) do not depend on the load; 2 cores give at most 2 CPU seconds per second",
    }
    _write_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "seeds"}, indent=2))


if __name__ == "__main__":
    main()
