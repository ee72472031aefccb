"""Progress and invariant checks that need no fault model (issue 41): each reads a probe of the
update (`tether.train.probes`, `update/*`) or an invariant signal of the step
(`tether.health.invariants`, `health/*`) and states a property every correct RL step keeps.

- `progress`: the update moves the policy, by what the LR implies, along its advantages. Rules:
  `frozen` trainable parameter tensors that did not move in an optimizer step (Adam moves every
  tensor that has a gradient: 0 in a correct update); `stalled` the per-step change of the
  weights (`update/step_ratio`, ||dtheta|| / (lr sqrt(N))) and of the sampled tokens' log-probs
  (`update/logp_change`) both below `stall` x their baseline (a hidden LR scale, a gradient that
  does not reach the weights); `fast` the weights moving `fast` x more than the LR and the
  baseline imply (a hidden LR scale up, broken optimizer moments); `against` the update lowering
  the surrogate on its own batch (`update/logp_gain` < 0 on `against_k` of the last steps, past
  the post-SFT transient): a loss whose gradient contradicts its advantages.
- `kl_probe`: with a KL coefficient on and the KL in the loss, the KL term carries a gradient to
  the policy (`update/kl_live`, critical at once when it does not), and the KL to the reference
  grows as the policy moves away from where it started (`flat`: after `k` steps, the KL to the
  reference is still below `flat` (2) x the mean per-update KL: a reference that follows the
  policy sits one update behind it, a frozen one falls further behind with every step).
- `forward_mismatch`: the trainer's gradient forward agrees with its own scoring pass on the
  same weights before the first optimizer step of a step (`update/kl_pre` ~ 0: the same function
  of the same weights); a KL there is not an update-size problem. Rule `old_logp`: the training
  forward agrees with the sampler (`update/kl_pre_sampler` ~ 0) - pi_old is the odd one out.
- `grad_memory`: each step's gradient is a fresh batch's (`update/grad_cos_prev`, the cosine with
  the previous step's, near 0): gradients that carry the previous steps' point the same way.
- `loss_norm`: the normaliser counts every token of a mini-batch once (`update/norm_ratio` 1).
- `sampler_state`: the sampler's non-parameter state (buffers) is the trainer's at the version
  it reports (`health/buffers_mismatch`).
- `optimizer_state`: the optimizer's state is what its own last step left (`update/moments_changed`
  0, `update/moments_steps` 0): rule `extra_steps` when Adam's step counter ran ahead (optimizer.step()
  called outside the update's loop: every gradient applied more than once); `shrunk` when something
  else rescaled it by one factor for every tensor, smaller or to nothing (every later step larger: a
  restore in the wrong scale, a reset), `grown` larger (smaller steps); `foreign` when each tensor's
  moments changed by its own factor (the moments of other tensors: a restore by position into a
  reordered parameter list); `counter` when the step counter alone went back (`update/moments_rewound`,
  the moments as the last step left them: a reset or a restore of the step apart from the state - bias
  correction restarts; not extra steps, not a rescale); `rounded` when the changed moments sit on the
  bfloat16 grid (`update/moments_rounded`: a state kept in a low-precision type, cast back each step -
  neither a rescale nor another tensor's state, and not a learning-rate problem);
  and its settings are the run's first step's (`update/opt_*`): rule `eps` for an eps that grew (it
  divides every step: a hidden LR scale down), `hparams` for any other change (betas, weight decay).
- `param_drift`: the parameters' norm moves steadily faster than during the baseline (and than a
  healthy run's own steady growth).
- `duplicates`: a group's samples are independent draws (`health/dup_groups_unlikely` above
  what independent sampling gives).
- `answer_leak`: prompts carry their own gold answer far more often than another problem's
  (over the last two steps).

Thresholds and why: docs/health/README.md ("Progress and invariant checks").
"""

from __future__ import annotations

import math

from tether.health.detectors import OK, Detector, History, RunContext, _ev, _recent_mean, register_detector
from tether.health.telemetry import finite


