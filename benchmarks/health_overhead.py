"""The health layer's cost on the demo (`tether demo`, health.mode advise - its default): the share of
the RL step time spent on the monitor and the update's probes.

    python benchmarks/health_overhead.py [--out benchmarks/results/health_overhead.json] [--set key=value ...]

The layer times itself in the run (metrics.jsonl): `time/health` (the monitor after each step: the
trajectory statistics, the fingerprints of the trainer's weights and buffers, every detector, the
diagnosis), `time/probes` (inside the update: the probe rows' forwards and the step statistics) and
`time/fingerprint` (the rollout's weight and buffer fingerprints). The overhead is their sum over
the RL step time without them: sum(health + probes + fingerprint) / sum(step - probes - fingerprint)
over every RL step. A self-timed share, because a paired on/off comparison cannot resolve 2% on a
shared 2-core machine (run-to-run wall time moves more than that); the file also records the CPU
seconds and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

KEYS = ("time/health", "time/probes", "time/fingerprint")


def compute_overhead(rows: list[dict]) -> dict:
    """The layer's share of the step time from an RL run's metrics rows (those with `time/step`)."""
    steps = [r for r in rows if "time/step" in r]
    cost = {k: sum(float(r.get(k, 0.0)) for r in steps) for k in KEYS}
    inside = cost["time/probes"] + cost["time/fingerprint"]  # counted in time/step
    base = sum(float(r["time/step"]) for r in steps) - inside
    per_step = [(sum(float(r.get(k, 0.0)) for k in KEYS)) / (float(r["time/step"]) - float(r.get("time/probes", 0.0))
                                                            - float(r.get("time/fingerprint", 0.0))) for r in steps]
    return {"steps": len(steps), "step_seconds_without_layer": base, "layer_seconds": cost,
            "overhead_frac": sum(cost.values()) / base if base > 0 else None,
            "overhead_frac_per_step_median": sorted(per_step)[len(per_step) // 2] if per_step else None,
            "overhead_frac_per_step_max": max(per_step) if per_step else None}


def main() -> None:
    from tether.recipes.demo import run_demo

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/health_overhead.json"))
    ap.add_argument("--set", action="append", default=[], help="config overrides of the demo (key=value)")
    args = ap.parse_args()
    load0 = open("/proc/loadavg").read().split()[:3]
    t0, c0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_demo(Path(tmp) / "demo", args.set)
        rows = [json.loads(x) for x in (Path(summary["rl_run"]) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    res = {
        "what": "the health layer's share of the demo's RL step time (health.mode advise, self-timed)",
        "command": "python benchmarks/health_overhead.py" + "".join(f" --set {s}" for s in args.set),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **compute_overhead(rows),
        "demo": {k: summary.get(k) for k in ("baseline_accuracy", "final_accuracy", "rl_steps", "rl_seconds")},
        "wall_seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
        "cores": os.cpu_count(), "loadavg_start": [float(x) for x in load0],
        "loadavg_end": [float(x) for x in open("/proc/loadavg").read().split()[:3]],
        "precision": summary.get("precision"),
    }
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"overhead {res['overhead_frac']:.2%} of the RL step time over {res['steps']} steps; wrote {args.out}")


if __name__ == "__main__":
    main()
