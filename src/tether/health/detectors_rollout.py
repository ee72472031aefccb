"""Detectors of the rollout side: reward hacking and noise, reward errors, credit assignment,
data, weight sync, rollout/trainer mismatch, stalls and regressions. See `detectors.py` for the
base class and the conventions (thresholds relative to the baseline window)."""

from __future__ import annotations

import math

from tether.health.detectors import OK, Detector, History, RunContext, _ev, _recent_mean, register_detector
from tether.health.detectors_learned import TRAIN_PREFIX
from tether.health.detectors_sanity import logp_shift_evidence
from tether.health.telemetry import finite


def _component_shares(row: dict, ctx: RunContext) -> dict[str, float]:
    """Each reward component's share of sum_c |w_c x mean_c| in one metrics row."""
    vals = {}
    for name, w in ctx.reward_weights.items():
        m = finite(row.get(f"reward/{name}/mean"))
        if m is not None:
            vals[name] = abs(w * m)
    total = sum(vals.values())
    return {k: v / total for k, v in vals.items()} if total > 0 else {}


@register_detector
class RewardHackingDetector(Detector):
    """Reward going up while verified correctness does not: incorrect samples are paid more than
    during the baseline, a non-correctness component takes over the reward, or the training
    reward rises while held-out accuracy falls."""

    name, mode = "reward_hacking", "reward_hacking"
    defaults = {"paid_wrong": 0.05, "paid_wrong_z": 6.0, "share": 0.25, "reward_z": 3.0, "eval_drop": 0.1}

    def evaluate(self, h, ctx):
        base_w = h.baseline("health/reward_incorrect_mean", abs_floor=0.01)
        base_c = h.baseline("health/reward_correct_mean", abs_floor=0.01)
        w = _recent_mean(h, "health/reward_incorrect_mean", 2)
        base_r, r = h.baseline("reward/mean", abs_floor=0.01), _recent_mean(h, "reward/mean", 3)
        base_a, a = h.baseline("accuracy", abs_floor=0.01), _recent_mean(h, "accuracy", 3)
        rising = base_r is not None and r is not None and r > base_r.median + self.p["reward_z"] * base_r.scale
        # the reward gap between correct and incorrect samples sets the scale of "paid more"
        gap = max(abs(base_c.median - base_w.median), 0.1) if base_c is not None and base_w is not None else 1.0
        bar = max(self.p["paid_wrong"] * gap, self.p["paid_wrong_z"] * base_w.scale) if base_w is not None else 0.0
        if base_w is not None and w is not None and w > base_w.median + bar:
            level = 2 if rising or w > base_w.median + 4 * bar else 1
            return level, f"incorrect samples are paid {w:.3g} on average (baseline {base_w.median:.3g})", {
                "health/reward_incorrect_mean": _ev(w, base_w), "rule": "paid_wrong"}
        if ctx.reward_weights and len(ctx.reward_weights) > 1 and len(h.rows) > 1:
            now = _component_shares(h.rows[-1], ctx)
            base_rows = [row for row in h.rows if row["step"] in set(h.baseline_steps)]
            before = [_component_shares(row, ctx) for row in base_rows]
            for name, share in now.items():
                if name == ctx.correctness:
                    continue
                b = sum(s.get(name, 0.0) for s in before) / max(len(before), 1)
                if share > b + self.p["share"] and share > 0.5:
                    return 1, f"reward component {name!r} carries {share:.0%} of the reward (baseline {b:.0%})", {
                        f"reward/{name}/share": {"value": round(share, 4), "baseline": round(b, 4)}, "rule": "component",
                        "component": name}
        ev = [row for row in h.rows if finite(row.get("eval/pass@1")) is not None]
        if len(ev) >= 2 and rising and base_a is not None and a is not None and a <= base_a.median + base_a.scale:
            first, last = ev[0]["eval/pass@1"], ev[-1]["eval/pass@1"]
            if last < first - self.p["eval_drop"] and ev[-1]["step"] == h.last_step:
                return 1, f"reward rose while held-out pass@1 fell {first:.3f} -> {last:.3f}", {
                    "eval/pass@1": {"value": last, "baseline": first}, "rule": "eval"}
        return OK


