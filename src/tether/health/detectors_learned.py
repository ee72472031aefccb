"""Learned rewards as suspects (issue 19): a reward model or LLM judge that stands in for a
verifier is trusted only while it agrees with the verifier.

A component is a suspect when it is paid (weight != 0), is not the correctness component, and is
a learned one: the built-in `reward_model` and `judge` (marked `learned = True`), and a user
`package.module:function` reward when the verifier is unpaid (it then stands in for it; next to a
paid verifier it is a shaping term, the `reward_hacking` detector's business). Three rules, each
on data the run already has (the verifier scores every rollout even at weight 0:
`reward.correctness`):

- `agreement` on the policy's own rollouts, every step: `health/reward_agreement/<c>`
  (`compute_component_agreement`) is the fraction of (correct, incorrect) sample pairs of one
  group that c scores higher for the correct one — an AUC, 0.5 at chance. A learned reward that
  ranks the policy's current samples against the verifier (< `critical_floor` on one step with
  >= `min_pairs` pairs) or no better than chance (< `floor`, pooled over the last steps) cannot
  be steering the policy towards correctness, whatever the training reward does; one whose pooled
  agreement fell `drop` below its first steps' is being exploited: RL finds the samples the
  reward over-pays. The pooled windows (the last steps, the first steps) each hold at least two
  steps and `window_pairs` pairs (up to `window_steps` steps): until 2026-12-02 they were two
  steps each, a few dozen pairs with 8 samples per prompt, and in real RM runs a lucky first
  window (0.91) or an unlucky recent one (0.51-0.61 for an RM at 0.65-0.8) raised 4 false alarms
  in 9 runs whose held-out accuracy was rising (docs/rewards.md, fourth round) (Gao et al., arXiv 2210.10760: over-optimising a proxy RM lowers the gold
  reward; DeepSeek-R1, arXiv 2501.12948 §2.3.4, caps RM-based RL for this reason).
- `agreement` on held-out probes, at evaluation steps: `eval/reward_agreement/<c>`
  (tether.eval.runner), the same AUC on held-out problems, with the same floor and drop.
- `trend`, every step: the verified correct rate of the rollouts fell by more than `fall` (and
  `z` standard errors) from its first `k` steps to its last `k` while the learned reward's mean
  stayed flat or rose (no lower than `tol` of its within-step std): the policy is paid the same
  for worse answers.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tether.health.detectors import OK, Detector, History, RunContext, register_detector
from tether.health.telemetry import finite

PREFIX = "eval/reward_agreement/"
TRAIN_PREFIX = "health/reward_agreement/"
TRAIN_PAIRS = "health/reward_agreement_pairs"


def compute_component_agreement(groups: Sequence[Any]) -> dict[str, float]:
    """Per reward component, the AUC of its value against the verdicts within each group of one
    step's rollouts (`health/reward_agreement/<c>`; ties count half), and the number of
    (correct, incorrect) pairs (`health/reward_agreement_pairs`). Components without a pair are left out."""
    wins: dict[str, float] = {}
    n_pairs = 0
    counts: dict[str, int] = {}
    for g in groups:
        good = [t.reward.components for t in g.trajectories if t.reward.correct is True]
        bad = [t.reward.components for t in g.trajectories if t.reward.correct is False]
        n_pairs += len(good) * len(bad)
        for cg in good:
            for cb in bad:
                for name, v in cg.items():
                    if "/" in name or name not in cb:
                        continue
                    wins[name] = wins.get(name, 0.0) + (1.0 if v > cb[name] else 0.5 if v == cb[name] else 0.0)
                    counts[name] = counts.get(name, 0) + 1
    out = {f"{TRAIN_PREFIX}{k}": wins[k] / counts[k] for k in sorted(counts)}
    if out:
        out[TRAIN_PAIRS] = float(n_pairs)
    return out


def is_learned(name: str, proxy: bool = False) -> bool:
    """A reward model or a judge (`learned = True`); with `proxy` (the verifier is unpaid) also a
    user `module:function` reward, which then stands in for the verifier. A user shaping term
    next to a paid verifier is not a suspect here (the `reward_hacking` detector watches it)."""
    import tether.rewards  # noqa: F401  (registers the built-in components)
    from tether.rewards.base import REWARD_FUNCTIONS

    if name not in REWARD_FUNCTIONS:
        return proxy
    return bool(getattr(REWARD_FUNCTIONS[name], "learned", False))


def _pooled(h: History, comp: str, rows: list[dict]) -> tuple[float | None, float]:
    """Pair-weighted mean of a component's rollout agreement over `rows`, and the pairs behind it."""
    num = den = 0.0
    for r in rows:
        a, n = finite(r.get(TRAIN_PREFIX + comp)), finite(r.get(TRAIN_PAIRS))
        if a is not None and n:
            num, den = num + a * n, den + n
    return (num / den if den else None), den


