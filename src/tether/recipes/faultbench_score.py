"""Scoring of `tether faultbench`: what a run's health record says, and the benchmark's scores.

The execution (scheduling, resume, progress) is `tether.recipes.faultbench`; this module owns
what is scored. Scores (results.json):

  recall_obvious / recall_subtle   advise runs with a finding at or after the fault's start step
  false_alarm_rate                 healthy advise runs with any finding
  steps_to_detect_median           first finding step - start step, over detected runs
  diagnosis_top1 / _top3           the right answer among the top 1 / 3 hypotheses of the monitor's
                                   decision (critical finding, same top cause two steps running; else
                                   its last diagnosis), over detected runs; the right answer is the
                                   fault's cause, or `unexplained` for a fault outside the taxonomy
  diagnosis_family_top1            the same at the family level
  unexplained_rate_outside         detected runs of faults outside the taxonomy answered `unexplained`
  abstain_rate_in_taxonomy         detected runs of faults inside it answered `unexplained` (a cost)
  calibration                      reliability table of the stated confidence of named causes (bins of
                                   0.2): runs, mean confidence, share right; `ece` = sum over bins of
                                   runs / all x |share right - mean confidence|
  remediation_success              remediable faults whose damage (healthy - advise outcome >= delta)
                                   auto mode recovered by at least half, running to the end; "healthy"
                                   is the healthy control of the same seed in the fault's own base
                                   config (`base-<fault>` controls) when the fault has one
  remediation_success_plain_ref    the same against the plain base run's healthy control
  salvage_rate                     the same, counting runs halted at their last healthy weights
  harm_rate                        auto runs (faulty and healthy) ending > delta below advise
  tuned / held_out                 recall, diagnosis, unexplained, calibration, remediation and harm
                                   (of its faulty auto runs) of each half of the fixed split
                                   (tether.health.faults.split), reported side by side
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

BASE_VARIANT = "base-"  # healthy control in a fault's own base config: variant "base-<fault>"
BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def case_id(fault: str | None, severity: str | None, seed: int, mode: str, variant: str = "") -> str:
    """The run directory name of one benchmark case."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", fault or "healthy")  # user specs hold ':' and '/'
    var = re.sub(r"[^A-Za-z0-9_.-]+", "_", variant)
    return f"{name}-{severity or 'none'}-s{seed}-{mode}" + (f"-{var}" if var else "")


def read_health_record(rd: Path, start: int) -> dict[str, Any]:
    """Detection step, diagnosis at decision time (causes, their confidence, fit, share and margin),
    actions and halt from a run's health.jsonl."""
    path = rd / "health.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return health_record(rows, start)


def health_record(rows: list[dict[str, Any]], start: int) -> dict[str, Any]:
    """`read_health_record` from the records of a health.jsonl (or a replay of one)."""
    finds = [r for r in rows if r.get("kind") == "finding"]
    before = [r for r in finds if r["step"] < start]
    after = [r for r in finds if r["step"] >= start]
    first = after[0] if after else None
    crit = next((r for r in after if r["severity"] == "critical"), None)
    decision = next((r for r in rows if r.get("kind") == "decision" and r["step"] >= start), None)
    if decision is not None:  # the diagnosis the monitor stood by (what auto mode acts on)
        hyps = decision["hypotheses"]
    else:  # none: the last diagnosis while the fault was active
        diag = [r for r in rows if r.get("kind") == "diagnosis" and r["step"] >= start]
        hyps = diag[-1]["hypotheses"] if diag else []
    return {
        "alarms_before_start": len(before),
        "first_alarm_step": first["step"] if first else None,
        "first_alarm_detector": first["detector"] if first else None,
        "first_critical_step": crit["step"] if crit else None,
        "detectors": sorted({r["detector"] for r in after}),
        "diagnosis": [h["cause"] for h in hyps[:3]],
        "diagnosis_family": [h["family"] for h in hyps[:3]],
        "diagnosis_detail": [{k: h.get(k) for k in ("cause", "confidence", "fit", "share", "margin")} for h in hyps[:3]],
        "actions": [{k: r.get(k) for k in ("event", "step", "action", "reason")} for r in rows if r.get("kind") == "action"],
        "halted": next((r["step"] for r in rows if r.get("kind") == "halt"), None),
    }


def replay_record(rec: dict[str, Any], rd: Path, start: int) -> dict[str, Any]:
    """An advise run's record with its health fields re-computed by the current detectors and
    diagnosis from its metrics.jsonl (unchanged: auto runs, runs without metrics, errors)."""
    from tether.config import load_doctor_config
    from tether.health.doctor import replay_events
    from tether.health.faults import get_fault_class
    from tether.recipes.faultbench import fault_start

    if "error" in rec or rec["case"]["mode"] != "advise" or not (rd / "metrics.jsonl").is_file():
        return rec
    fault = rec["case"]["fault"]
    f_start = fault_start(get_fault_class(fault), start) if fault else 1
    return {**rec, **health_record(replay_events(rd, load_doctor_config(rd)), f_start)}