@register_detector
class RewardNoiseDetector(Detector):
    """The reward stopped tracking verified correctness: identical responses to one prompt are
    paid differently more often than during the baseline (`inconsistent`: a reward that is a
    function of prompt and response never does it; a timing-out verifier, a sampled judge, a
    random term does), correct samples are paid less than during the baseline (`correct_unpaid`;
    `component` when the reward's correctness term still ranks every correct sample first, so another
    term of the sum takes their pay: a shaping term that scores something else, not a noisy verifier),
    or the reward no longer ranks correct samples above incorrect ones of the same group (`auc`): a
    noisy, broken or mis-scaled reward."""

    name, mode = "reward_noise", "reward_noise"
    defaults = {"drop": 0.12, "unpaid": 0.12, "split": 0.05, "exact": 0.99, "term_agree": 0.9}

    def evaluate(self, h, ctx):
        # a baseline, not 0: a reward with a deliberate random term pays identical responses differently from step 1
        base, x = h.baseline("health/reward_split_clusters", abs_floor=0.01), _recent_mean(h, "health/reward_split_clusters", 2)
        if base is not None and x is not None and x > base.median + max(self.p["split"], 4 * base.scale):
            level = 2 if x > base.median + 4 * self.p["split"] else 1
            return level, (f"identical responses to one prompt are paid differently in {x:.0%} of their clusters "
                           f"(baseline {base.median:.0%})"), {"health/reward_split_clusters": _ev(x, base),
                                                             "rule": "inconsistent"}
        # no relative floor: a verifier pays every correct sample exactly 1 (scale 0), and 5% of that would
        # hide a fifth of them going unpaid; `unpaid` is the absolute bar
        base = h.baseline("health/reward_correct_mean", rel_floor=0.0, abs_floor=0.01)
        x = _recent_mean(h, "health/reward_correct_mean", 2)
        if base is not None and x is not None and x < base.median - max(self.p["unpaid"], 4 * base.scale):
            level = 2 if x < base.median - 2 * self.p["unpaid"] else 1
            msg = f"verified-correct samples are paid {x:.3g} on average (baseline {base.median:.3g})"
            ev = {"health/reward_correct_mean": _ev(x, base), "rule": "correct_unpaid"}
            exact, others = self.other_terms(h, ctx)
            if others:
                # the reward's correctness term ranks every correct sample first, so the pay they lose is taken by
                # another term of the sum: the reward scores something besides correctness, not a noisy verifier
                msg += (f"; its correctness term {exact!r} still ranks every correct sample first, so another term "
                        "takes the pay: " + ", ".join(f"{c!r} (agreement {v:.2f})" for c, v in others.items()))
                ev.update(rule="component", terms=others)
            return level, msg, ev
        base, x = h.baseline("health/reward_correct_auc", abs_floor=0.01), _recent_mean(h, "health/reward_correct_auc", 2)
        if base is None or x is None:
            return OK
        if x < base.median - max(self.p["drop"], 4 * base.scale):
            level = 2 if x < base.median - 3 * self.p["drop"] else 1
            return level, f"reward agrees with verified correctness on {x:.0%} of pairs (baseline {base.median:.0%})", {
                "health/reward_correct_auc": _ev(x, base), "rule": "auc"}
        return OK


    def other_terms(self, h, ctx) -> tuple[str | None, dict[str, float]]:
        """(the correctness term, {other term: its agreement}) when the reward's correctness term agrees with
        the verdicts on every pair of the last two steps (`health/reward_agreement/<c>` >= `exact`) and other
        terms of the sum agree less than `term_agree`; ({} otherwise: a verifier that itself misses correct
        answers, or a reward of one term)."""
        agree = {k[len(TRAIN_PREFIX):]: _recent_mean(h, k, 2) for k in (h.rows[-1] if h.rows else {})
                 if k.startswith(TRAIN_PREFIX)}
        agree = {c: v for c, v in agree.items() if v is not None}
        exact = ctx.correctness if ctx is not None and ctx.correctness in agree else (
            max(agree, key=agree.get) if agree else None)
        if exact is None or agree[exact] < self.p["exact"]:
            return None, {}
        return exact, {c: round(v, 4) for c, v in sorted(agree.items()) if c != exact and v < self.p["term_agree"]}

