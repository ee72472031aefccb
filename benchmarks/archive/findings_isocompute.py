"""IsoCompute's n* per budget from benchmarks/results/plan_sweep.json (benchmarks/plan_sweep.py):
per budget, the best (B_p, M) at each rollouts-per-problem n with its mean ± standard error over
seeds (ddof 1), n* (the best n), and the planner's picks and ranks.

    python benchmarks/archive/findings_isocompute.py --out benchmarks/results/findings/isocompute/from_plan_sweep.json

--src may also be plan_sweep.py's own output (runs/plan_sweep/summary.json, after
`python benchmarks/plan_sweep.py --task count --budgets 1024,4096 --seeds 0,1,2`, `... --budgets 8192
--seeds 0,1`, `... --budgets 16384 --seeds 0`): its planner pick (`plan`, the current rule) is
reported as "v2"; the committed benchmarks/results/plan_sweep.json also holds the v1 picks of commit 8bc8ba7.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def mean_se(values: list[float]) -> tuple[float, float | None]:
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=Path("benchmarks/results/plan_sweep.json"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    src = json.loads(args.src.read_text())
    if "settings" not in src:  # plan_sweep.py's summary.json: {task@budget: result}; its pick is the current rule (v2)
        src = {"command": "benchmarks/plan_sweep.py (runs/plan_sweep/summary.json)", "setup": "", "settings": {
            k: {**r, "seeds": len(r["table"][0]["values"]),
                "v2": {"pick": r["plan"], "rank": r["plan_rank"], "pass@1": r["plan_pass@1"]}} for k, r in src.items()}}
    out = {"source": str(args.src), "source_command": src["command"], "setup": src["setup"], "budgets": {}}
    for name, s in sorted(src["settings"].items(), key=lambda kv: (kv[1]["task"], kv[1]["budget"])):
        best_by_n: dict[int, dict] = {}
        for row in s["table"]:  # sorted best first: the first row of each n is its best allocation
            if row["n"] not in best_by_n:
                m, se = mean_se(row["values"])
                best_by_n[row["n"]] = {"bp": row["bp"], "M": row["M"], "mean": m, "se": se, "seeds": len(row["values"])}
        n_star = max(best_by_n, key=lambda n: best_by_n[n]["mean"])
        out["budgets"][name] = {
            "task": s["task"], "budget": s["budget"], "seeds": s["seeds"], "configs": s["configs"],
            "start_pass@1": s["start_pass@1"], "n_star": n_star, "best_by_n": dict(sorted(best_by_n.items())),
            "planner": {v: {"pick": s[v]["pick"], "rank": s[v]["rank"], "pass@1": s[v]["pass@1"],
                            "out_of_sample": s[v].get("out_of_sample")} for v in ("v1", "v2") if v in s}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, b in out["budgets"].items():
        cells = ", ".join(f"n={n}: {r['mean']:.3f}" + (f"±{r['se']:.3f}" if r["se"] else "") for n, r in b["best_by_n"].items())
        print(f"{name} ({b['seeds']} seeds): n*={b['n_star']}; {cells}; planner {b['planner']}")


if __name__ == "__main__":
    main()
