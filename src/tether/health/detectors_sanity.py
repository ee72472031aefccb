"""Absolute sanity checks: bounds that hold in ANY healthy RL run, so they need no baseline.

The relative detectors (`detectors.py`, `detectors_rollout.py`) compare a run with its own early
window; a fault present from step 1 *is* that window and goes unseen. The rules here compare with
what a correct implementation guarantees, whatever the model, task or hardware:

- `logp_floor`: on-policy, rollout and trainer score the same tokens with the same weights, so
  their log-probs differ only by kernel numerics (~1e-6 nats/token in fp32, ~1e-2 in bf16:
  vllm#18352, trl#5312 report 0.005-0.02 for healthy bf16 engines). A mean gap of 0.1 nats/token
  (a 10% probability ratio on every token) is 5-10x that floor; a top-k/top-p filter, another
  temperature or stale weights give 0.1 to several nats. The sequence importance weights of a
  healthy run are then ~1 (ESS ~1); an ESS below 0.5 means half the batch carries the weight.
  One-sided gap: the mean of log mu - log pi over the sampled tokens estimates KL(mu || pi) (k1).
  Numerical error has no preferred sign, so that mean stays near 0 (sampling from a noisy mu
  biases it by ~var/2: ~1e-4 for a bf16 engine's 0.01-0.02 noise) while |gap| sits at the floor; a
  sampler that favours what it sampled on every token (a top-k/top-p renormalisation, a lower
  temperature) makes the signed mean ~ the |gap| itself. A signed mean of at least 0.01
  nats/token (a 1% probability bias on every token) that is >= 80% of the |gap| is flagged
  (warn; critical past 5x), however small the gap.
- `update_size`: PPO-style updates keep the per-update KL(pi_old || pi) near 0.01 (OpenAI
  baselines' target_kl 0.01-0.015; the clip range bounds each token's ratio to 1 +- 0.2); healthy
  faultbench runs peak at 0.11 on their first step (the post-SFT transient). An update of more
  than 0.5 nats moved the policy further in one step than any trust region allows: the learning
  rate, clipping or epochs are out of range from the start.
- `advantage_invariants`: group-relative estimators (GRPO, Dr. GRPO, RLOO) centre each group, so
  the per-group mean advantage is 0 up to float error, GRPO's |A| is at most (n-1)/sqrt(n)
  (the largest z-score n samples can hold with the Bessel std), Dr. GRPO's |A| is at most the
  group's reward range (RLOO: n/(n-1) x the range), and A rises with the reward inside a group
  (correlation with the group-centred score ~1; 0.98-0.99 measured on healthy GRPO runs).
- `group_structure`: every group holds `rollout.n` samples, and a loader that samples without
  replacement hands a problem out at most once per epoch, so a task id repeats inside one step
  only when the step straddles an epoch boundary - once per epoch, never on consecutive steps
  (unless the data holds fewer than two steps of problems).
- `loss_mask`: the loss mask is built from lengths and stop reasons, so it covers exactly the
  sampled tokens (all of them, or those of samples whose reward is valid); a mask built from
  token values (pad == eos masks every EOS, docs/design.md, correctness rule 10) or misaligned after a re-tokenisation
  (#2) covers fewer or more.
- `reward_linkage`: a reward that contains the correctness check pays verified-correct samples
  at least as much as incorrect ones (AUC >= 0.5), and tracks its OWN sample's verdict better
  than a neighbour's; a reward that tracks the neighbour is attached to the wrong sample.
- `accuracy_drop`: for a run that starts near zero (step-1 accuracy <= 0.2, where the relative
  `regression` rule's 0.1 absolute drop cannot happen): RL maximises the verified reward, so its
  accuracy should not fall to half of step 1's (sampled by the starting policy, before any
  update) by more than 2.5 standard errors (problems as the sampling units). Runs that start
  higher are left to `regression`: their first RL steps can halve the accuracy and recover (a
  post-SFT transient measured on healthy faultbench runs: 0.52 -> 0.19 -> 0.44).

Each rule says why in its message; thresholds are documented constants, overridable with
`health.thresholds` like every detector's. Pages: docs/health/README.md ("Absolute sanity checks") and each mode's page.
"""

from __future__ import annotations

import math

