"""Throughput of asynchronous RL (recipes/rl_async.py) vs the synchronous recipe, and 1 vs 2 rollout
workers, on THIS machine — reported as ratios measured in one sitting.

    .venv/bin/python benchmarks/dist_throughput.py                          # ~10 minutes on 2 cores
    .venv/bin/python benchmarks/dist_throughput.py --steps 6 --repeats 1    # quicker, noisier

Caveat, stated in the output too: on a 2-core CPU the trainer (the driver process) and every
rollout worker compete for the same two cores, so overlapping generation with training can only
win what the single process left idle, and a second worker mostly adds contention. The numbers
say whether the machinery costs or gains throughput here; they are not a scaling curve. On a GPU
cluster the workers and the trainer own separate devices.

Throughput = trained samples per second over the steady-state steps (the first two steps, which
include Ray start-up, worker spawn and the pipeline filling, are left out), from each run's
`time/step` (rollout wait + batch + update; evaluation excluded). Every run is a fresh process;
each configuration runs `--repeats` times, the order reversed every other round, and the
medians are compared (load on a shared machine drifts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CAVEAT = ("2-core CPU shared by the trainer and every rollout worker (and, on a shared machine, other jobs): "
          "async can only reclaim the time one process leaves idle, and a 2nd worker mostly adds contention; "
          "ratios from one sitting, not a scaling curve.")

BASE = ["model.tiny.hidden_size=128", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
        "model.tiny.intermediate_size=344", "logging.progress=false", "logging.tensorboard=false", "run.threads=1",
        "checkpoint.every=0", "health.mode=off", "eval.samples=1", "eval.problems=4", "data.task=reverse",
        "data.train_size=1024", "data.eval_size=4", "train.lr=1e-4", "rollout.problems_per_step=16", "rollout.n=8",
        "rollout.sampling.max_new_tokens=24", "eval.sampling.max_new_tokens=24", "reward.isolation=inline",
        "dist.num_cpus=4"]

RUNS = {  # name -> (recipe, overrides)
    "sync": ("rl", []),
    "async_s0_1w": ("rl_async", ["dist.rollout_workers=1", "dist.max_staleness=0"]),
    "async_s1_1w": ("rl_async", ["dist.rollout_workers=1", "dist.max_staleness=1", "dist.correction=tis"]),
    "async_s1_2w": ("rl_async", ["dist.rollout_workers=2", "dist.max_staleness=1", "dist.correction=tis"]),
}


def run_one(name: str, steps: int, root: Path) -> dict[str, float]:
    import torch

    from tether.config import load_config
    from tether.recipes.rl import run_rl
    from tether.recipes.rl_async import run_rl_async

    torch.set_num_threads(1)
    recipe, extra = RUNS[name]
    cfg = load_config(None, BASE + [f"train.steps={steps}"] + extra)
    out = root / name
    t0 = time.perf_counter()
    (run_rl if recipe == "rl" else run_rl_async)(cfg, out)
    wall = time.perf_counter() - t0
    rows = [r for r in map(json.loads, open(out / "metrics.jsonl")) if "pg_loss" in r]
    steady = rows[2:]
    step_s = sum(r["time/step"] for r in steady)
    samples = sum(r["batch/sequences"] for r in steady)
    return {"samples_per_s": samples / step_s, "tokens_per_s": sum(r["rollout/gen_tokens"] for r in steady) / step_s,
            "median_step_s": statistics.median(r["time/step"] for r in steady),
            "wait_rollout_s": statistics.median(r.get("time/wait_rollout", r["time/rollout_total"]) for r in steady),
            "update_s": statistics.median(r["time/update"] for r in steady), "wall_s": wall,
            "steady_steps": len(steady), "reward_last": rows[-1]["reward/mean"]}


def _child(name: str, steps: int, out: Path) -> dict[str, float]:
    """One configuration in a fresh process (no warm kernel caches or allocator state carried over)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as d:
        res = Path(d) / "result.json"
        subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(steps), "--out", str(res)],
                       check=True, stdout=subprocess.DEVNULL)
        return json.loads(res.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="each configuration this often, order reversed every other round")
    ap.add_argument("--out", default="benchmarks/results/dist_throughput.json")
    ap.add_argument("--only", nargs="*", default=list(RUNS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(prefix="tether-bench-") as d:
            Path(args.out).write_text(json.dumps(run_one(args.child, args.steps, Path(d))))
        return
    load_before = os.getloadavg()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in args.only}
    for rep in range(args.repeats):  # alternate the order so that load drift hits every configuration alike
        for name in (args.only if rep % 2 == 0 else args.only[::-1]):
            r = _child(name, args.steps, Path(args.out))
            samples[name].append(r)
            print(f"{name:12s} {r['samples_per_s']:8.1f} samples/s  median step {r['median_step_s']:.2f}s  "
                  f"(wait {r['wait_rollout_s']:.2f}s, update {r['update_s']:.2f}s)  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    results = {name: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for name, runs in samples.items()}
    pairs = {"async_s1_1w / sync": ("async_s1_1w", "sync"), "async_s1_2w / sync": ("async_s1_2w", "sync"),
             "2 workers / 1 worker (s=1)": ("async_s1_2w", "async_s1_1w"), "async_s0_1w / sync": ("async_s0_1w", "sync"),
             "overlap: s=1 / s=0 (1 worker)": ("async_s1_1w", "async_s0_1w")}
    ratios = {label: results[a]["samples_per_s"] / results[b]["samples_per_s"]
              for label, (a, b) in pairs.items() if a in results and b in results}
    report = {"ratios": ratios, "medians": results, "runs": samples, "caveat": CAVEAT, "steps": args.steps,
              "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                          "python": sys.version.split()[0], "platform": platform.platform()},
              "command": "python benchmarks/dist_throughput.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for label, r in ratios.items():
        print(f"{label:28s} {r:.2f}x")
    print(f"caveat: {CAVEAT}\nwrote {args.out}")


if __name__ == "__main__":
    main()
