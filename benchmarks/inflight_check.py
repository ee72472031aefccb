"""Do in-flight weight updates land inside generations in a real `train-async` run? (issue 20)

    python benchmarks/inflight_check.py        # -> benchmarks/results/inflight_check.json

A tiny random-init model on the reverse task, one rollout worker, max_staleness 1, dist.inflight
on, long generations (64 new tokens) so that generating batch v+1 can outlast the trainer's update
v. Per step: versions the worker adopted mid-generation (rollout/inflight_switch_count), the sync
probe gap and failures. Says whether the mechanism fires on Ray; not a quality measurement.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
             "model.tiny.intermediate_size=128", "logging.progress=false", "logging.tensorboard=false",
             "run.threads=1", "checkpoint.every=0", "eval.every=0", "eval.samples=1", "eval.problems=2",
             "data.task=reverse", "data.train_size=64", "data.eval_size=2", "train.steps=8", "train.lr=1e-3",
             "rollout.problems_per_step=4", "rollout.n=4", "rollout.sampling.max_new_tokens=64",
             "eval.sampling.max_new_tokens=8", "reward.isolation=inline", "dist.num_cpus=4",
             "dist.rollout_workers=1", "dist.inflight=true", "dist.max_staleness=1", "dist.correction=tis",
             "algo.correction.mode=truncate"]


def main() -> None:
    from tether.config import load_config
    from tether.recipes.rl_async import run_rl_async

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks/results/inflight_check.json"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_rl_async(load_config(None, OVERRIDES), tmp)
        rows = [json.loads(line) for line in open(Path(tmp) / "metrics.jsonl")]
    steps = [{"step": r["step"], "inflight_switch_count": r.get("rollout/inflight_switch_count"),
              "probe_gap": r.get("sync/probe_gap"), "staleness_max": r.get("staleness/max"),
              "time_rollout_s": round(r.get("time/rollout_total", float("nan")), 2),
              "time_update_s": round(r.get("time/update", float("nan")), 2)} for r in rows if "pg_loss" in r]
    result = {"command": "python benchmarks/inflight_check.py", "overrides": OVERRIDES, "steps": steps,
              "total_switches": sum(s["inflight_switch_count"] or 0 for s in steps),
              "sync_failures": summary["dist_counters"].get("sync/failures"),
              "probe_failures": summary["dist_counters"].get("sync/probe_failures"),
              "wall_s": round(time.perf_counter() - t0, 1)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("overrides", "command")}, indent=1))


if __name__ == "__main__":
    main()