from tether.health.detectors import OK, Detector, RunContext, register_detector
from tether.health.telemetry import History, finite

# estimator -> (per-group mean is 0, bound on max|A|: "z" (n-1)/sqrt(n), "range" (x factor) or None)
GROUP_RELATIVE = {"grpo": ("z", 1.0), "dr_grpo": ("range", 1.0), "rloo": ("range", None)}


SHIFTED = 0.8  # share of the gapped rows a one-position shift must explain


def logp_shift_evidence(h: History) -> tuple[str, dict] | None:
    """(message, evidence with rule `shifted`) when most rows with a rollout/trainer log-prob gap line up
    one position over (`logp_shift_rows` of `logp_gap_rows`, tether.train.probes.compute_logp_shift): the
    engine's log-probs are its own samples', filed at the wrong positions - bookkeeping between the
    sampler and the batch, not a sampler that computes a different distribution. Rule `zeroed` when
    most gapped rows have their gap on tokens recorded at log-prob 0.0 (`logp_zero_rows`): the record
    was padded where the engine returned nothing - bookkeeping too. None otherwise."""
    rows, shift = finite(h.latest("logp_gap_rows")), finite(h.latest("logp_shift_rows"))
    zero = finite(h.latest("logp_zero_rows"))
    if rows and shift is not None and shift >= SHIFTED * rows:  # a shift also pads one end: it comes first
        return (f"{shift / rows:.0%} of the rows with a gap match one position over: the log-probs are filed at the "
                "wrong positions"), {"logp_shift_rows": {"value": shift, "of": rows}, "rule": "shifted"}
    if rows and zero is not None and zero >= SHIFTED * rows:  # rule `zeroed`: the record padded with log(1)
        return (f"in {zero / rows:.0%} of the rows with a gap it sits on tokens the engine recorded at log-prob 0.0 "
                "(probability 1) where the trainer's is not: the record was padded, not computed"), {
            "logp_zero_rows": {"value": zero, "of": rows}, "rule": "zeroed"}
    return None


@register_detector
class LogpFloorDetector(Detector):
    """Rollout/trainer log-prob gap or importance-weight ESS beyond what numerics can explain."""

    name, mode, needs_baseline = "logp_floor", "rollout_mismatch", False
    defaults = {"gap": 0.1, "ess": 0.5, "signed": 0.01, "one_sided": 0.8}

    def evaluate(self, h, ctx):
        if ctx.max_staleness > 0:  # off-policy by design: the gap measures the allowed lag
            return OK
        gap, ess = finite(h.latest("logp_gap_mean")), finite(h.latest("ess"))
        if gap is not None and gap > self.p["gap"]:
            level = 2 if gap > 5 * self.p["gap"] else 1
            ev = {"logp_gap_mean": {"value": round(gap, 6), "bound": self.p["gap"]}, "rule": "floor"}
            shifted = logp_shift_evidence(h)
            if shifted:
                return level, (f"rollout/trainer |dlogp| {gap:.3g} nats/token on-policy, and {shifted[0]}"), {**ev, **shifted[1]}
            return level, f"rollout/trainer |dlogp| {gap:.3g} nats/token on-policy (numerical floor < {self.p['gap']:g})", ev
        if ess is not None and ess < self.p["ess"]:
            return 1, f"importance-weight ESS {ess:.2f} on-policy (healthy ~1)", {
                "ess": {"value": round(ess, 4), "bound": self.p["ess"]}, "rule": "floor"}
        signed = finite(h.latest("logp_gap_signed"))
        if signed is not None and gap and signed >= self.p["signed"] and signed >= self.p["one_sided"] * gap:
            return 2 if signed > 5 * self.p["signed"] else 1, (
                f"rollout log-probs above the trainer's on {signed / gap:.0%} of the gap ({signed:.3g} nats/token; "
                "numerical error has no sign): the sampler renormalises (top-k/top-p) or runs cooler"), {
                "logp_gap_signed": {"value": round(signed, 6), "bound": self.p["signed"]}, "rule": "one_sided"}
        return OK


