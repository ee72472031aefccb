"""`tether doctor RUN_DIR`: the health of a finished (or running) run, from its files alone.

The detectors are replayed over `metrics.jsonl` (the `health/*` telemetry the monitor wrote into
each row makes the replay match the online run), then diagnosed; the events the online monitor
recorded in `health.jsonl` (findings, diagnoses, repairs, halts, hangs) are shown alongside.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from tether.health.detectors import Finding, RunContext
from tether.health.diagnosis import UNEXPLAINED, diagnose


def _load_rows(run: Path) -> list[dict[str, Any]]:
    from tether.io.run_dir import read_metrics

    path = run / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run}: no metrics.jsonl (is this a tether run directory?)")
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_metrics(path):
        if isinstance(row.get("step"), int):
            by_step.setdefault(row["step"], {}).update(row)
    return [by_step[s] for s in sorted(by_step) if s > 0 and "reward/mean" in by_step[s]]


def _contexts(cfg: Any, run: Path | None) -> dict[int, RunContext]:
    """The reward context by step: the monitor's `context` records, else the config's."""
    from tether.health.monitor import build_context

    out = {0: build_context(cfg)}
    for e in _events(run) if run is not None else []:
        if e.get("kind") == "context":
            known = {f.name for f in dataclasses.fields(RunContext)}
            out[int(e["step"])] = RunContext(**{k: v for k, v in e.items() if k in known})
    return out


class _Records:
    """A run directory stand-in that keeps the records the monitor writes (`append_health`)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def append_health(self, record: dict[str, Any]) -> None:
        self.records.append(record)


def replay_events(run_dir: str | Path, cfg: Any) -> list[dict[str, Any]]:
    """The findings, diagnoses and decisions the monitor writes to health.jsonl, re-computed by
    the current detectors and diagnosis from the run's metrics.jsonl: the same records an
    advise-mode run would have written with this code (auto mode's actions change the run
    itself, so they cannot be replayed). faultbench re-scores its advise runs with it. `cfg`: the
    run's config (`tether.config.load_doctor_config`)."""
    run = Path(run_dir)
    sink = _Records()
    replay(_load_rows(run), cfg, run, sink)
    return sink.records


def replay(rows: list[dict[str, Any]], cfg: Any, run: Path | None = None, sink: Any = None) -> tuple[list[Finding], list[Any]]:
    """Findings of every step and the final diagnosis, re-computed from metrics rows (`sink`:
    receives the monitor's health.jsonl records)."""
    from tether.health.monitor import HealthMonitor

    mon = HealthMonitor(cfg, rd=sink, watchdog=False)
    contexts = _contexts(cfg, run)
    rollbacks = {int(e["step"]): int(e["discarded_from"]) for e in (_events(run) if run is not None else [])
                 if e.get("kind") == "action" and e.get("discarded_from") is not None}
    lg = logging.getLogger("tether.health")
    level = lg.level
    lg.setLevel(logging.ERROR)  # a replay reports once, at the end
    try:
        for row in rows:
            step = int(row["step"])
            ctx = contexts[max(k for k in contexts if k <= step)]
            mon.run_detectors(step, row, ctx)
            if step in rollbacks:  # the online monitor rolled these steps back: replay the same
                mon.history.discard(range(rollbacks[step], step + 1))
                for d in mon.detectors.values():
                    d.reset()
    finally:
        lg.setLevel(level)
    episode = _episode(mon.findings)
    return mon.findings, diagnose(episode, contexts[max(contexts)])


def _episode(findings: list[Finding]) -> list[Finding]:
    """The findings of the first sustained problem: from the first critical finding's streak
    (or all findings when none is critical) - what a doctor should name."""
    crit = [f for f in findings if f.severity == "critical"]
    if not crit:
        return findings
    first = crit[0].step
    return [f for f in findings if f.step <= first + 5]