@register_detector
class LearnedRewardDetector(Detector):
    """A paid learned reward stopped agreeing with the verifier, or is paid while correctness falls."""

    name, mode = "learned_reward", "reward_hacking"
    needs_baseline = False
    persist, window = 1, 1  # each rule smooths over its own steps
    defaults = {"floor": 0.55, "critical_floor": 0.4, "drop": 0.2, "min_pairs": 40.0, "window_pairs": 200.0,
                "window_steps": 10, "k": 3, "fall": 0.05, "z": 2.5, "tol": 0.25}

    def evaluate(self, h: History, ctx: RunContext):
        if not h.rows:
            return OK
        names = set(ctx.reward_weights) | {k[len(p):] for k in h.rows[-1] for p in (PREFIX, TRAIN_PREFIX) if k.startswith(p)}
        proxy = bool(ctx.correctness) and ctx.reward_weights.get(ctx.correctness, 1.0) == 0.0
        suspects = sorted(c for c in names if ctx.reward_weights.get(c, 1.0) != 0.0 and c != ctx.correctness
                          and is_learned(c, proxy))
        found = [s for c in suspects for s in (self._rollouts(h, c), self._held_out(h, c), self._trend(h, c)) if s[0]]
        return max(found, key=lambda s: s[0]) if found else OK

    def _judge(self, comp: str, value: float, first: float, where: str, key: str, single: bool = False):
        low, dropped = value < self.p["floor"], first - value >= self.p["drop"]
        if not (low or dropped or single):
            return OK
        level = 2 if value < self.p["critical_floor"] else 1
        what = "the policy's own samples" if where == "rollouts" else "held-out samples"
        msg = (f"learned reward {comp!r} ranks correct above incorrect on {value:.0%} of pairs of {what} "
               f"(first {first:.0%}; chance is 50%): it is being exploited or never learned correctness")
        return level, msg, {key: {"value": round(value, 4), "baseline": round(first, 4)}, "rule": "agreement",
                            "where": where, "component": comp, "why": "floor" if low or single else "drop"}

    def _rollouts(self, h: History, comp: str):
        rows = [r for r in h.rows if finite(r.get(TRAIN_PREFIX + comp)) is not None and r["step"] not in h.discarded]
        if not rows or rows[-1] is not h.rows[-1]:
            return OK
        last, n_last = _pooled(h, comp, rows[-1:])
        first, _ = _pooled(h, comp, rows[:2])
        if last is not None and n_last >= self.p["min_pairs"] and last < self.p["critical_floor"]:
            return self._judge(comp, last, first if first is not None else last, "rollouts", TRAIN_PREFIX + comp, True)
        if len(rows) < 2:
            return OK
        k_recent = self._window(h, comp, rows[::-1])
        if k_recent is None:
            return OK
        recent, _ = _pooled(h, comp, rows[-k_recent:])
        k_first = self._window(h, comp, rows)
        if k_first is not None and k_first + k_recent <= len(rows):  # two disjoint windows: the drop is judged too
            first, _ = _pooled(h, comp, rows[:k_first])
        else:
            first = recent
        return self._judge(comp, recent, first, "rollouts", TRAIN_PREFIX + comp)

    def _window(self, h: History, comp: str, rows: list[dict]) -> int | None:
        """How many of `rows` (from their start) make a pooled window: at least two and enough to
        hold `window_pairs` pairs, at most `window_steps`; None if they never do."""
        for k in range(2, min(len(rows), int(self.p["window_steps"])) + 1):
            if _pooled(h, comp, rows[:k])[1] >= self.p["window_pairs"]:
                return k
        return None

    def _held_out(self, h: History, comp: str):
        value = finite(h.rows[-1].get(PREFIX + comp))
        if value is None:
            return OK
        first = next((finite(r.get(PREFIX + comp)) for r in h.rows if finite(r.get(PREFIX + comp)) is not None), value)
        return self._judge(comp, value, first, "held_out", PREFIX + comp)

    def _trend(self, h: History, comp: str):
        k = int(self.p["k"])
        rows = [r for r in h.rows if r["step"] not in h.discarded]
        if len(rows) < 2 * k:
            return OK
        acc_key = "accuracy" if finite(rows[-1].get("accuracy")) is not None else "reward/correct_rate"
        head, tail = rows[:k], rows[-k:]

        def mean(key: str, rs: list[dict]) -> float | None:
            xs = [finite(r.get(key)) for r in rs]
            return None if any(x is None for x in xs) else sum(xs) / len(xs)

        a0, a1 = mean(acc_key, head), mean(acc_key, tail)
        r0, r1 = mean(f"reward/{comp}/mean", head), mean(f"reward/{comp}/mean", tail)
        if None in (a0, a1, r0, r1):
            return OK
        se0, se1 = mean("health/accuracy_se", head), mean("health/accuracy_se", tail)
        se = math.sqrt(((se0 or 0.0) ** 2 + (se1 or 0.0) ** 2) / k)
        spread = mean(f"reward/{comp}/std", head) or 0.0
        if a0 - a1 > max(self.p["fall"], self.p["z"] * se) and r1 >= r0 - self.p["tol"] * spread:
            level = 2 if a0 - a1 > 2 * max(self.p["fall"], self.p["z"] * se) else 1
            msg = (f"verified correct rate of the rollouts fell {a0:.3f} -> {a1:.3f} while learned reward {comp!r} "
                   f"stayed paid ({r0:.3g} -> {r1:.3g}): the policy is paid as much for worse answers")
            return level, msg, {acc_key: {"value": round(a1, 4), "baseline": round(a0, 4), "se": round(se, 4)},
                                f"reward/{comp}/mean": {"value": round(r1, 4), "baseline": round(r0, 4)},
                                "rule": "trend", "component": comp}
        return OK