@register_detector
class ProgressDetector(Detector):
    """The update does not move the policy as its LR and advantages imply."""

    name, mode, needs_baseline = "progress", "no_progress", False
    defaults = {"frozen": 0.02, "stall": 0.2, "fast": 4.0, "against_k": 4, "against_n": 3, "skip": 4}

    def evaluate(self, h: History, ctx: RunContext):
        frozen = finite(h.latest("update/frozen_frac"))
        if frozen is not None and frozen > self.p["frozen"]:
            return 2, f"{frozen:.0%} of the trainable parameter tensors did not move in an optimizer step", {
                "update/frozen_frac": {"value": round(frozen, 4), "bound": self.p["frozen"]}, "rule": "frozen"}
        if h.ready:
            ratio, base_r = _recent_mean(h, "update/step_ratio", 2), h.baseline("update/step_ratio")
            change, base_c = _recent_mean(h, "update/logp_change", 2), h.baseline("update/logp_change")
            if ratio is not None and base_r is not None and ratio > self.p["fast"] * base_r.median:
                return 1, (f"the weights moved {ratio / base_r.median:.1f}x more per step than at the same LR during the "
                           "baseline (||dtheta|| / lr)"), {"update/step_ratio": _ev(ratio, base_r), "rule": "fast"}
            if (ratio is not None and base_r is not None and change is not None and base_c is not None
                    and ratio < self.p["stall"] * base_r.median and change < self.p["stall"] * base_c.median):
                return 1, (f"the update barely moves the policy: weights {ratio / base_r.median:.2g}x, sampled log-probs "
                           f"{change / base_c.median:.2g}x their baseline change per step"), {
                    "update/step_ratio": _ev(ratio, base_r), "update/logp_change": _ev(change, base_c), "rule": "stalled"}
        k = int(self.p["against_k"])
        rows = [r for r in h.rows if r["step"] > self.p["skip"] and r["step"] not in h.discarded][-k:]
        gains = [g for r in rows if (g := finite(r.get("update/logp_gain"))) is not None]
        # with a KL penalty on, its gradient pulls against the surrogate wherever the policy left the reference:
        # a healthy step may lower the advantage-weighted log-probs (faultbench healthy s12, kl 0.1: 3 of 4)
        need = k if any((finite(r.get("kl_coef")) or 0) > 0 for r in rows) else self.p["against_n"]
        if len(gains) == k and sum(g < 0 for g in gains) >= need and sum(gains) < 0:
            return 1, (f"the update lowered its own objective on {sum(g < 0 for g in gains)} of the last {k} steps "
                       f"(mean advantage-weighted log-prob change {sum(gains) / k:.3g}): the gradient goes against "
                       "the advantages"), {"update/logp_gain": {"value": round(sum(gains) / k, 5)}, "rule": "against"}
        return OK