def _events(run: Path) -> list[dict[str, Any]]:
    path = run / "health.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def examine(run_dir: str | Path, cfg: Any) -> dict[str, Any]:
    """The doctor's report as a JSON-ready dict; `cfg`: the run's config (`tether.config.load_doctor_config`)."""
    run = Path(run_dir)
    rows = _load_rows(run)
    findings, hyps = replay(rows, cfg, run)
    by_det: dict[str, dict[str, Any]] = {}
    for f in findings:
        d = by_det.setdefault(f.detector, {"detector": f.detector, "mode": f.mode, "first_step": f.step, "since": f.since,
                                            "last_step": f.step, "steps": 0, "severity": f.severity, "message": f.message,
                                            "doc": f"docs/health/{f.mode}.md"})
        d["last_step"], d["steps"] = f.step, d["steps"] + 1
        if f.severity == "critical" and d["severity"] != "critical":
            d["severity"], d["message"] = "critical", f.message
    top = hyps[0] if hyps else None
    events = _events(run)
    from tether.health.first_steps import find_first_step_findings  # why a reward is flat, each with its fix

    first = [f.to_json() for f in find_first_step_findings(run)]
    return {
        "run_dir": str(run), "steps": len(rows), "first_step": rows[0]["step"] if rows else None,
        "last_step": rows[-1]["step"] if rows else None, "healthy": not findings and not first, "first_steps": first,
        "since": top.since if top else None, "family": top.family if top else None, "cause": top.cause if top else None,
        "hypotheses": [h.to_json() for h in hyps[:5]],
        "findings": sorted(by_det.values(), key=lambda d: (d["since"], d["first_step"])),
        "events": [e for e in events if e.get("kind") != "finding"],
        "halted": next((e for e in events if e.get("kind") in ("halt", "hang")), None),
    }


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"run: {rep['run_dir']}  (steps {rep['first_step']}..{rep['last_step']})"]
    if rep.get("first_steps") and not rep["findings"]:
        lines.append(f"status: UNHEALTHY - the first steps show why the reward is flat ({len(rep['first_steps'])} "
                     "finding(s) below)")
    elif rep["healthy"]:
        lines.append(f"status: HEALTHY - no detector fired in {rep['steps']} steps")
    elif rep["cause"] == UNEXPLAINED:
        top = rep["hypotheses"][0]
        lines.append(f"status: UNHEALTHY since step {rep['since']} - UNEXPLAINED ANOMALY: no cause in the taxonomy "
                     "explains the evidence (no automatic repair is attempted)")
        lines.append(f"  signals that moved: {', '.join(top.get('moved', [])) or '-'}")
    else:
        top = rep["hypotheses"][0] if rep["hypotheses"] else {}
        lines.append(f"status: UNHEALTHY since step {rep['since']} - family: {rep['family']} - likely cause: "
                     f"{top.get('title', '?')} ({100 * top.get('confidence', 0):.0f}% confidence, calibrated)")
        lines.append("")
        lines.append("findings:")
        for d in rep["findings"]:
            span = f"{d['first_step']}" if d["first_step"] == d["last_step"] else f"{d['first_step']}-{d['last_step']}"
            lines.append(f"  steps {span:9s} {d['detector']:22s} [{d['severity']}] since {d['since']}: {d['message']}  ({d['doc']})")
        lines.append("")
        lines.append("hypotheses:")
        for i, h in enumerate(rep["hypotheses"][:4], 1):
            ev = ", ".join(f"{e['detector']} since {e['since']}" for e in h["evidence"])
            fit = "" if h["cause"] == UNEXPLAINED else (
                f"; explains {100 * h.get('fit', 0):.0f}% of the evidence" + (f", not {', '.join(h['unexplained'])}"
                                                                                 if h.get("unexplained") else "")
                + (f"; ruled out by {', '.join(h['contradicted'])}" if h.get("contradicted") else ""))
            lines.append(f"  {i}. {h['cause']} ({h['family']}, {100 * h['confidence']:.0f}%): {h['title']}; evidence: {ev}{fit}")
        if rep["hypotheses"]:
            lines.append(f"  advice: {rep['hypotheses'][0]['advice']}")
    if rep.get("first_steps"):
        lines += ["", "first steps (each with its fix):"]
        lines += [f"  {f['name']}: {f['message']}\n    fix: {f['fix']}" for f in rep["first_steps"]]
    acts = [e for e in rep["events"] if e.get("kind") in ("action", "halt", "hang", "advice", "detector_error", "monitor_error")]
    if acts:
        lines.append("")
        lines.append("recorded by the online monitor:")
        for e in acts:
            if e["kind"] == "action":
                ch = "; ".join(f"{c['path']} {c['old']} -> {c['new']}" for c in e.get("changes", []))
                lines.append(f"  step {e['step']}: {e['event']} {e['action']} ({ch})" + (f" - {e['reason']}" if e.get("reason") else ""))
            elif e["kind"] == "halt":
                lines.append(f"  step {e['step']}: HALT - {e['reason']} (cause {e['cause']}, family {e['family']})")
            elif e["kind"] == "hang":
                lines.append(f"  HANG in phase {e['phase']} after {e['seconds']:.0f}s (stacks in health_stacks.txt)")
            elif e["kind"] == "advice":
                lines.append(f"  step {e['step']}: advice for {e['cause']}: {e['message']}")
            else:
                lines.append(f"  {e['kind']}: {e.get('message') or e.get('error')}")
    return "\n".join(lines)
