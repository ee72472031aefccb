"""Learned rewards as suspects (issue 19): a reward model or LLM judge that stands in for a
verifier is trusted only while it agrees with the verifier on held-out probes.

Every evaluation logs `eval/reward_agreement/<component>` (tether.eval.runner): the fraction of
(correct, incorrect) pairs of the same held-out problem that the component ranks the right way —
an AUC, 0.5 at chance. The rule is absolute, not relative to the run's own baseline, because it
holds for any run in which a learned reward guides learning: a component that ranks held-out
samples by correctness no better than chance (< `floor`) cannot be steering the policy towards
correctness, whatever the training reward does; one that lost `drop` of its agreement since the
first evaluation while still being optimised is being exploited (DeepSeek-R1 caps RM-based RL at
~400 steps for this reason). Checked at evaluation steps only (`persist` 1: evaluations are
sparse); critical below `critical_floor`.
"""

from __future__ import annotations

from tether.health.detectors import OK, Detector, History, RunContext, register_detector
from tether.health.telemetry import finite

PREFIX = "eval/reward_agreement/"


@register_detector
class LearnedRewardDetector(Detector):
    """A reward component's held-out agreement with the verifier fell to chance or dropped."""

    name, mode = "learned_reward", "reward_hacking"
    needs_baseline = False
    persist, window = 1, 1
    defaults = {"floor": 0.55, "critical_floor": 0.4, "drop": 0.2}

    def evaluate(self, h: History, ctx: RunContext):
        last = h.rows[-1] if h.rows else {}
        worst = None
        for key, value in last.items():
            if not key.startswith(PREFIX) or finite(value) is None:
                continue
            comp = key[len(PREFIX):]
            if comp in ctx.reward_weights and ctx.reward_weights[comp] == 0.0:
                continue  # a component that is not paid cannot be exploited
            first = next((finite(r.get(key)) for r in h.rows if finite(r.get(key)) is not None), value)
            low = value < self.p["floor"]
            dropped = first - value >= self.p["drop"]
            if (low or dropped) and (worst is None or value < worst[1]):
                worst = (comp, float(value), float(first), "floor" if low else "drop")
        if worst is None:
            return OK
        comp, value, first, why = worst
        level = 2 if value < self.p["critical_floor"] else 1
        msg = (f"learned reward {comp!r} agrees with the verifier on {value:.0%} of held-out pairs "
               f"(first evaluation {first:.0%}; chance is 50%): it is being exploited or never learned correctness")
        return level, msg, {PREFIX + comp: {"value": round(value, 4), "baseline": round(first, 4)},
                            "rule": "agreement", "component": comp, "why": why}