@register_detector
class UpdateSizeDetector(Detector):
    """The per-update KL between pi_old and the updated policy beyond any trust region."""

    name, mode, needs_baseline = "update_size", "kl_explosion", False
    defaults = {"kl": 0.5}

    def evaluate(self, h, ctx):
        kl = finite(h.latest("approx_kl"))
        if kl is None or kl <= self.p["kl"]:
            return OK
        return 2 if kl > 4 * self.p["kl"] else 1, f"one update moved the policy {kl:.3g} nats (approx_kl; healthy ~0.01)", {
            "approx_kl": {"value": round(kl, 5), "bound": self.p["kl"]}, "rule": "absolute"}


@register_detector
class AdvantageInvariantDetector(Detector):
    """A group-relative estimator's output breaks its invariants: non-zero group means, an
    advantage larger than the estimator allows, or advantages not rising with the reward."""

    name, mode, needs_baseline = "advantage_invariants", "credit_assignment", False
    defaults = {"corr": 0.5, "mean_tol": 1e-3, "scale_tol": 0.01}
    persist = 1

    def evaluate(self, h, ctx):
        spec = GROUP_RELATIVE.get(ctx.advantage)
        if spec is None or (finite(h.latest("health/max_turns")) or 1) > 1:
            return OK
        corr, gmean = finite(h.latest("advantage/score_corr")), finite(h.latest("advantage/group_mean_max"))
        amax, ratio = finite(h.latest("advantage/abs_max")), finite(h.latest("advantage/range_ratio_max"))
        if corr is not None and corr < self.p["corr"]:
            return 2 if corr < 0 else 1, f"advantages do not rise with the reward in a group (corr {corr:.2f}, healthy ~1)", {
                "advantage/score_corr": {"value": round(corr, 4), "bound": self.p["corr"]}, "rule": "sign"}
        if gmean is not None and amax is not None and not ctx.sequences_filtered and gmean > self.p["mean_tol"] * max(amax, 1.0):
            return 2, f"per-group mean advantage {gmean:.3g} ({ctx.advantage} centres every group: 0)", {
                "advantage/group_mean_max": {"value": round(gmean, 6), "bound": self.p["mean_tol"]}, "rule": "mean"}
        kind, factor = spec
        n = ctx.rollout_n
        if kind == "z" and amax is not None and n > 1:
            bound = (n - 1) / math.sqrt(n) * (1 + self.p["scale_tol"])
            if amax > bound:
                return 2, f"|advantage| {amax:.3g} above the GRPO bound (n-1)/sqrt(n) = {bound:.3g}", {
                    "advantage/abs_max": {"value": round(amax, 4), "bound": round(bound, 4)}, "rule": "scale"}
        if kind == "range" and ratio is not None and n > 1:
            bound = (factor or n / (n - 1)) * (1 + self.p["scale_tol"])
            if ratio > bound:
                return 2, f"|advantage| {ratio:.3g}x the group's reward range (at most {bound:.3g} for {ctx.advantage})", {
                    "advantage/range_ratio_max": {"value": round(ratio, 4), "bound": round(bound, 4)}, "rule": "scale"}
        return OK


@register_detector
class GroupStructureDetector(Detector):
    """Groups that do not hold `rollout.n` samples (`size`), fewer samples a group than earlier in the run
    (`shrunk`: every group smaller than the baseline's largest, e.g. a sampler no longer given rollout.n; fewer
    samples a prompt leave fewer groups with a reward spread), or the same task several times in one step."""

    name, mode, needs_baseline = "group_structure", "credit_assignment", False
    defaults = {"duplicate": 0.0}

    def evaluate(self, h, ctx):
        lo, hi = finite(h.latest("health/group_size_min")), finite(h.latest("health/group_size_max"))
        if ctx.rollout_n and lo is not None and hi is not None and (lo != ctx.rollout_n or hi != ctx.rollout_n):
            return 2, f"groups hold {lo:.0f}-{hi:.0f} samples (rollout.n = {ctx.rollout_n})", {
                "health/group_size_min": {"value": lo, "expected": ctx.rollout_n}, "rule": "size"}
        base = h.baseline("health/group_size_max", rel_floor=0.0, abs_floor=0.0)
        if base is not None and lo is not None and hi is not None and hi < base.median:
            return 2, (f"groups hold {lo:.0f}-{hi:.0f} samples, down from {base.median:.0f} earlier in the run: fewer "
                       "samples a prompt leave fewer groups with a reward spread"), {
                "health/group_size_max": {"value": hi, "baseline": base.median}, "rule": "shrunk"}
        dup = finite(h.latest("health/dup_task_frac"))
        if ctx.distinct_tasks and dup is not None and dup > self.p["duplicate"]:
            # one epoch boundary inside a step repeats a few tasks once; persistence (2 of 3 steps) rules it out
            return 1, f"{dup:.0%} of this step's groups repeat a task of the same step", {
                "health/dup_task_frac": {"value": round(dup, 4), "bound": self.p["duplicate"]}, "rule": "duplicate"}
        return OK


