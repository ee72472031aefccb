"""Per-step series of metrics.jsonl keys from a `tether sweep` directory, per arm and seed, with the
mean of the first and the last K training steps (how a metric moved over the run).

    python benchmarks/findings_series.py runs/findings/dr_grpo_length response_length/wrong_mean \
        --out benchmarks/results/findings/dr_grpo_length/series.json

Reads <sweep>/sweep.json for the runs; a pipeline run's RL stage is <run>/rl/metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def series(run_dir: Path, key: str) -> list[float | None]:
    for path in (run_dir / "metrics.jsonl", run_dir / "rl" / "metrics.jsonl"):
        if path.exists():
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            return [r.get(key) for r in rows if r.get("step", 0) >= 1]
    return []


def first_last(vals: list[float | None], k: int) -> tuple[float | None, float | None]:
    ok = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    if not ok:
        return None, None
    return statistics.fmean(ok[:k]), statistics.fmean(ok[-k:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("keys", nargs="+")
    ap.add_argument("--k", type=int, default=5, help="steps averaged at the start and at the end")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sweep = json.loads((args.sweep / "sweep.json").read_text())
    out: dict = {"sweep": str(args.sweep), "k": args.k, "runs": []}
    for r in sweep["runs"]:
        run_dir = Path(r["run_dir"])
        row = {"arm": r["arm"], "seed": r["seed"]}
        for key in args.keys:
            vals = series(run_dir, key)
            first, last = first_last(vals, args.k)
            row[key] = {"first_k_mean": first, "last_k_mean": last, "series": vals}
        out["runs"].append(row)
    summary: dict = {}
    for key in args.keys:
        for arm in dict.fromkeys(r["arm"] for r in out["runs"]):
            rows = [r[key] for r in out["runs"] if r["arm"] == arm and r[key]["first_k_mean"] is not None]
            growth = [x["last_k_mean"] - x["first_k_mean"] for x in rows]
            summary.setdefault(key, {})[arm] = {
                "n": len(rows), "first_k_mean": statistics.fmean(x["first_k_mean"] for x in rows) if rows else None,
                "last_k_mean": statistics.fmean(x["last_k_mean"] for x in rows) if rows else None,
                "growth_mean": statistics.fmean(growth) if growth else None,
                "growth_se": statistics.stdev(growth) / math.sqrt(len(growth)) if len(growth) > 1 else None}
    out["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
