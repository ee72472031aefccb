"""`tether.doctor` / `tether doctor`: the health of a run of any kind, from its files alone.

* RL-style runs (rl, distill): the health detectors replayed over metrics.jsonl, diagnosed
  (tether.health.doctor); a run with no RL step logged has nothing to judge, and says so.
* Supervised and preference runs (sft, rs_sft, dpo) have no RL detectors: judged by their loss
  (it fell, stayed finite); a reward model by its held-out pair accuracy (above chance, rising).
* A merge or an eval stage trains nothing: nothing to judge.
* A pipeline: every stage, then a summary; a sweep or a context comparison: every member run, then a
  summary. A fault benchmark's runs are faulty on purpose: its scores are `tether show`'s.

Every report has `status`: HEALTHY, UNHEALTHY or NOTHING TO JUDGE, and `verdict`, one line.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from tether.api.run import Run, open_run
from tether.io.run_dir import read_metrics

HEALTHY, UNHEALTHY, NOTHING = "HEALTHY", "UNHEALTHY", "NOTHING TO JUDGE"
RL_KINDS = ("rl", "distill", "rl_async")
LOSS_KEYS = {"sft": "sft/loss", "rs_sft": "sft/loss", "dpo": "dpo/loss"}


def doctor(target: str | Run) -> dict[str, Any]:
    """The doctor's report of `target` (a path or a Run) as a JSON-ready dict."""
    run = target if isinstance(target, Run) else open_run(target)
    kind = run.kind
    if kind in ("pipeline", "demo", "sweep", "compare_context"):
        return _members_report(run)
    if kind == "faultbench":
        return _report(run, NOTHING, "a fault benchmark's runs are faulty on purpose: its detection and repair "
                                     f"scores are in results.json (tether show {run.path})")
    if kind in ("merge", "eval"):
        return _report(run, NOTHING, f"a{'n' if kind == 'eval' else ''} {kind} run trains nothing; evaluate its "
                                     f"result with `tether eval {run.path}`")
    if kind in LOSS_KEYS:
        return _loss_report(run, LOSS_KEYS[kind])
    if kind == "rm":
        return _rm_report(run)
    return _rl_report(run)


def _report(run: Run, status: str, verdict: str, **extra: Any) -> dict[str, Any]:
    return {"run_dir": str(run.path), "kind": run.kind, "status": status, "verdict": verdict, **extra}


def _rows(run: Run) -> list[dict[str, Any]]:
    path = run.path / "metrics.jsonl"
    return [r for r in read_metrics(path) if isinstance(r.get("step"), int) and r["step"] > 0] if path.is_file() else []


def _rl_report(run: Run) -> dict[str, Any]:
    from tether.config import load_doctor_config
    from tether.health.doctor import examine

    if not any("reward/mean" in r for r in _rows(run)):
        return _report(run, NOTHING, "no RL step is logged yet (the run stopped before its first step, or has not "
                                     "started): nothing to judge", steps=0, findings=[], hypotheses=[], events=[])
    rep = examine(run.path, load_doctor_config(run.path))
    status = HEALTHY if rep["healthy"] else UNHEALTHY
    verdict = (f"no detector fired in {rep['steps']} steps" if rep["healthy"] else
               f"since step {rep['since']}: {rep['family']}, likely cause {rep['cause']}")
    return {**rep, "kind": run.kind, "status": status, "verdict": verdict}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _loss_report(run: Run, key: str) -> dict[str, Any]:
    rows = _rows(run)
    losses = [r[key] for r in rows if key in r]
    bad = [r["step"] for r in rows if key in (r.get("nonfinite") or []) or r.get(key, 0.0) is None]
    if len(losses) < 2 and not bad:
        return _report(run, NOTHING, f"{len(losses)} {key} value(s) logged: too few to judge", steps=len(losses))
    finite = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
    third = max(1, len(finite) // 3)
    first, last = (_mean(finite[:third]), _mean(finite[-third:])) if finite else (math.nan, math.nan)
    where = f"{key} {first:.4g} -> {last:.4g} over {len(losses)} steps (means of the first and last {third})"
    if bad:
        return _report(run, UNHEALTHY, f"non-finite {key} at step(s) {bad[:5]}; {where}", steps=len(losses))
    if not last < first:
        return _report(run, UNHEALTHY, f"the loss did not fall: {where}; try a larger learning rate, more steps, "
                                       "or check the training targets", steps=len(losses))
    return _report(run, HEALTHY, f"the loss fell and stayed finite: {where} (no RL detectors for a {run.kind} run)",
                   steps=len(losses))


def _rm_report(run: Run) -> dict[str, Any]:
    s = run.summary
    b, f = s.get("baseline_pair_accuracy"), s.get("final_pair_accuracy")
    if f is None:
        return _report(run, NOTHING, "no held-out pair accuracy yet (the reward model has not finished)")
    where = f"held-out pair accuracy {b:.3f} -> {f:.3f} on {s.get('eval_pairs')} pairs"
    if f <= 0.5:
        return _report(run, UNHEALTHY, f"no better than chance: {where}; more pairs, more steps or another rm.lr")
    return _report(run, HEALTHY, where)


def _members_report(run: Run) -> dict[str, Any]:
    members = []
    for m in run.members:
        rep = doctor(m)
        members.append({"name": m.path.relative_to(run.path).as_posix(), **rep})
    counts = Counter(m["status"] for m in members)
    what = "stage" if run.kind in ("pipeline", "demo") else "run"
    listed = ", ".join(f"{n} {s.lower()}" for s, n in counts.most_common()) or "none yet"
    status = UNHEALTHY if counts[UNHEALTHY] else HEALTHY if counts[HEALTHY] else NOTHING
    return _report(run, status, f"{len(members)} {what}{'s' if len(members) != 1 else ''}: {listed}", members=members)


def format_doctor(rep: dict[str, Any]) -> str:
    """The report as text: an RL-style run's is the health doctor's (findings, hypotheses, repairs: its
    kind on the first line); any other run's one status line (and one per member)."""
    from tether.health.doctor import format_report

    if rep.get("kind") in (*RL_KINDS, None) and rep["status"] != NOTHING and "hypotheses" in rep:
        lines = format_report(rep).splitlines()
        return "\n".join([f"{lines[0]}  ({rep.get('kind') or 'run'})", *lines[1:]])
    lines = [f"run: {rep['run_dir']} ({rep.get('kind') or 'run'})", f"status: {rep['status']} - {rep['verdict']}"]
    for m in rep.get("members", []):
        lines.append(f"  {m['name']:24s} {m.get('kind') or '?':8s} {m['status']}: {m['verdict']}")
    return "\n".join(lines)


__all__ = ["HEALTHY", "NOTHING", "UNHEALTHY", "doctor", "format_doctor"]
