"""The training effect of a set of fault kinds, from a `tether faultbench` output directory, and
nothing else: the final policy's verified accuracy (cases.jsonl: final_train_acc,
final_heldout_acc) and the rollouts' accuracy and reward over the last steps (each run's
metrics.jsonl: `accuracy`, `reward/mean`), against the healthy control.

    python benchmarks/faultbench_effect.py /tmp/fresh4_fb --what "..." --command "..." \
        --out benchmarks/results/faultbench_fresh4_effect.json [--steps 24-30] [--note "..."]

Written for a held-out fault set: it reads no detection or diagnosis field of the records
(`health`, results.json), so whoever writes the set can check that each kind moves training
without seeing how the health layer answered.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

EFFECT_KEYS = ("final_train_acc", "final_heldout_acc")  # the only fields read from a case record


def compute_window_means(metrics: Path, lo: int, hi: int) -> tuple[float | None, float | None]:
    """(mean `accuracy`, mean `reward/mean`) of the training rows with lo <= step <= hi (None: no row)."""
    acc, rew = [], []
    for line in metrics.read_text().splitlines() if metrics.is_file() else ():
        row = json.loads(line)
        if "accuracy" in row and lo <= int(row.get("step", -1)) <= hi:
            acc.append(float(row["accuracy"]))
            rew.append(float(row.get("reward/mean", float("nan"))))
    mean = (lambda xs: round(sum(xs) / len(xs), 4) if xs else None)
    return mean(acc), mean(rew)


def read_cases(out: Path, lo: int, hi: int) -> list[dict]:
    """One effect row per finished case, sorted by case id."""
    rows = []
    for line in (out / "cases.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        acc, rew = compute_window_means(out / "runs" / rec["id"] / "metrics.jsonl", lo, hi)
        row = {"case": rec["id"], **{k: round(float(rec[k]), 4) for k in EFFECT_KEYS if rec.get(k) is not None}}
        row[f"rollout_accuracy_steps{lo}_{hi}"] = acc
        row[f"reward_mean_steps{lo}_{hi}"] = rew
        row["wall_seconds"] = round(float(rec.get("seconds", 0.0)), 1)
        row["cpu_seconds"] = round(float(rec.get("cpu_seconds", 0.0)), 1)
        rows.append(row)
    return sorted(rows, key=lambda r: r["case"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the faultbench output directory")
    ap.add_argument("--what", required=True)
    ap.add_argument("--command", required=True, help="the faultbench command that made the directory")
    ap.add_argument("--note", default="")
    ap.add_argument("--steps", default="24-30", help="the window of training steps, lo-hi")
    ap.add_argument("--result", type=Path, required=True, help="the JSON file to write")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.steps.split("-"))
    cases = read_cases(a.out, lo, hi)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"what": a.what, "command": a.command, "commit": commit, "note": a.note,
           "total_wall_seconds": round(sum(c["wall_seconds"] for c in cases), 1),
           "total_cpu_seconds": round(sum(c["cpu_seconds"] for c in cases), 1),
           "loadavg_after": Path("/proc/loadavg").read_text().strip(),
           "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": cases}
    a.result.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