@register_detector
class KLProbeDetector(Detector):
    """A KL anchor that does nothing while its coefficient is on (`detached`, `flat`), or whose
    reference moved (`moved`): the KL to the reference stays above `jump` x its baseline for 3
    steps while the per-update KL stays under `still` x its own - the policy did not move that
    far by its updates, so the reference did (loaded from another checkpoint, swapped mid-run), or
    the KL term pushes the policy away from it."""

    name, mode, needs_baseline = "kl_probe", "kl_inactive", False
    defaults = {"k": 6, "flat": 2.0, "floor": 1e-4, "jump": 3.0, "still": 3.0}
    persist = 1

    def _moved(self, h: History):
        # three steps each above the bar: a healthy KL-to-reference is noisy step to step (single steps up to 4x
        # its median on the extended benchmark's healthy runs, three in a row at most 1.7x)
        base, xs = h.baseline("kl_loss"), h.values("kl_loss", 3)
        step_base, step = h.baseline("approx_kl"), _recent_mean(h, "approx_kl", 3)
        if base is None or len(xs) < 3 or step_base is None or step is None or base.median <= 0:
            return None
        x = min(xs)
        if x > self.p["jump"] * base.median and x > base.median + 4 * base.scale and step < self.p["still"] * step_base.median:
            return 2, (f"the KL to the reference has stayed above {x:.3g} ({x / base.median:.1f}x its baseline) for 3 steps "
                       f"while each update moves the policy as usual ({step:.3g}): the reference moved, or the KL term "
                       "pushes the policy away from it"), {"kl_loss": _ev(x, base), "approx_kl": _ev(step, step_base),
                                                           "rule": "moved"}
        return None

    def evaluate(self, h: History, ctx: RunContext):
        live = finite(h.latest("update/kl_live"))
        if live is not None and live < 1.0:
            return 2, (f"the KL term carries no gradient to the policy on {1 - live:.0%} of the micro-batches "
                       "(its coefficient is on)"), {"update/kl_live": {"value": round(live, 4)}, "rule": "detached"}
        k = int(self.p["k"])
        rows = [r for r in h.rows if r["step"] not in h.discarded and finite(r.get("kl_loss")) is not None
                and (finite(r.get("kl_coef")) or 0) > 0][-k:]
        if len(rows) < k or any(r.get("kl/reference_reset") for r in rows):
            return OK
        if h.ready and (jumped := self._moved(h)) is not None:
            return jumped
        kl_ref = sum(r["kl_loss"] for r in rows[-2:]) / 2
        per_update = [finite(r.get("approx_kl")) or 0.0 for r in h.rows if r["step"] not in h.discarded]
        moved = sum(per_update)  # how far the policy moved since the start (sum of per-update KLs)
        if moved > 20 * self.p["floor"] and kl_ref < self.p["flat"] * moved / len(per_update):
            return 1, (f"the KL to the reference ({kl_ref:.3g}) stays at one update's size ({moved / len(per_update):.3g}) "
                       "while the policy moves: the reference follows the policy"), {
                "kl_loss": {"value": round(kl_ref, 6), "per_update": round(moved / len(per_update), 6)}, "rule": "flat"}
        return OK