@register_detector
class ErrorSurgeDetector(Detector):
    """Reward calls failing, timing out or returning garbage, or environment episodes ending in
    env_error / timeout, above baseline."""

    name, mode = "error_surge", "reward_errors"
    defaults = {"margin": 0.03, "critical": 0.15}
    persist = 1
    KEYS = ("reward/error_rate", "env/stop/env_error", "env/stop/timeout")

    def evaluate(self, h, ctx):
        for key in self.KEYS:
            base = h.baseline(key, abs_floor=0.005)
            x = finite(h.latest(key))
            if x is None:
                continue
            b = base.median if base is not None else 0.0
            if x > b + max(self.p["margin"], 4 * (base.scale if base else 0.0)):
                level = 2 if x > b + self.p["critical"] else 1
                what = "reward calls" if key.startswith("reward/") else f"episodes ({key.rsplit('/', 1)[-1]})"
                return level, f"{x:.0%} of {what} failed (baseline {b:.0%})", {key: _ev(x, base)}
        return OK


# ----------------------------------------------------------------------------- credit assignment


@register_detector
class AdvantageAlignmentDetector(Detector):
    """Advantages no longer follow the rewards within groups (advantage/score_corr): a sign,
    indexing or estimator bug in credit assignment."""

    name, mode = "advantage_misalignment", "credit_assignment"
    defaults = {"drop": 0.25}

    def evaluate(self, h, ctx):
        base, x = h.baseline("advantage/score_corr", abs_floor=0.01), finite(h.latest("advantage/score_corr"))
        if base is None or x is None:
            return OK
        if x < base.median - max(self.p["drop"], 6 * base.scale):
            level = 2 if x < 0 else 1
            return level, f"advantage/score correlation {x:.2f} (baseline {base.median:.2f})", {
                "advantage/score_corr": _ev(x, base)}
        return OK


@register_detector
class GroupIntegrityDetector(Detector):
    """Samples of one group that saw different prompts: group statistics mix problems."""

    name, mode, needs_baseline = "group_integrity", "credit_assignment", False
    persist = 1

    def evaluate(self, h, ctx):
        x = finite(h.latest("health/group_mixed_frac"))
        if x:
            return 2, f"{x:.0%} of groups hold samples of different prompts", {"health/group_mixed_frac": {"value": x}}
        return OK


# ----------------------------------------------------------------------------- data


