"""Diagnosis: ranked root-cause hypotheses from the findings of recent steps, with abstention and
a calibrated confidence.

Each cause (`tether.health.causes.CAUSES`) states what it predicts for every signal: the
signals it predicts move (its fingerprint's positive weights), the ones whose movement rules it
out (`quiet`), and - implicitly - every other signal stays quiet under it. For a set of findings:

- `score`: sum(weight x strength) over the signatures present (strength: 1 critical / 0.6 warn,
  x1.5 for the earliest-firing signatures and x1.2 one step later - a root cause shows first, its
  consequences follow), minus `CONTRADICTION` x the strength of every finding it rules out;
- `fit`: the share of the evidence (the strength of the distinct detectors that fired, outcomes
  such as `regression` left aside when anything else fired) that the cause predicts;
- `confidence`: the calibrated probability that the named cause is the right one - a logistic
  function of the top cause's fit, its share of all scores and its margin over the second, whose
  coefficients (`CALIBRATION`) were fitted on the tuned half of the fault benchmark
  (benchmarks/faultbench_calibrate.py; the reliability table: docs/health/README.md).

The top cause is named only when one of its hallmarks fired, it explains at least `FIT_MIN` (0.6)
of the evidence, nothing it rules out fired, and its confidence is at least `NAME_MIN`. Otherwise the first hypothesis is
`unexplained` - "unexplained anomaly", with the evidence, the signals that moved and, for the
nearest causes, what each leaves unexplained or contradicts - and never the nearest label; auto
mode does not repair on it (it holds, and halts at the last healthy weights once accuracy
regresses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from tether.health.causes import CAUSES, DOWNSTREAM, Cause
from tether.health.detectors import Finding, RunContext

UNEXPLAINED = "unexplained"
CONTRADICTION = 3.0  # score lost per unit of strength of a finding a cause rules out
FIT_MIN = 0.6  # a named cause predicts most of the evidence
NAME_MIN = 0.4  # ... and is right at least 40% of the time, by the calibration
# logistic coefficients of P(top cause right | fit, share, margin): benchmarks/faultbench_calibrate.py on the tuned
# kinds of the extended benchmark and the first-look points of rounds 1 and 2's held-out kinds
# (benchmarks/results/faultbench_calibration.json)
CALIBRATION = {"bias": 0.340, "fit": 1.347, "share": 0.057, "margin": 0.124}

__all__ = ["CAUSES", "CALIBRATION", "Cause", "Hypothesis", "UNEXPLAINED", "compute_confidence", "diagnose", "proxy_reward",
           "signatures"]


@dataclass(frozen=True)
class Hypothesis:
    cause: str
    family: str
    title: str
    score: float
    confidence: float
    since: int
    evidence: list[dict[str, Any]] = field(default_factory=list)
    actions: tuple[str, ...] = ()
    advice: str = ""
    fit: float = 0.0  # share of the evidence this cause predicts
    share: float = 0.0  # its score's share of all scores
    margin: float = 0.0  # 1 - second score / this score (the top hypothesis; 0 for the others)
    unexplained: tuple[str, ...] = ()  # detectors that fired and this cause does not predict
    contradicted: tuple[str, ...] = ()  # detectors that fired and this cause rules out
    moved: tuple[str, ...] = ()  # `unexplained`: the signals that moved (metric keys of the evidence)

    def to_json(self) -> dict[str, Any]:
        out = {"cause": self.cause, "family": self.family, "title": self.title, "score": round(self.score, 3),
               "confidence": round(self.confidence, 3), "since": self.since, "evidence": self.evidence,
               "actions": list(self.actions), "advice": self.advice, "fit": round(self.fit, 3),
               "share": round(self.share, 3), "margin": round(self.margin, 3),
               "unexplained": list(self.unexplained), "contradicted": list(self.contradicted)}
        if self.moved:
            out["moved"] = list(self.moved)
        return out


REWARD_SIGNALS = ("reward_noise", "reward_hacking", "reward_linkage", "learned_reward")


def proxy_reward(ctx: RunContext | None) -> bool:
    """The training reward is not the verifier: the correctness component is unpaid (weight 0)
    while another component is paid - a reward model, a judge, a rubric standing in for it."""
    if ctx is None or not ctx.correctness:
        return False
    w = ctx.reward_weights
    return w.get(ctx.correctness, 1.0) == 0.0 and any(v != 0.0 for k, v in w.items() if k != ctx.correctness)


def signatures(f: Finding, proxy: bool = False) -> list[str]:
    """The fingerprint keys a finding matches: its detector, plus `detector:rule`/direction, plus
    `proxy_reward` for a reward-vs-verdict finding when the paid reward is a proxy of the verifier
    (then a correct sample left unpaid or a wrong one paid is the proxy disagreeing with the
    verifier - what `learned_reward_exploited` names - not noise in a verifier)."""
    keys = [f.detector]
    for k in ("rule", "direction"):
        v = f.evidence.get(k)
        if v is None:
            v = next((e.get(k) for e in f.evidence.values() if isinstance(e, dict) and e.get(k)), None)
        if v:
            keys.append(f"{f.detector}:{v}")
    if proxy and f.detector in REWARD_SIGNALS:
        keys.append("proxy_reward")
    return keys


def compute_confidence(fit: float, share: float, margin: float, coef: dict[str, float] | None = None) -> float:
    """P(the top cause is right | its fit, share and margin): the calibrated logistic model."""
    c = coef or CALIBRATION
    z = c["bias"] + c["fit"] * fit + c["share"] * share + c["margin"] * margin
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


@dataclass
class _Evidence:
    """The findings of a diagnosis by signature: the latest (critical first), first step, strength."""

    latest: dict[str, Finding]
    first_since: dict[str, int]
    strength: dict[str, float]  # signature -> severity x earliness
    units: dict[str, float]  # detector -> its strength (the evidence a fit is measured on)
    keys_of: dict[str, list[str]]  # detector -> its signatures

    @classmethod
    def gather(cls, findings: Iterable[Finding], proxy: bool) -> "_Evidence":
        latest: dict[str, Finding] = {}
        first_since: dict[str, int] = {}
        keys_of: dict[str, list[str]] = {}
        for f in findings:
            for key in signatures(f, proxy):
                prev = latest.get(key)
                if prev is None or f.severity == "critical" or prev.severity != "critical":
                    latest[key] = f
                first_since[key] = min(first_since.get(key, f.since), f.since)
                keys_of.setdefault(f.detector, [])
                if key not in keys_of[f.detector]:
                    keys_of[f.detector].append(key)
        earliest = min(first_since.values(), default=0)
        strength = {}
        for key, f in latest.items():
            lag = first_since[key] - earliest
            strength[key] = (1.0 if f.severity == "critical" else 0.6) * (1.5 if lag == 0 else 1.2 if lag == 1 else 1.0)
        units = {d: max(strength[k] for k in ks) for d, ks in keys_of.items()}
        if any(d not in DOWNSTREAM for d in units):  # outcomes count only when nothing else fired
            units = {d: s for d, s in units.items() if d not in DOWNSTREAM}
        return cls(latest, first_since, strength, units, keys_of)

    @property
    def earliest(self) -> int:
        return min(self.first_since.values())


def _score(cause: Cause, ev: _Evidence) -> tuple[float, float, tuple[str, ...], tuple[str, ...], int | None, list]:
    """(score, fit, unexplained detectors, contradicted detectors, since, evidence records) of one cause."""
    score, since, records = 0.0, None, {}
    for key, w in cause.fingerprint.items():
        if key not in ev.latest:
            continue
        f = ev.latest[key]
        score += w * ev.strength[key]
        if w > 0:
            since = ev.first_since[key] if since is None else min(since, ev.first_since[key])
            records.setdefault(f.detector, {"detector": f.detector, "since": ev.first_since[key], "severity": f.severity,
                                            "message": f.message})
    explained = [d for d, ks in ev.keys_of.items() if d in ev.units and any(cause.predicts(k) for k in ks)]
    if not any(cause.hallmark(k) for k in ev.latest):  # side effects alone name nothing
        explained = []
    against = tuple(sorted(d for d, ks in ev.keys_of.items() if any(k in cause.quiet for k in ks)))
    score -= CONTRADICTION * sum(ev.units.get(d, max(ev.strength[k] for k in ev.keys_of[d])) for d in against)
    total = sum(ev.units.values())
    fit = sum(ev.units[d] for d in explained) / total if total else 0.0
    missing = tuple(sorted(d for d in ev.units if d not in explained))
    return score, fit, missing, against, since, list(records.values())


def diagnose(findings: Iterable[Finding], ctx: RunContext | None = None) -> list[Hypothesis]:
    """Ranked hypotheses (best first) explaining `findings` (the recent ones of a run); `ctx`:
    the run's reward context (a proxy reward makes reward findings point at it). The first is
    `unexplained` when no cause explains the evidence well enough to be named."""
    findings = list(findings)
    if not findings:
        return []
    ev = _Evidence.gather(findings, proxy_reward(ctx))
    scored = []
    for cause in CAUSES.values():
        score, fit, missing, against, since, records = _score(cause, ev)
        if score > 0 and records:
            scored.append((score, cause, since, records, fit, missing, against))
    scored.sort(key=lambda x: (-x[0], x[2]))
    total = sum(s for s, *_ in scored)
    hyps = []
    for i, (s, c, since, records, fit, missing, against) in enumerate(scored):
        margin = 1.0 - (scored[1][0] / s if len(scored) > 1 else 0.0) if i == 0 else 0.0
        share = s / total
        conf = compute_confidence(fit, share, margin)
        hyps.append(Hypothesis(c.name, c.family, c.title, s, conf, since, records, c.actions, c.advice, fit, share,
                               margin, missing, against))
    if not hyps or not _nameable(hyps[0]):
        return [unexplained_hypothesis(ev, hyps)] + hyps
    return hyps


def _nameable(h: Hypothesis) -> bool:
    return h.fit >= FIT_MIN and not h.contradicted and h.confidence >= NAME_MIN


def unexplained_hypothesis(ev: _Evidence, nearest: list[Hypothesis]) -> Hypothesis:
    """"Unexplained anomaly - here is the evidence": no cause explains the findings well enough
    (or the best one is ruled out by a signal that moved); a confident wrong label would send the
    user (and auto mode) the wrong way. Carries every finding, the metric keys that moved, and -
    in its advice - what the nearest causes leave unexplained or contradict."""
    records, moved = {}, []
    for key, f in ev.latest.items():
        records.setdefault(f.detector, {"detector": f.detector, "since": ev.first_since[key], "severity": f.severity,
                                        "message": f.message, "signals": {k: v for k, v in f.evidence.items()
                                                                          if isinstance(v, dict)}})
        moved += [k for k, v in f.evidence.items() if isinstance(v, dict) and k not in moved]
    near = "; ".join(f"{h.cause} explains {h.fit:.0%}" + (f", not {', '.join(h.unexplained)}" if h.unexplained else "")
                     + (f", ruled out by {', '.join(h.contradicted)}" if h.contradicted else "") for h in nearest[:3])
    best = nearest[0].confidence if nearest else 0.0
    return Hypothesis(UNEXPLAINED, UNEXPLAINED, "unexplained anomaly: no cause in the taxonomy explains the evidence",
                      0.0, 1.0 - best, ev.earliest, list(records.values()), ("halt",),
                      "no known cause fits: inspect the signals that moved (evidence) and samples/step_*.jsonl.gz"
                      + (f"; nearest: {near}" if near else ""), moved=tuple(moved))