@register_detector
class RewardLinkageDetector(Detector):
    """The reward prefers incorrect samples (AUC well below 0.5), or follows a neighbouring
    sample's verdict instead of its own (reward records attached to the wrong samples)."""

    name, mode, needs_baseline = "reward_linkage", "reward_misalignment", False
    defaults = {"auc": 0.35, "pairs": 20.0, "shift_margin": 0.25, "shift": 0.6, "routed": 0.9, "disagree": 0.1,
                "routed_k": 2}

    def evaluate(self, h, ctx):
        k = int(self.p["routed_k"])
        recent = [(finite(r.get("health/reward_disagree_groups")), finite(r.get("health/reward_routed_frac")))
                  for r in h.rows[-k:]]
        if len(recent) == k and all(d is not None and f is not None and d >= self.p["disagree"] and f >= self.p["routed"]
                                    for d, f in recent):
            d = sum(x for x, _ in recent) / k
            return 1, (f"{d:.0%} of the groups pay samples against their verdicts, yet each pays exactly as many "
                       "samples as are correct: the group's rewards reach the wrong samples"), {
                "health/reward_routed_frac": {"value": round(sum(f for _, f in recent) / k, 4), "disagree": round(d, 4)},
                "rule": "routed"}
        own, shift = finite(h.latest("health/reward_corr_own")), finite(h.latest("health/reward_corr_shift"))
        if own is not None and shift is not None and shift > self.p["shift"] and shift > own + self.p["shift_margin"]:
            return 1, f"rewards follow a neighbouring sample's verdict (corr {shift:.2f}) more than their own ({own:.2f})", {
                "health/reward_corr_shift": {"value": round(shift, 4), "own": round(own, 4)}, "rule": "linkage"}
        auc, pairs = finite(h.latest("health/reward_correct_auc")), finite(h.latest("health/reward_correct_pairs"))
        if auc is not None and (pairs or 0) >= self.p["pairs"] and auc < self.p["auc"]:
            return 1, f"the reward ranks incorrect samples above correct ones (AUC {auc:.2f} < 0.5)", {
                "health/reward_correct_auc": {"value": round(auc, 4), "bound": self.p["auc"]}, "rule": "inverted"}
        return OK


@register_detector
class AccuracyDropDetector(Detector):
    """A run that started near zero (step-1 accuracy <= `start_max`) at less than half of step
    1's accuracy by more than `z` (2.5) standard errors: it gets worse from the start."""

    name, mode, needs_baseline = "accuracy_drop", "regression", False
    defaults = {"frac": 0.5, "z": 2.5, "start_max": 0.2}

    def evaluate(self, h: History, ctx: RunContext):
        rows = [r for r in h.rows if finite(r.get("accuracy")) is not None]
        if len(rows) < 3:
            return OK
        a0, se0 = rows[0]["accuracy"], finite(rows[0].get("health/accuracy_se"))
        if a0 > self.p["start_max"]:
            return OK
        recent = [r for r in rows[1:] if r["step"] not in h.discarded][-2:]
        if len(recent) < 2 or se0 is None:
            return OK
        a1 = sum(r["accuracy"] for r in recent) / len(recent)
        ses = [finite(r.get("health/accuracy_se")) for r in recent]
        if any(s is None for s in ses):
            return OK
        se = math.sqrt(se0 ** 2 + sum(s ** 2 for s in ses) / len(ses) ** 2)
        se = max(se, 0.5 / max(finite(rows[0].get("health/samples")) or 1.0, 1.0))  # never below half a sample
        if a1 < self.p["frac"] * a0 and a0 - a1 > self.p["z"] * se:
            level = 2 if a1 < 0.5 * self.p["frac"] * a0 and a0 - a1 > 2 * self.p["z"] * se else 1
            return level, f"accuracy {a1:.3f} vs {a0:.3f} at step {rows[0]['step']} ({(a0 - a1) / se:.1f} standard errors)", {
                "accuracy": {"value": round(a1, 4), "start": round(a0, 4), "se": round(se, 4)}, "rule": "from_start"}
        return OK