@register_detector
class DataDetector(Detector):
    """The data stream changed character: prompt lengths shifted, the same tasks come back step
    after step, far more problems became unsolvable than during the baseline, or (`answers`) the
    step's distinct problems stopped being a sample of the data - their gold answers' length moved,
    or far fewer distinct answers among them (a loader that picks problems by their answer: a length
    filter on the label column, a file sorted by it; copies of problems raise the share instead)."""

    name, mode = "data_shift", "data"
    # answers: on 66 healthy runs of the extended benchmark the 3-step means of the answers' length stayed within
    # 0.12 of their run's baseline median (1.30-1.40 characters) and the distinct share fell at most 0.09 below it
    # (0.50-0.58); a sorted file dropped the share by up to 0.43, a length filter the length by 0.36
    # (health_thresholds_answers.json); an 8-step baseline's robust scale is itself noisy, hence z 4 with a floor
    defaults = {"prompt_z": 6.0, "prompt_rel": 0.1, "repeat": 0.35, "unsolvable": 0.35, "unsolvable_z": 3.0,
                "answer_z": 4.0, "answer_len_rel": 0.15, "answer_distinct_rel": 0.25}

    def evaluate(self, h, ctx):
        base, x = h.baseline("health/prompt_len_mean", rel_floor=0.02), _recent_mean(h, "health/prompt_len_mean", 2)
        if base is not None and x is not None and abs(x - base.median) > max(self.p["prompt_z"] * base.scale, self.p["prompt_rel"] * base.median):
            return 1, f"mean prompt length {x:.3g} vs baseline {base.median:.3g}", {"health/prompt_len_mean": _ev(x, base), "rule": "prompt"}
        base, x = h.baseline("health/task_repeat_frac", abs_floor=0.02), _recent_mean(h, "health/task_repeat_frac", 2)
        if base is not None and x is not None and x > base.median + max(self.p["repeat"], 6 * base.scale):
            return 1, f"{x:.0%} of tasks repeat the previous step's (baseline {base.median:.0%})", {
                "health/task_repeat_frac": _ev(x, base), "rule": "repeat"}
        base, x = h.baseline("health/all_wrong_groups", abs_floor=0.02), _recent_mean(h, "health/all_wrong_groups", 3)
        # a fraction of the groups that were solvable became unsolvable
        if base is not None and x is not None and x > base.median + max(self.p["unsolvable"] * (1 - base.median),
                                                                        self.p["unsolvable_z"] * base.scale):
            return 1, f"{x:.0%} of groups have no correct sample (baseline {base.median:.0%})", {
                "health/all_wrong_groups": _ev(x, base), "rule": "unsolvable"}
        return self._answers(h)

    def _answers(self, h):
        for key, what, rel, down_only in (
                ("health/answer_len_mean", "mean length of the problems' gold answers", "answer_len_rel", False),
                ("health/answer_distinct_frac", "distinct gold answers per problem", "answer_distinct_rel", True)):
            base, x = h.baseline(key, rel_floor=0.02), _recent_mean(h, key, 3)
            if base is None or x is None:
                continue
            bar = max(self.p["answer_z"] * base.scale, self.p[rel] * base.median)
            if base.median - x > bar or (not down_only and x - base.median > bar):
                return 1, (f"{what} {x:.3g} vs baseline {base.median:.3g}: the step's problems are no longer a sample "
                           "of the data"), {key: _ev(x, base), "rule": "answers"}
        return OK


# ----------------------------------------------------------------------------- system / inference