@register_detector
class OptimizerStateDetector(Detector):
    """The optimizer state written outside `optimizer.step()`, or its settings changed mid-run.
    Both are exact invariants (critical at once): nothing in a correct run writes Adam's moments
    between its steps, and only the scheduler changes a param group's settings (the LR)."""

    name, mode, needs_baseline = "optimizer_state", "optimizer_state", False
    # spread: a rescale (a wrong unit, a lost state) moves every tensor's sampled moments by one factor (float
    # rounding only); a reordered restore swaps moments of tensors whose scales differ several-fold
    # rounded: the changed moments on the bfloat16 grid (fp32 values land there by chance ~2^-16 of the time)
    defaults = {"rel": 1e-6, "spread": 1.1, "rounded": 0.9}
    persist = 1
    SETTINGS = {"update/opt_beta1": "beta1", "update/opt_beta2": "beta2", "update/opt_eps": "eps",
                "update/opt_weight_decay": "weight decay"}

    def evaluate(self, h: History, ctx: RunContext):
        steps = finite(h.latest("update/moments_steps"))
        if steps and steps > 0:
            return 2, (f"Adam's step counter advanced {steps:.0f} more than the update's own optimizer steps: "
                       "optimizer.step() also runs outside the update's loop (each gradient applied more than once)"), {
                "update/moments_steps": {"value": steps}, "rule": "extra_steps"}
        changed = finite(h.latest("update/moments_changed"))
        if changed:
            scale, spread = finite(h.latest("update/moments_scale")), finite(h.latest("update/moments_spread"))
            back = finite(h.latest("update/moments_rewound"))
            if back and scale is not None and abs(scale - 1.0) <= self.p["rel"]:
                # the counter alone went back (moments as the last step left them): Adam's bias correction
                # restarts - the next updates are a different size than the moments imply, for hundreds of steps
                return 2, (f"Adam's step counter went back {back:.0f} steps while the moments stayed as the last step "
                           "left them: the counter was reset or restored apart from the moments (a resume that "
                           "restores the state but not its step); bias correction starts again"), {
                    "update/moments_rewound": {"value": back}, "update/moments_changed": {"value": round(changed, 4)},
                    "rule": "counter"}
            rounded = finite(h.latest("update/moments_rounded"))
            if rounded is not None and rounded >= self.p["rounded"]:
                # values cast to a coarser type and back: no rescale, no other tensor's state - lost precision
                return 2, (f"the optimizer state of {changed:.0%} of the policy's tensors is not what the last optimizer "
                           f"step left: {rounded:.0%} of the changed moments sit on the bfloat16 grid (Adam's fp32 "
                           "moments almost never do): the state is stored in a low-precision type between steps"), {
                    "update/moments_changed": {"value": round(changed, 4)},
                    "update/moments_rounded": {"value": round(rounded, 4), "bound": self.p["rounded"]}, "rule": "rounded"}
            ev = {"update/moments_changed": {"value": round(changed, 4)},
                  "update/moments_scale": {"value": None if scale is None else round(scale, 6)},
                  "update/moments_spread": {"value": None if spread is None else round(spread, 4)}}
            if spread is None or spread > self.p["spread"]:  # each tensor's moments changed by its own factor
                return 2, (f"the optimizer state of {changed:.0%} of the policy's tensors is not what the last optimizer "
                           f"step left, each changed by another factor (up to {spread:.3g}x apart): the moments of other "
                           "tensors (a restore by position into a reordered parameter list, another model's state)"), {
                    **ev, "rule": "foreign"}
            rule = "grown" if scale is not None and scale > 1 else "shrunk"
            what = "gone" if scale == 0 else f"x{scale:.3g}" if scale is not None else "changed"
            return 2, (f"the optimizer state of {changed:.0%} of the policy's tensors is not what the last optimizer step "
                       f"left (second moments {what}, alike for every tensor): written outside optimizer.step() (a "
                       "restore in the wrong scale, a reset)"), {**ev, "rule": rule}
        moved = []
        for key, what in self.SETTINGS.items():
            first = next((v for r in h.rows if r["step"] not in h.discarded and (v := finite(r.get(key))) is not None), None)
            x = finite(h.latest(key))
            if first is not None and x is not None and abs(x - first) > self.p["rel"] * max(abs(first), 1e-12):
                moved.append((key, what, first, x))
        if not moved:
            return OK
        rule = "eps" if len(moved) == 1 and moved[0][1] == "eps" and moved[0][3] > moved[0][2] else "hparams"
        return 2, ("the optimizer's settings changed mid-run: " + ", ".join(f"{w} {a:.3g} -> {b:.3g}" for _, w, a, b in moved)
                   + " (only the LR is scheduled)"), {
            **{k: {"value": b, "start": a} for k, _, a, b in moved}, "rule": rule}


@register_detector
class ForwardMismatchDetector(Detector):
    """The trainer's gradient forward disagrees with its own scoring pass before any optimizer step."""

    # rule `old_logp`: on the extended benchmark kl_pre_sampler / kl_pre was <= 6e-13 with pi_old's rows
    # shuffled and exactly 1 with a trainer-only layer (health_thresholds_2026-12-04.json): `odd` 0.1 splits them
    name, mode, needs_baseline = "forward_mismatch", "rollout_mismatch", False
    defaults = {"kl": 1e-3, "odd": 0.1}

    def evaluate(self, h: History, ctx: RunContext):
        kl = finite(h.latest("update/kl_pre"))
        if kl is None or abs(kl) <= self.p["kl"]:
            return OK
        level = 2 if abs(kl) > 20 * self.p["kl"] else 1
        ks = finite(h.latest("update/kl_pre_sampler"))
        if ks is not None and abs(ks) <= min(self.p["kl"], self.p["odd"] * abs(kl)):
            # the training forward agrees with the sampler: of the three log-prob sources, pi_old is the odd one
            return level, (f"pi_old is {kl:.3g} nats from the training forward, which agrees with the sampler "
                           f"({ks:.2g}): the old log-probs are wrong (their rows, positions or the pass that scored "
                           "them), not the forwards"), {
                "update/kl_pre": {"value": round(kl, 6), "bound": self.p["kl"]},
                "update/kl_pre_sampler": {"value": float(f"{ks:.3g}")}, "rule": "old_logp"}
        return level, (
            f"before the first optimizer step the training forward is {kl:.3g} nats from the scoring pass on the same "
            "weights (~0 when they are the same function): the forwards differ, the update size is not the cause"), {
            "update/kl_pre": {"value": round(kl, 6), "bound": self.p["kl"]}, "rule": "pre_update"}