# ----------------------------------------------------------------------------- scores


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _rate(hits: list[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def compute_reliability(points: list[tuple[float, bool]]) -> dict[str, Any]:
    """Reliability table of (stated confidence, right?) pairs in bins of 0.2, and the expected
    calibration error: sum over bins of (runs in bin / runs) x |share right - mean confidence|."""
    table, ece = [], 0.0
    for lo, hi in zip(BINS, BINS[1:]):
        pts = [(c, ok) for c, ok in points if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        if not pts:
            table.append({"bin": f"{lo:.1f}-{hi:.1f}", "runs": 0, "confidence": None, "right": None})
            continue
        conf, right = sum(c for c, _ in pts) / len(pts), sum(ok for _, ok in pts) / len(pts)
        ece += len(pts) / len(points) * abs(right - conf)
        table.append({"bin": f"{lo:.1f}-{hi:.1f}", "runs": len(pts), "confidence": round(conf, 4), "right": round(right, 4)})
    return {"table": table, "ece": ece if points else None, "runs": len(points)}


def _variant_false_alarms(records: list[dict]) -> dict[str, Any]:
    """False alarms of the healthy controls repeated under each variant (precision, threads)."""
    fa: dict[str, list[bool]] = {}
    for r in records:
        if r["case"]["fault"] is None and r["case"].get("variant"):  # base-<fault> controls too
            fa.setdefault(r["case"]["variant"], []).append(r.get("first_alarm_step") is not None)
    return {"false_alarm_rate_variants": {v: _rate(x) for v, x in sorted(fa.items())},
            "false_alarm_runs_variants": {v: len(x) for v, x in sorted(fa.items())}}


def _per_fault_table(rows: dict[str, dict]) -> list[dict[str, Any]]:
    return [{**{k: row[k] for k in ("fault", "severity", "family", "cause", "split", "remediable", "runs", "detected",
                                     "top1", "top3")},
             "delay_median": statistics.median(row["delays"]) if row["delays"] else None,
             "healthy_acc": _mean(row["healthy_acc"]), "advise_acc": _mean(row["advise_acc"]),
             "auto_acc": _mean(row["auto_acc"]), "repaired": f"{sum(row['repaired'])}/{len(row['repaired'])}",
             "harmed": sum(row["harmed"]), "answers": row["answers"], "actions": row["actions"]}
            for _, row in sorted(rows.items())]


def _judge(r: dict, cause: str | None, family: str | None) -> dict[str, Any]:
    """How a detected run's diagnosis scores against the right answer (`cause`; `unexplained` outside the taxonomy)."""
    from tether.health.diagnosis import UNEXPLAINED

    dx, fam, detail = r.get("diagnosis", []), r.get("diagnosis_family", []), r.get("diagnosis_detail") or []
    named = dx[:1] != [UNEXPLAINED] and bool(dx)
    conf = detail[0].get("confidence") if detail and named else None
    return {"top1": dx[:1] == [cause], "top3": cause in dx[:3], "family": fam[:1] == [family if cause != UNEXPLAINED else UNEXPLAINED],
            "answer": dx[0] if dx else None, "unexplained": not named, "outside": cause == UNEXPLAINED,
            "confidence": conf, "right": dx[:1] == [cause]}


def _split_scores(judged: list[tuple[str, str, bool, dict | None]]) -> dict[str, Any]:
    """Recall, diagnosis, unexplained and calibration of one group of advise runs:
    (split, severity, detected, judgement or None) tuples."""
    det = {"subtle": [d for _, s, d, _ in judged if s == "subtle"], "obvious": [d for _, s, d, _ in judged if s == "obvious"]}
    js = [j for *_, j in judged if j is not None]
    inside, outside = [j for j in js if not j["outside"]], [j for j in js if j["outside"]]
    return {
        "runs": len(judged), "detected": len(js),
        "recall_obvious": _rate(det["obvious"]), "recall_subtle": _rate(det["subtle"]),
        "diagnosis_top1": _rate([j["top1"] for j in js]), "diagnosis_top3": _rate([j["top3"] for j in js]),
        "diagnosis_top1_in_taxonomy": _rate([j["top1"] for j in inside]),
        "diagnosis_family_top1": _rate([j["family"] for j in js]),
        "unexplained_rate_outside": _rate([j["unexplained"] for j in outside]), "outside_detected": len(outside),
        "abstain_rate_in_taxonomy": _rate([j["unexplained"] for j in inside]),
        "calibration": compute_reliability([(j["confidence"], j["right"]) for j in js if j["confidence"] is not None]),
    }


def _auto_scores(half: dict[str, list[bool]] | None) -> dict[str, Any]:
    """Remediation and harm of one half's faulty auto runs."""
    rep, harm = (half or {}).get("repaired", []), (half or {}).get("harmed", [])
    return {"remediation_success": _rate(rep), "remediation_cases": len(rep), "harm_rate": _rate(harm),
            "harm_cases": len(harm)}


def _healthy_by_seed(ok: list[dict], mode: str) -> dict[int, dict]:
    """The plain healthy controls (no fault, no variant) of one mode, by seed."""
    return {r["case"]["seed"]: r for r in ok
            if r["case"]["fault"] is None and not r["case"].get("variant") and r["case"]["mode"] == mode}


def _new_row(case: dict, cls: Any, split: str) -> dict[str, Any]:
    """An empty per-fault-and-severity row of the results table."""
    return {"fault": case["fault"], "severity": case["severity"], "family": cls.family if cls else None,
            "cause": cls.cause if cls else None, "split": split, "remediable": bool(cls and cls.remediable), "runs": 0,
            "detected": 0, "delays": [], "top1": 0, "top3": 0, "healthy_acc": [], "advise_acc": [], "auto_acc": [],
            "repaired": [], "harmed": [], "answers": [], "actions": []}


def compute_results(records: list[dict], registry: dict, start: int) -> dict[str, Any]:
    """The benchmark's scores from its run records (`registry`: fault name -> class)."""
    from tether.health.faults.split import split_of
    from tether.recipes.faultbench import fault_start

    ok = [r for r in records if "error" not in r]
    by = {r["id"]: r for r in ok}
    h_adv, h_auto = _healthy_by_seed(ok, "advise"), _healthy_by_seed(ok, "auto")
    h_scores = [r["final_train_acc"] for r in h_adv.values()]
    delta = max(0.05, 2 * statistics.stdev(h_scores)) if len(h_scores) >= 3 else 0.05
    h_mean = _mean(h_scores)
    faulty = [r for r in ok if r["case"]["fault"] is not None and r["case"]["mode"] == "advise"]
    rows, judged, delays = {}, [], []
    repair, salvage, harm, repair_plain = [], [], [], []
    halves: dict[str, dict[str, list[bool]]] = {}  # split -> repaired / harmed of its auto runs
    for r in faulty:
        c = r["case"]
        cls = registry.get(c["fault"])
        cause, family = (cls.cause, cls.family) if cls else (None, None)
        hit = r.get("first_alarm_step") is not None
        j = _judge(r, cause, family) if hit else None
        judged.append((split_of(c["fault"]), c["severity"], hit, j))
        auto = by.get(case_id(c["fault"], c["severity"], c["seed"], "auto"))
        plain_ref = h_adv.get(c["seed"], {}).get("final_train_acc", h_mean)
        own = by.get(case_id(None, None, c["seed"], "advise", BASE_VARIANT + c["fault"]))
        healthy_ref = own["final_train_acc"] if own is not None else plain_ref  # the same config without the fault
        row = rows.setdefault(f"{c['fault']}/{c['severity']}", _new_row(c, cls, split_of(c["fault"])))
        row["runs"] += 1
        row["healthy_acc"].append(healthy_ref)
        row["advise_acc"].append(r["final_train_acc"])
        if hit:
            d = r["first_alarm_step"] - (fault_start(cls, start) if cls else start)
            delays.append(d)
            row["detected"] += 1
            row["delays"].append(d)
            row["top1"] += j["top1"]
            row["top3"] += j["top3"]
            row["answers"].append(j["answer"])
        if auto is not None:
            a, f = auto["final_train_acc"], r["final_train_acc"]
            row["auto_acc"].append(a)
            row["actions"].append([x["action"] + ":" + x["event"] for x in auto.get("actions", [])] +
                                  (["halt"] if auto.get("halted") is not None else []))
            harmed = a < f - delta
            harm.append(harmed)
            row["harmed"].append(harmed)
            half = halves.setdefault(split_of(c["fault"]), {"repaired": [], "harmed": []})
            half["harmed"].append(harmed)
            completed = auto.get("halted") is None and not auto.get("crash")
            if cls and cls.remediable and healthy_ref is not None and healthy_ref - f >= delta:
                recovered = a - f >= 0.5 * (healthy_ref - f)
                repair.append(recovered and completed)  # repaired: ran to the end and recovered half the damage
                salvage.append(recovered)  # halting at the last healthy weights counts here
                row["repaired"].append(recovered and completed)
                half["repaired"].append(recovered and completed)
            if cls and cls.remediable and plain_ref is not None and plain_ref - f >= delta:
                repair_plain.append(a - f >= 0.5 * (plain_ref - f) and completed)
    for seed, r in h_auto.items():
        if seed in h_adv:
            harm.append(r["final_train_acc"] < h_adv[seed]["final_train_acc"] - delta)
    overall = _split_scores(judged)
    return {
        **{k: v for k, v in overall.items() if k not in ("runs", "detected")},
        "false_alarm_rate": _rate([r.get("first_alarm_step") is not None for r in h_adv.values()]),
        "false_alarm_runs": len(h_adv),
        **_variant_false_alarms(ok),
        "false_alarm_rate_prefault": _rate([r.get("alarms_before_start", 0) > 0 for r in faulty]),
        "steps_to_detect_median": statistics.median(delays) if delays else None,
        "remediation_success": _rate(repair), "remediation_cases": len(repair), "salvage_rate": _rate(salvage),
        "remediation_success_plain_ref": _rate(repair_plain), "remediation_cases_plain_ref": len(repair_plain),
        "halt_rate_faulty_auto": _rate([r.get("halted") is not None for r in ok if r["case"]["fault"] and r["case"]["mode"] == "auto"]),
        "harm_rate": _rate(harm), "harm_cases": len(harm), "delta": delta,
        "healthy_acc_mean": h_mean, "healthy_acc_std": statistics.stdev(h_scores) if len(h_scores) >= 2 else None,
        **{h: {**_split_scores([x for x in judged if x[0] == h]), **_auto_scores(halves.get(h))} for h in ("tuned", "held_out")},
        "runs": len(ok), "errors": [r["id"] + ": " + r["error"] for r in records if "error" in r],
        "per_fault": _per_fault_table(rows),
    }


def format_results(res: dict[str, Any]) -> str:
    """The headline scores, the tuned and held-out halves side by side, and the per-fault table as text."""
    f = lambda x: "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))  # noqa: E731
    keys = ("recall_obvious", "recall_subtle", "false_alarm_rate", "false_alarm_runs", "false_alarm_rate_variants",
            "false_alarm_rate_prefault", "steps_to_detect_median",
            "diagnosis_top1", "diagnosis_top3", "diagnosis_family_top1", "unexplained_rate_outside", "abstain_rate_in_taxonomy",
            "remediation_success", "remediation_cases", "remediation_success_plain_ref", "remediation_cases_plain_ref",
            "salvage_rate", "halt_rate_faulty_auto", "wall_seconds", "cpu_seconds_runs",
            "harm_rate", "harm_cases", "delta", "healthy_acc_mean", "runs")
    lines = [f"{k:28s} {f(res.get(k))}" for k in keys]
    lines.append(f"{'ece':28s} {f((res.get('calibration') or {}).get('ece'))}")
    lines.append("")
    lines.append(f"{'half':10s} {'runs':>5s} {'rec_obv':>7s} {'rec_sub':>7s} {'top1':>6s} {'top1_in':>7s} {'unexpl':>6s} {'ece':>6s}")
    for half in ("tuned", "held_out"):
        h = res.get(half) or {}
        lines.append(f"{half:10s} {h.get('runs', 0):>5d} {f(h.get('recall_obvious')):>7s} {f(h.get('recall_subtle')):>7s} "
                     f"{f(h.get('diagnosis_top1')):>6s} {f(h.get('diagnosis_top1_in_taxonomy')):>7s} "
                     f"{f(h.get('unexplained_rate_outside')):>6s} {f((h.get('calibration') or {}).get('ece')):>6s}")
    lines.append("")
    lines.append(f"{'fault/severity':32s} {'split':8s} {'det':>5s} {'delay':>5s} {'top1':>5s} {'top3':>5s} {'healthy':>7s} "
                 f"{'advise':>7s} {'auto':>7s} {'repair':>6s} {'harm':>4s}  answers / actions")
    for r in res.get("per_fault", []):
        acts = sorted({a for run in r["actions"] for a in run})
        answers = ",".join(sorted(set(a for a in r.get("answers", []) if a)))
        lines.append(f"{r['fault'] + '/' + r['severity']:32s} {r.get('split', '-'):8s} {r['detected']}/{r['runs']:<3d} "
                     f"{f(r['delay_median']):>5s} {r['top1']:>5d} {r['top3']:>5d} {f(r['healthy_acc']):>7s} "
                     f"{f(r['advise_acc']):>7s} {f(r['auto_acc']):>7s} {r['repaired'] if r['remediable'] else '-':>6s} "
                     f"{r['harmed']:>4d}  {answers}" + (f" / {','.join(acts)}" if acts else ""))
    if res.get("errors"):
        lines.append(f"errors: {res['errors']}")
    return "\n".join(lines)


__all__ = ["BASE_VARIANT", "case_id", "compute_reliability", "compute_results", "format_results", "health_record",
           "read_health_record", "replay_record"]