@register_detector
class StaleWeightsDetector(Detector):
    """Rollouts sampled by a policy older than the allowed staleness, a policy version that
    stops advancing, or (`checksum`) weights that are not the trainer's at the version the rollout
    reports (the monitor keeps a fingerprint of the trainer's weights per version): the rollout
    engine is not receiving the trainer's weights. Rule `foreign` instead when some of the rollout's
    weight tensors match no recent version of the trainer's at all (per-tensor sums): the sync
    delivers, but converts, reorders or corrupts them (a fused-projection split in the wrong
    order, a wrong dtype cast) - a mismatch of the forwards, not staleness. Rule `jump` one step
    later when that happened at one step only, between steps whose weights matched: a sync that
    converts wrong does it at every step; once means the trainer's own weights were written
    outside the optimizer (a checkpoint reload that re-initialised tensors, an in-place edit) and
    the next version carried them - neither a stale sync nor a sampler mismatch."""

    name, mode, needs_baseline = "stale_weights", "stale_weights", False
    persist = 1

    def evaluate(self, h, ctx):
        last = [r for r in h.rows if r["step"] not in h.discarded][-3:]
        if len(last) == 3 and [finite(r.get("health/weights_mismatch")) for r in last] == [0.0, 1.0, 0.0] and (
                finite(last[1].get("health/weights_foreign_frac")) or 0.0) > 0:
            foreign = finite(last[1].get("health/weights_foreign_frac"))
            return 2, (f"at step {last[1]['step']} only, {foreign:.0%} of the rollout's weight tensors matched no version of "
                       "the trainer's, and the next version matched again: the trainer's weights were written outside the "
                       "optimizer once (a reload, an in-place edit), not a sync that converts"), {
                "health/weights_foreign_frac": {"value": round(foreign, 4), "step": last[1]["step"]}, "rule": "jump"}
        if finite(h.latest("health/weights_mismatch")) == 1.0:
            r = finite(h.latest("health/rollout_version_min"))
            foreign = finite(h.latest("health/weights_foreign_frac"))
            if foreign is not None and foreign > 0:  # tensors no version of the trainer ever had: not a stale sync
                return 2, (f"the rollout reports policy version {r:.0f}, but {foreign:.0%} of its weight tensors match no "
                           "version of the trainer's (current or recent): the sync delivers the weights converted, placed "
                           "or cast wrong, not late"), {
                    "health/weights_mismatch": {"value": 1.0}, "health/weights_foreign_frac": {"value": round(foreign, 4)},
                    "rule": "foreign"}
            return 2, f"the rollout reports policy version {r:.0f} but its weights are not the trainer's at that version", {
                "health/weights_mismatch": {"value": 1.0}, "rule": "checksum"}
        v, r = finite(h.latest("policy_version")), finite(h.latest("health/rollout_version_min"))
        if v is not None and r is not None:
            lag = (v - 1) - r  # the trainer's version when it sampled was v - 1 (one update per step)
            if lag > ctx.max_staleness:
                return 2, f"rollouts sampled by policy version {r:.0f} while the trainer is at {v - 1:.0f}", {
                    "rollout_version_lag": {"value": lag, "allowed": ctx.max_staleness}}
        vs = h.values("policy_version", 4)
        if len(vs) == 4 and vs[-1] <= vs[0]:
            return 1, f"policy_version stuck at {vs[-1]:.0f}", {"policy_version": {"value": vs[-1]}}
        return OK


@register_detector
class LogpGapDetector(Detector):
    """Rollout vs trainer log-probs drifting apart (|dlogp| mean, k3 KL, ESS) relative to the
    baseline mismatch (docs/design.md, correctness rules 3 and 4)."""

    name, mode = "logp_gap", "rollout_mismatch"
    defaults = {"factor": 10.0, "z": 10.0, "floor": 2e-3, "ess_drop": 0.15}

    def evaluate(self, h, ctx):
        base, x = h.baseline("logp_gap_mean", abs_floor=1e-5), finite(h.latest("logp_gap_mean"))
        if base is not None and x is not None:
            hi = max(base.median * self.p["factor"], base.median + self.p["z"] * base.scale, self.p["floor"])
            if x > hi:
                level = 2 if x > 10 * hi else 1
                ev = {"logp_gap_mean": _ev(x, base)}
                # sawtooth: the gap falls back to the baseline on some steps and grows in between, the
                # signature of weights that arrive only now and then (a sync that silently skips)
                recent = h.values("logp_gap_mean", 8)
                first_high = next((i for i, v in enumerate(recent) if v > hi), len(recent))
                dips = [v for v in recent[first_high:] if v <= hi]
                if dips and sum(v > hi for v in recent) >= 3:
                    ev["rule"] = "sawtooth"
                shifted = logp_shift_evidence(h)
                if shifted:  # the log-probs line up one position over: misfiled, not a sampler that differs
                    return level, f"rollout/trainer |dlogp| {x:.3g} vs baseline {base.median:.3g}; {shifted[0]}", {
                        **ev, **shifted[1]}
                return level, f"rollout/trainer |dlogp| {x:.3g} vs baseline {base.median:.3g}" + (
                    " (falls back to baseline between syncs)" if dips else ""), ev
        base, x = h.baseline("ess", abs_floor=1e-3), finite(h.latest("ess"))
        if base is not None and x is not None and x < base.median - max(self.p["ess_drop"], 8 * base.scale):
            return 1, f"importance-weight ESS {x:.2f} vs baseline {base.median:.2f}", {"ess": _ev(x, base)}
        return OK