@register_detector
class LossNormDetector(Detector):
    """The loss normaliser does not count each token of the mini-batch once."""

    name, mode, needs_baseline = "loss_norm", "credit_assignment", False
    defaults = {"tol": 1e-3}
    persist = 1

    def evaluate(self, h: History, ctx: RunContext):
        r = finite(h.latest("update/norm_ratio"))
        if r is None or abs(r - 1.0) <= self.p["tol"]:
            return OK
        return 2, f"the loss normaliser weighs the mini-batch's tokens {r:.3g}x (1 when each counts once)", {
            "update/norm_ratio": {"value": round(r, 6), "bound": 1.0}, "rule": "coverage"}


@register_detector
class SamplerStateDetector(Detector):
    """The sampler's buffers (non-parameter state) differ from the trainer's at the reported version."""

    name, mode, needs_baseline = "sampler_state", "rollout_mismatch", False
    persist = 1

    def evaluate(self, h: History, ctx: RunContext):
        if finite(h.latest("health/buffers_mismatch")) != 1.0:
            return OK
        params = finite(h.latest("health/weights_mismatch"))
        same = " (its parameters match)" if params == 0.0 else ""
        return 2, f"the sampler's buffers (non-parameter state) are not the trainer's{same}", {
            "health/buffers_mismatch": {"value": 1.0}, "health/weights_mismatch": {"value": params}, "rule": "buffers"}


@register_detector
class ParamDriftDetector(Detector):
    """The parameters' norm changing steadily faster than during the baseline.

    A healthy run's norm drifts too - steadily, one way (Adam without weight decay grows it): on 10
    healthy faultbench runs (lr 1e-3, 30 steps) by at most 8e-4 per step, and a baseline window
    can sit at a fraction of the later rate. So the bar is `factor` x the fastest per-step change of
    the baseline window and at least `floor` (1.5e-3: twice the healthy maximum at that LR)."""

    name, mode = "param_drift", "param_drift"
    defaults = {"k": 4, "factor": 4.0, "floor": 1.5e-3}

    def evaluate(self, h: History, ctx: RunContext):
        rows = [r for r in h.rows if r["step"] not in h.discarded and finite(r.get("health/param_norm"))]
        k = int(self.p["k"])
        base_steps = set(h.baseline_steps)
        base = [r["health/param_norm"] for r in rows if r["step"] in base_steps]
        if len(rows) < k + 1 or len(base) < 3:
            return OK
        rate0 = max(abs(math.log(b / a)) for a, b in zip(base, base[1:]))  # fastest baseline step
        recent = [r["health/param_norm"] for r in rows[-(k + 1):]]
        steps = [math.log(b / a) for a, b in zip(recent, recent[1:])]
        rate = sum(steps) / k
        steady = all(s > 0 for s in steps) or all(s < 0 for s in steps)
        if steady and abs(rate) > max(self.p["factor"] * rate0, self.p["floor"]):
            return 1, (f"the parameters' norm changes {rate:+.2%} per step ({recent[0]:.4g} -> {recent[-1]:.4g} over "
                       f"{k} steps; at most {rate0:.2%} per step in the baseline)"), {
                "health/param_norm": {"value": round(recent[-1], 5), "rate": round(rate, 6), "baseline_rate": round(rate0, 6)},
                "rule": "drift"}
        return OK


