"""Fit the diagnosis confidence (tether.health.diagnosis.CALIBRATION) on the tuned half of a
fault benchmark, and print the reliability table before and after.

    python benchmarks/faultbench_calibrate.py runs/fb_tuned [more dirs] [--out benchmarks/results/faultbench_calibration.json]

For every detected advise run of a fault in the TUNED list (tether.health.faults.split), the
diagnosis is replayed from the run's metrics.jsonl with the current detectors and diagnosis
(tether.health.doctor.replay_events), and the top candidate cause at decision time gives one
point: its fit, share and margin, and whether it is the injected cause (never, for a fault
outside the taxonomy). A logistic regression P(right | fit, share, margin) is fitted to those
points (L2 0.01, LBFGS); its coefficients go into CALIBRATION by hand (the file records them
with the points' count). Held-out runs in the directory are never read.

`--first-look FILE` adds the points of kinds scored once before the layer was developed on them (and
leaves those kinds' runs in the benchmark directory out)
(benchmarks/results/faultbench_first_look_r1.json: round 1's held-out kinds as first scored): the
tuned kinds alone are diagnosed right nearly always, so a fit on them alone states ~0.95 for any
named cause, also for a kind the layer has never met.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tether.health.diagnosis import CALIBRATION, UNEXPLAINED, compute_confidence
from tether.health.faults import get_fault_class
from tether.health.faults.split import TUNED
from tether.recipes.faultbench_score import compute_reliability, replay_record

FEATURES = ("fit", "share", "margin")


def collect(out: Path, start: int, kinds: tuple[str, ...] = TUNED) -> list[tuple[dict, bool, str]]:
    """(features of the top candidate, right?, fault) of every detected advise run of `kinds`."""
    points = []
    for line in (out / "cases.jsonl").read_text().splitlines():
        rec = json.loads(line)
        fault = rec["case"]["fault"]
        if not fault or fault not in kinds or rec["case"]["mode"] != "advise" or "error" in rec:
            continue
        rec = replay_record(rec, out / "runs" / rec["id"], start)
        if rec.get("first_alarm_step") is None:
            continue
        cand = next((d for d in rec.get("diagnosis_detail") or [] if d["cause"] != UNEXPLAINED), None)
        if cand is None:
            continue
        points.append(({k: float(cand.get(k) or 0.0) for k in FEATURES}, cand["cause"] == get_fault_class(fault).cause, fault))
    return points


def fit(points: list[tuple[dict, bool, str]], l2: float = 0.01) -> dict[str, float]:
    """Logistic regression coefficients (bias + one per feature)."""
    X = torch.tensor([[p[k] for k in FEATURES] for p, _, _ in points], dtype=torch.float64)
    y = torch.tensor([float(ok) for _, ok, _ in points], dtype=torch.float64)
    w = torch.zeros(len(FEATURES) + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        z = w[0] + X @ w[1:]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y) + l2 * (w[1:] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w = w.detach()
    return {"bias": float(w[0]), **{k: float(v) for k, v in zip(FEATURES, w[1:])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", type=Path, nargs="+", help="faultbench output directories (cases.jsonl, runs/)")
    ap.add_argument("--start", type=int, default=13, help="the benchmark's --start")
    ap.add_argument("--out", type=Path, default=None, help="write the fit and both tables here (JSON)")
    ap.add_argument("--first-look", type=Path, action="append", default=[],
                    help="add the points of a first-look file (kinds scored once before the layer was developed on "
                         "them, e.g. benchmarks/results/faultbench_first_look_r1.json)")
    args = ap.parse_args()
    looks = [json.loads(path.read_text()) for path in args.first_look]
    seen_first = {k for look in looks for k in look["kinds"]}  # their first look stands for them: no double count
    points = [p for bench in args.bench for p in collect(bench, args.start, tuple(k for k in TUNED if k not in seen_first))]
    for look in looks:
        points += [({k: float(pt[k]) for k in FEATURES}, bool(pt["right"]), pt["fault"]) for pt in look["points"]]
    if len(points) < 10:
        raise SystemExit(f"{', '.join(map(str, args.bench))}: {len(points)} detected tuned runs; at least 10 are needed to fit")
    coef = fit(points)
    before = compute_reliability([(compute_confidence(p["fit"], p["share"], p["margin"], CALIBRATION), ok) for p, ok, _ in points])
    after = compute_reliability([(compute_confidence(p["fit"], p["share"], p["margin"], coef), ok) for p, ok, _ in points])
    print(f"{len(points)} points ({sum(ok for _, ok, _ in points)} right); coefficients: {json.dumps(coef)}")
    print(f"ECE with the current CALIBRATION {before['ece']:.3f}, with the fit {after['ece']:.3f}")
    for row in after["table"]:
        print(f"  {row['bin']}: {row['runs']:3d} runs, confidence {row['confidence']}, right {row['right']}")
    if args.out:
        args.out.write_text(json.dumps({"bench": [str(b) for b in args.bench], "first_look": [str(p) for p in args.first_look],
                                        "points": len(points), "coefficients": coef,
                                        "current": CALIBRATION, "reliability_current": before, "reliability_fit": after,
                                        "faults": sorted({f for *_, f in points}), "date": time.strftime("%Y-%m-%d")},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