@register_detector
class LossMaskDetector(Detector):
    """The loss mask does not cover exactly the sampled tokens: position by position (`position`:
    sampled tokens outside it, unsampled ones inside it; where: the first or last sampled token,
    the whole mask moved by one), or in number (`coverage`); or it covers them exactly but weighs
    a row's tokens unequally (`weighted`: a per-token weight, which the coverage cause does not name)."""

    name, mode, needs_baseline = "loss_mask", "credit_assignment", False
    persist = 1

    def evaluate(self, h, ctx):
        missed, extra = finite(h.latest("health/mask_missed")), finite(h.latest("health/mask_extra"))
        if (missed or 0) > 0 or (extra or 0) > 0:
            where = {k: v for k in ("shifted", "missed_last", "missed_first")
                     if (v := finite(h.latest(f"health/mask_{k}"))) is not None and v > 0}
            how = ("moved by one position" if where.get("shifted", 0) > 0 else "misses the last sampled token"
                   if where.get("missed_last", 0) > 0 else "misses the first sampled token" if where.get("missed_first", 0) > 0
                   else "disagrees with the sampled positions")
            return 2, (f"the loss mask {how}: {missed or 0:.1%} of the sampled tokens outside it, unsampled positions "
                       f"inside it {extra or 0:.1%} of their number"), {
                "health/mask_missed": {"value": round(missed or 0, 5)}, "health/mask_extra": {"value": round(extra or 0, 5)},
                "where": {k: round(v, 4) for k, v in where.items()}, "rule": "position"}
        uneven = finite(h.latest("health/mask_uneven"))
        if uneven:  # the right positions, weighed unequally inside a row: a per-token weight, not the mask's coverage
            return 2, (f"the loss mask covers exactly the sampled positions but weighs them unequally within {uneven:.0%} "
                       "of the rows (a row's weight is one number for all its tokens): the loss weights tokens by "
                       "position or value"), {"health/mask_uneven": {"value": round(uneven, 4)}, "rule": "weighted"}
        if ctx.sequences_filtered:
            return OK
        n = finite(h.latest("batch/loss_tokens"))
        lo, hi = finite(h.latest("health/action_tokens_ok")), finite(h.latest("health/action_tokens"))
        if n is None or lo is None or hi is None or lo <= n <= hi:
            return OK
        return 2, f"the loss mask covers {n:.0f} tokens; {lo:.0f}-{hi:.0f} were sampled", {
            "batch/loss_tokens": {"value": n, "sampled": hi, "sampled_ok": lo}, "rule": "coverage"}


@register_detector
class TokenIdsDetector(Detector):
    """The loss scores other tokens than the sampler saw and drew (`health/token_mismatch_rows`:
    rows whose attended tokens differ, whatever the layout; `health/token_mismatch`: sampled
    positions with another id; 0 in every correct step): a re-tokenisation, a vocabulary map
    between engine and trainer, ids shifted on the way, a prefix the engine never saw. The rewards, advantages
    and sampler log-probs belong to the sampled tokens; the loss raises others. No cause of the
    taxonomy is this mechanism (the forwards can agree exactly), so the diagnosis reports it as an
    unexplained anomaly with this evidence."""

    name, mode, needs_baseline = "token_ids", "token_ids", False
    persist = 1

    def evaluate(self, h, ctx):
        rows, x = finite(h.latest("health/token_mismatch_rows")), finite(h.latest("health/token_mismatch"))
        if (rows is None or rows <= 0) and (x is None or x <= 0):
            return OK
        where = (f"other ids at {x:.1%} of the sampled positions" if x is not None and x > 0 else
                 "the sampled tokens in another context or layout (a prefix, a shift)")
        return 2, f"the loss scores {where}: {rows or 0:.0%} of the rows differ from what the sampler saw and drew", {
            "health/token_mismatch_rows": {"value": round(rows or 0.0, 4)},
            **({"health/token_mismatch": {"value": round(x, 5)}} if x is not None else {}), "rule": "ids"}