@register_detector
class StallDetector(Detector):
    """Steps taking far longer than during the baseline because ONE phase (generate, reward, env,
    batch, update) slowed down: a slow reward, environment or sync. A machine shared with other
    jobs slows every phase alike; that is not reported. Hangs are the watchdog's (monitor.py).

    The step must be `factor` (3) x slower - or `phase_step` (1.5) x slower when the phase that
    grew is `phase_factor` (10) x slower than during the baseline: a component that became an
    order of magnitude slower (on each of the last 2 steps) while the rest of the step did not is a
    stalled component even when it was a small part of the step (a reward at 2% of a step that
    takes 70x longer: a 2.4x step); one long pause is not.
    Load from other jobs stretches phases by a few x, not 10x, and stretches all of them."""

    name, mode = "stall", "stall"
    defaults = {"factor": 3.0, "z": 10.0, "phase_share": 0.6, "phase_ratio": 2.0, "phase_step": 1.5, "phase_factor": 10.0}
    PHASES = ("time/generate", "time/reward", "time/env", "time/batch", "time/update")

    def evaluate(self, h, ctx):
        base, x = h.baseline("time/step"), _recent_mean(h, "time/step", 2)
        if base is None or x is None:
            return OK
        slow = x > max(self.p["factor"] * base.median, base.median + self.p["z"] * base.scale)
        if not slow and x <= self.p["phase_step"] * base.median:
            return OK
        grew, ratio = {}, {}
        for key in self.PHASES:
            b, v = h.baseline(key), _recent_mean(h, key, 2)
            if b is not None and v is not None and b.median > 0:
                grew[key], ratio[key] = v - b.median, v / b.median
        excess = sum(max(g, 0.0) for g in grew.values())
        phase = max(grew, key=grew.get) if grew else None
        if phase is None or excess <= 0 or grew[phase] < self.p["phase_share"] * excess:
            return OK
        # a machine shared with other jobs slows every substantial phase alike: not a stalled component
        big = [r for k, r in ratio.items() if k != phase and h.baseline(k).median >= 0.1 * base.median]
        if big and ratio[phase] < self.p["phase_ratio"] * max(big):
            return OK
        if not slow and min(h.values(phase, 2)) < self.p["phase_factor"] * h.baseline(phase).median:
            return OK  # on both steps of the window: one long pause is not a stalled component
        level = 2 if x > 4 * self.p["factor"] * base.median else 1
        return level, f"step time {x:.3g}s vs baseline {base.median:.3g}s, mostly in {phase}", {
            "time/step": _ev(x, base), "phase": phase, **({"rule": "update"} if phase == "time/update" else {})}


@register_detector
class RegressionDetector(Detector):
    """Verified accuracy (or reward, without a verifier) falling well below the baseline."""

    name, mode = "regression", "regression"
    defaults = {"drop": 0.1, "z": 2.5}
    persist, window = 2, 3

    def evaluate(self, h, ctx):
        key = "accuracy" if h.baseline("accuracy") is not None else "reward/mean"
        base, x = h.baseline(key, abs_floor=0.01), _recent_mean(h, key, 3)
        if base is None or x is None:
            return OK
        sd = base.std if math.isfinite(base.std) else base.scale
        drop = min(self.p["drop"], 0.5 * base.mean)  # a near-zero baseline cannot lose 0.1: half of it counts
        if x < base.mean - max(drop, self.p["z"] * sd):
            level = 2 if x < base.mean - 2 * max(drop, self.p["z"] * sd) else 1
            return level, f"{key} {x:.3g} vs baseline {base.mean:.3g}", {key: _ev(x, base)}
        return OK