@register_detector
class GradMemoryDetector(Detector):
    """Each step's gradient points where the previous steps' did: gradients that are not cleared.

    `update/grad_cos_prev` is the cosine between the first optimizer step's gradient of a step and
    the previous step's (fresh batches: nearly independent draws). On 60 healthy runs of the extended
    fault benchmark (Intel Xeon, 2026-12-04; plain, 2 threads, KL anchor) single steps ranged
    -0.85..0.87 but no 3-step mean passed 0.44; gradients that keep every previous step's (a lost
    zero_grad) sat at a median 0.96, ones that keep half of them at a median 0.35 - mostly under the
    bar (benchmarks/results/health_thresholds_2026-12-04.json). The bar: the mean of the last `k` steps above `floor` (0.55) and
    `margin` (0.35) above the baseline median - or above `absolute` (0.9) whatever the baseline
    (gradients carried over from the first step leave no healthy baseline to compare with)."""

    name, mode, needs_baseline = "grad_memory", "grad_memory", False
    defaults = {"k": 3, "floor": 0.55, "margin": 0.35, "absolute": 0.9}

    def evaluate(self, h: History, ctx: RunContext):
        k = int(self.p["k"])
        xs = h.values("update/grad_cos_prev", k)
        mean, base = (sum(xs) / k if len(xs) == k else None), h.baseline("update/grad_cos_prev")
        relative = base is not None and mean is not None and mean > max(self.p["floor"], base.median + self.p["margin"])
        if mean is None or not (relative or mean > self.p["absolute"]):
            return OK
        return 2 if mean > 0.9 else 1, (
            f"each step's gradient points where the previous step's did (cosine {mean:.2f} over {k} steps; "
            + (f"{base.median:.2f} in the baseline; " if base is not None else "") + "fresh batches give nearly "
            "independent gradients): gradients carried over between optimizer steps (not cleared, accumulated "
            "across steps)"), {"update/grad_cos_prev": _ev(mean, base), "rule": "carryover"}


@register_detector
class DuplicatesDetector(Detector):
    """Groups whose samples are all identical far more often than independent sampling allows."""

    name, mode, needs_baseline = "duplicates", "sampler_duplicates", False
    defaults = {"groups": 2.0}

    def evaluate(self, h: History, ctx: RunContext):
        n, e = finite(h.latest("health/dup_groups_unlikely")), finite(h.latest("health/dup_groups_expected"))
        if n is None or e is None or n - e < self.p["groups"]:
            return OK
        return 2 if n - e > 4 * self.p["groups"] else 1, (
            f"{n:.0f} groups hold n identical samples that independent sampling would give {e:.2f} times: the "
            "sampler does not draw a group's samples independently (a seed per prompt?)"), {
            "health/dup_groups_unlikely": {"value": n, "expected": round(e, 4)}, "rule": "independence"}


@register_detector
class AnswerLeakDetector(Detector):
    """Prompts that carry their own gold answer: over the last two steps' prompts (64 on faultbench,
    where one step's own/chance fractions of healthy runs wander up to 0.53/0.375 above chance and two
    steps' up to 0.44/0.29), at least `own` of them hold their own answer and `margin` more than hold
    another problem's. An invariant of the data (at once, no persistence): a leaked template shows in
    the first two steps it is in force, before the damage it does to the data statistics is named."""

    name, mode, needs_baseline = "answer_leak", "data", False
    defaults = {"own": 0.55, "margin": 0.4}
    persist = 1

    def evaluate(self, h: History, ctx: RunContext):
        own, chance = _recent_mean(h, "health/answer_in_prompt", 2), _recent_mean(h, "health/answer_in_prompt_chance", 2)
        if own is None or chance is None or own < self.p["own"] or own - chance < self.p["margin"]:
            return OK
        return 1, (f"{own:.0%} of the prompts contain their own gold answer ({chance:.0%} another problem's): the "
                   "answer leaks into the prompt"), {
            "health/answer_in_prompt": {"value": round(own, 4), "chance": round(chance, 4)}, "rule": "leak"}
