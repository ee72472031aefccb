"""Progress and invariant checks (tether.health.detectors_progress): each fires on a series that
injects exactly what it guards, and stays quiet on the healthy series; the diagnosis names what
they point at, or says it cannot."""

from __future__ import annotations

import pytest

from tether.health.detectors import Finding
from tether.health.diagnosis import UNEXPLAINED, diagnose
from health_helpers import replay, series


def _first(found, detector):
    return next((f for f in found if f.detector == detector), None)


def _run(detector: str, change=None, start: int = 15, n: int = 30, seed: int = 0):
    return replay(series(n, seed, {"x": change} if change else None, start), detector=detector)


DETECTORS = ("progress", "kl_probe", "forward_mismatch", "loss_norm", "sampler_state", "param_drift", "duplicates",
             "answer_leak", "grad_memory")


@pytest.mark.parametrize("detector", DETECTORS)
@pytest.mark.parametrize("seed", range(3))
def test_quiet_on_the_healthy_series(detector, seed):
    assert _run(detector, seed=seed, n=60) == []


def test_frozen_tensors_are_flagged_at_once():
    f = _first(_run("progress", lambda r, s: r.update({"update/frozen_frac": 0.5})), "progress")
    assert f.step == 15 and f.severity == "critical" and f.evidence["rule"] == "frozen"


def test_a_stalled_update_is_flagged_and_a_fast_one_too():
    slow = _first(_run("progress", lambda r, s: r.update({"update/step_ratio": 0.02, "update/logp_change": 0.01})), "progress")
    assert slow is not None and slow.step <= 17 and slow.evidence["rule"] == "stalled"
    # only the weights slow, the log-probs move as before: not stalled
    assert _run("progress", lambda r, s: r.update({"update/step_ratio": 0.02})) == []
    fast = _first(_run("progress", lambda r, s: r.update({"update/step_ratio": 2.0})), "progress")
    assert fast is not None and fast.step <= 17 and fast.evidence["rule"] == "fast"


def test_an_update_against_its_advantages():
    f = _first(_run("progress", lambda r, s: r.update({"update/logp_gain": -0.1})), "progress")
    assert f is not None and f.evidence["rule"] == "against" and f.step <= 18  # 3 of the last 4 steps
    # two negative steps out of four are noise
    assert _run("progress", lambda r, s: r.update({"update/logp_gain": -0.1 if s % 2 else 0.1})) == []


def test_with_a_kl_penalty_on_three_steps_against_of_four_are_not_enough():
    """The KL penalty's gradient pulls against the surrogate once the policy has left the reference
    (faultbench healthy s12 with kl 0.1: 3 of 4 steps lowered the advantage-weighted log-probs). With
    its coefficient on, every step of the window must go against the advantages."""
    three = lambda r, s: r.update({"update/logp_gain": 0.1 if s % 4 == 0 else -0.1, "kl_coef": 0.1})  # noqa: E731
    assert _run("progress", three) == []
    f = _first(_run("progress", lambda r, s: r.update({"update/logp_gain": -0.1, "kl_coef": 0.1})), "progress")
    assert f is not None and f.evidence["rule"] == "against"
    # without the penalty the same 3 of 4 is a finding
    f = _first(_run("progress", lambda r, s: r.update({"update/logp_gain": 0.1 if s % 4 == 0 else -0.1})), "progress")
    assert f is not None and f.evidence["rule"] == "against"


def test_kl_probe_detached_and_flat():
    f = _first(_run("kl_probe", lambda r, s: r.update({"update/kl_live": 0.0, "kl_coef": 0.1})), "kl_probe")
    assert f.step == 15 and f.severity == "critical" and f.evidence["rule"] == "detached"
    # a frozen reference: the KL to it (0.05) above twice the per-update KL (0.01 a step): quiet
    assert _run("kl_probe", lambda r, s: r.update({"kl_coef": 0.1, "kl_loss": 0.05}), start=1) == []
    # the reference follows the policy: KL to it 0.012 < 2 x 0.01 per update
    flat = _first(_run("kl_probe", lambda r, s: r.update({"kl_coef": 0.1, "kl_loss": 0.012}), start=1), "kl_probe")
    assert flat is not None and flat.evidence["rule"] == "flat" and flat.step == 6
    # off: no coefficient, no probe
    assert _run("kl_probe", lambda r, s: r.update({"kl_coef": 0.0, "kl_loss": 0.0}), start=1) == []


def test_forward_mismatch_and_loss_norm_and_sampler_state_are_exact():
    # a training forward that differs from the scoring pass differs from the sampler as much
    f = _first(_run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 0.005, "update/kl_pre_sampler": 0.005})),
               "forward_mismatch")
    assert f.step == 16 and f.evidence["rule"] == "pre_update"  # 2 of 3 steps
    f = _first(_run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 0.05, "update/kl_pre_sampler": 0.05})),
               "forward_mismatch")
    assert f.step == 15 and f.severity == "critical"  # past 20x the bound: at once
    assert _run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 1e-6})) == []  # numerics
    f = _first(_run("loss_norm", lambda r, s: r.update({"update/norm_ratio": 1.25})), "loss_norm")
    assert f.step == 15 and f.severity == "critical"
    f = _first(_run("sampler_state", lambda r, s: r.update({"health/buffers_mismatch": 1.0})), "sampler_state")
    assert f.step == 15 and "parameters match" in f.message


def test_pi_old_as_the_odd_one_out():
    # pi_old 0.05 nats from the training forward, which agrees with the sampler: the old log-probs are wrong
    f = _first(_run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 0.05, "update/kl_pre_sampler": 1e-13})),
               "forward_mismatch")
    assert f.step == 15 and f.evidence["rule"] == "old_logp" and "pi_old" in f.message
    # the training forward differs from both (a trainer-only layer): the forwards differ
    f = _first(_run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 0.05, "update/kl_pre_sampler": 0.05})),
               "forward_mismatch")
    assert f.evidence["rule"] == "pre_update"
    # no sampler log-probs (NaN): the rule cannot tell, the forwards are blamed as before
    f = _first(_run("forward_mismatch", lambda r, s: r.update({"update/kl_pre": 0.05, "update/kl_pre_sampler": float("nan")})),
               "forward_mismatch")
    assert f.evidence["rule"] == "pre_update"


def test_a_sync_that_delivers_wrong_tensors_is_not_a_stale_one():
    stale = _first(_run("stale_weights", lambda r, s: r.update({"health/weights_mismatch": 1.0})), "stale_weights")
    assert stale.evidence["rule"] == "checksum" and stale.step == 15
    wrong = _first(_run("stale_weights", lambda r, s: r.update({"health/weights_mismatch": 1.0,
                                                                "health/weights_foreign_frac": 0.25})), "stale_weights")
    assert wrong.evidence["rule"] == "foreign" and "25%" in wrong.message
    # what the diagnosis makes of them, with the sampler-vs-trainer gap they bring
    assert diagnose([_f("stale_weights", "checksum"), _f("logp_gap", step=16)])[0].cause == "stale_weights"
    hyps = diagnose([_f("stale_weights", "foreign"), _f("logp_gap", step=16), _f("logp_floor", step=16)])
    assert hyps[0].cause == "rollout_mismatch"
    assert "stale_weights" in next(h for h in hyps if h.cause == "stale_weights").contradicted


def test_weights_written_outside_the_optimizer_once_are_not_a_sync_that_converts():
    """Foreign tensors at one step only, the next version matching again (a reload that re-initialised
    tensors: the next version carries them): rule `jump` one step later, which rules out both a sync
    mismatch and a stale sync. A converter that is wrong at every step never gives it."""
    once = lambda r, s: r.update({"health/weights_mismatch": 1.0, "health/weights_foreign_frac": 0.05} if s == 15  # noqa: E731
                                 else {"health/weights_mismatch": 0.0})
    found = _run("stale_weights", once)
    assert [(f.step, f.evidence["rule"]) for f in found] == [(15, "foreign"), (16, "jump")]
    assert "step 15 only" in found[1].message
    hyps = diagnose(found + [_f("logp_gap", step=15)])
    assert hyps[0].cause == UNEXPLAINED
    assert all("stale_weights" in h.contradicted for h in hyps if h.cause in ("rollout_mismatch", "stale_weights"))
    always = lambda r, s: r.update({"health/weights_mismatch": 1.0, "health/weights_foreign_frac": 0.25})  # noqa: E731
    assert {f.evidence["rule"] for f in _run("stale_weights", always)} == {"foreign"}


def test_a_reference_that_jumps_away_is_not_an_inactive_anchor_nor_a_large_update():
    """`kl_probe:moved`: the KL to the reference jumps (5x its baseline) at step 15 and stays, while the per-update
    KL stays as it was - the reference moved, not the policy. It rules out kl_inactive (the anchor acts,
    towards the wrong model) and the update-size causes; a policy that moves away fast (per-update KL up
    with it) is not this rule."""
    def ref(kl, step_kl=None):
        def change(r, s):
            r.update({"kl_coef": 0.1, "kl_loss": kl if s >= 15 else 0.3 + 0.03 * (s % 3)})
            if step_kl is not None and s >= 15:
                r["approx_kl"] = step_kl
        return change
    found = _run("kl_probe", ref(1.5), start=1)
    f = _first(found, "kl_probe")
    assert f is not None and f.step == 17 and f.evidence["rule"] == "moved" and f.severity == "critical"  # 3 steps
    hyps = diagnose(found + [_f("kl_explosion", step=16, severity="warn")])
    assert hyps[0].cause == UNEXPLAINED
    assert all("kl_probe" in h.contradicted for h in hyps if h.cause in ("kl_inactive", "lr_too_high"))
    assert not [x for x in _run("kl_probe", ref(1.5, step_kl=0.2), start=1) if x.evidence.get("rule") == "moved"]
    assert _run("kl_probe", ref(0.36), start=1) == []  # within the baseline's spread


ADAM = {"update/opt_beta1": 0.9, "update/opt_beta2": 0.999, "update/opt_eps": 1e-8, "update/opt_weight_decay": 0.0,
        "update/moments_changed": 0.0}


def _optimizer(change):
    def edit(r, s):
        r.update(ADAM)
        if s >= 15:
            change(r)
    return replay(series(30, 0, {"x": edit}, start=1), detector="optimizer_state")


def test_optimizer_state_written_between_steps_and_settings_changed_mid_run():
    assert _optimizer(lambda r: None) == []  # the state only the steps write, the settings the first step's
    for scale, spread, rule in ((0.01, 1.0, "shrunk"), (0.0, 1.0, "shrunk"), (100.0, 1.0, "grown"), (0.9, 30.0, "foreign")):
        f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": scale,
                                                  "update/moments_spread": spread, "update/moments_steps": 0.0})),
                   "optimizer_state")
        assert f.step == 15 and f.severity == "critical" and f.evidence["rule"] == rule
    # the counter ran ahead: optimizer.step() outside the loop, whatever the moments did
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 2.0,
                                              "update/moments_spread": 1.3, "update/moments_steps": 1.0})), "optimizer_state")
    assert f.step == 15 and f.evidence["rule"] == "extra_steps"
    # the counter went back with the moments as they were: a reset of Adam's step alone, not extra steps
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 1.0,
                                              "update/moments_spread": 1.0, "update/moments_steps": -12.0,
                                              "update/moments_rewound": 12.0})), "optimizer_state")
    assert f.step == 15 and f.evidence["rule"] == "counter" and "went back 12 steps" in f.message
    # the counter went back and the moments were rescaled too (a state rebuilt at zero): the moments' rule
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 0.0,
                                              "update/moments_spread": 1.0, "update/moments_steps": -12.0,
                                              "update/moments_rewound": 12.0})), "optimizer_state")
    assert f.evidence["rule"] == "shrunk"
    # the moments cast to a low-precision type and back (values on the bfloat16 grid, about the same sum): lost
    # precision, which neither a too-high LR nor a hidden LR scale names
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 1.0004,
                                              "update/moments_spread": 1.003, "update/moments_steps": 0.0,
                                              "update/moments_rounded": 1.0})), "optimizer_state")
    assert f.step == 15 and f.evidence["rule"] == "rounded"
    hyps = diagnose([f])
    assert hyps[0].cause == "unexplained"
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 0.0,
                                              "update/moments_spread": 1.0, "update/moments_steps": 0.0,
                                              "update/moments_rounded": 1.0})), "optimizer_state")
    assert f.evidence["rule"] == "rounded"  # small moments flushed to 0, the rest on the grid: still a cast
    hyps = diagnose([f, _f("kl_explosion", "spike"), _f("update_size")])  # the lost moments make the update huge
    assert hyps[0].cause == "unexplained"
    assert "optimizer_state" in next(h for h in hyps if h.cause == "lr_too_high").contradicted
    f = _first(_optimizer(lambda r: r.update({"update/moments_changed": 1.0, "update/moments_scale": 0.1,
                                              "update/moments_spread": 1.0, "update/moments_steps": 0.0,
                                              "update/moments_rounded": 0.05})), "optimizer_state")
    assert f.evidence["rule"] == "shrunk" and diagnose([f])[0].cause == "lr_too_high"  # a rescale stays what it was
    f = _first(_optimizer(lambda r: r.update({"update/opt_eps": 0.1})), "optimizer_state")
    assert f.step == 15 and f.evidence["rule"] == "eps" and "eps 1e-08 -> 0.1" in f.message
    for change in ({"update/opt_eps": 1e-12}, {"update/opt_beta1": 0.999, "update/opt_beta2": 0.9},
                   {"update/opt_weight_decay": -3.0}):
        f = _first(_optimizer(lambda r: r.update(change)), "optimizer_state")
        assert f.step == 15 and f.evidence["rule"] == "hparams", change


def _answers(change):
    def edit(r, s):  # a healthy step-to-step wobble of the answers' statistics (+-0.05, +-0.04)
        r["health/answer_len_mean"] = 1.34 + 0.025 * ((s * 7) % 5 - 2)
        r["health/answer_distinct_frac"] = 0.53 + 0.02 * ((s * 3) % 5 - 2)
        if s >= 15:
            change(r)
    return replay(series(30, 0, {"x": edit}, start=1), detector="data_shift")


def test_a_loader_that_picks_problems_by_their_answer():
    assert _answers(lambda r: None) == []
    # copies of problems leave fewer problems, so more distinct answers per problem: not this rule
    assert _answers(lambda r: r.update({"health/answer_distinct_frac": 0.9})) == []
    for change in ({"health/answer_distinct_frac": 0.15},  # a file sorted by its answers: one or two per step
                   {"health/answer_len_mean": 1.0},  # a length filter on the label column
                   {"health/answer_len_mean": 3.3}):  # gold answers rewritten ("7" -> "7.0")
        f = _first(_answers(lambda r: r.update(change)), "data_shift")
        assert f is not None and f.evidence["rule"] == "answers" and f.step <= 18, change  # a 3-step mean, 2 hits


def test_gradients_carried_over_between_steps():
    f = _first(_run("grad_memory", lambda r, s: r.update({"update/grad_cos_prev": 0.97})), "grad_memory")
    assert f is not None and f.step <= 17 and f.severity == "critical" and f.evidence["rule"] == "carryover"  # a 3-step mean
    half = _first(_run("grad_memory", lambda r, s: r.update({"update/grad_cos_prev": 0.7})), "grad_memory")
    assert half is not None and half.severity == "warn" and half.step <= 18  # persists 2 steps
    # a high-but-healthy level (0.4) and one outlier step are not a carry-over
    assert _run("grad_memory", lambda r, s: r.update({"update/grad_cos_prev": 0.4})) == []
    assert _run("grad_memory", lambda r, s: r.update({"update/grad_cos_prev": 0.95}) if s == 20 else None) == []


def test_param_drift_one_way_every_step():
    f = _first(_run("param_drift", lambda r, s: r.update({"health/param_norm": 32.8 * 1.01 ** (s - 14)})), "param_drift")
    assert f is not None and f.step <= 20 and f.evidence["rule"] == "drift"
    # the same amplitude back and forth is not a drift
    assert _run("param_drift", lambda r, s: r.update({"health/param_norm": 32.8 * (1.01 if s % 2 else 1.0)})) == []


def test_duplicates_beyond_chance_and_answers_in_prompts():
    f = _first(_run("duplicates", lambda r, s: r.update({"health/dup_groups_unlikely": 6.0})), "duplicates")
    assert f is not None and f.step == 16
    assert _run("duplicates", lambda r, s: r.update({"health/dup_groups_unlikely": 1.0})) == []  # one group: chance
    f = _first(_run("answer_leak", lambda r, s: r.update({"health/answer_in_prompt": 1.0})), "answer_leak")
    assert f is not None and f.step == 15  # an invariant: at once, over the two steps' prompts
    # one step of a healthy run that happens to hold many answers (faultbench's worst: 0.53 own, 0.16 chance)
    assert _run("answer_leak", lambda r, s: r.update({"health/answer_in_prompt": 0.53, "health/answer_in_prompt_chance": 0.16})
                if s == 15 else None) == []
    # a task whose notation repeats answers often (0.5 own, 0.3 chance) is not a leak
    assert _run("answer_leak", lambda r, s: r.update({"health/answer_in_prompt": 0.5,
                                                      "health/answer_in_prompt_chance": 0.3})) == []


# ----------------------------------------------------------------------------- what the diagnosis makes of them


def _f(detector: str, rule: str | None = None, step: int = 15, severity: str = "critical") -> Finding:
    return Finding(detector, detector, severity, step, step, detector, {"rule": rule} if rule else {})


@pytest.mark.parametrize("findings,cause", [
    ([_f("progress", "frozen")], "no_progress"),
    ([_f("progress", "stalled")], "no_progress"),
    ([_f("kl_probe", "detached")], "kl_inactive"),
    ([_f("loss_norm", "coverage")], "loss_norm_bug"),
    ([_f("answer_leak", "leak")], "answer_leakage"),
    ([_f("duplicates", "independence")], "sampler_duplicates"),
    ([_f("sampler_state", "buffers"), _f("logp_floor", "floor", 16)], "rollout_mismatch"),
    # Adam's second moments shrunk between steps: every later step larger at the same LR
    ([_f("optimizer_state", "shrunk"), _f("kl_explosion", "spike", 16)], "lr_too_high"),
    ([_f("optimizer_state", "eps"), _f("progress", "stalled", 17)], "no_progress"),
    ([_f("optimizer_state", "grown")], "no_progress"),
    ([_f("optimizer_state", "extra_steps"), _f("kl_explosion", "spike", 16)], "lr_too_high"),
])
def test_each_check_points_at_its_cause(findings, cause):
    assert diagnose(findings)[0].cause == cause


def test_copies_of_problems_picked_by_their_answer_are_not_plain_duplicates():
    hyps = diagnose([_f("group_structure", "duplicate"), _f("data_shift", "answers", 16, "warn")])
    assert hyps[0].cause == UNEXPLAINED
    assert "data_shift" in next(h for h in hyps if h.cause == "duplicate_problems").contradicted
    # rewritten gold answers that nothing solves any more: the data; the answers' shift alone names nothing
    assert diagnose([_f("data_shift", "answers", 15, "warn"), _f("data_shift", "unsolvable", 16, "warn")])[0].cause == \
        "data_corruption"
    assert diagnose([_f("data_shift", "answers", 15, "warn")])[0].cause == UNEXPLAINED


def test_a_reset_step_counter_is_neither_an_update_size_problem_nor_a_frozen_update():
    hyps = diagnose([_f("optimizer_state", "counter"), _f("kl_explosion", "spike", 16)])
    assert hyps[0].cause == UNEXPLAINED
    assert all("optimizer_state" in h.contradicted for h in hyps if h.cause in ("lr_too_high", "no_progress"))


def test_moments_of_other_tensors_are_not_an_update_size_problem():
    hyps = diagnose([_f("optimizer_state", "foreign"), _f("kl_explosion", "spike", 16)])
    assert hyps[0].cause == UNEXPLAINED
    assert "optimizer_state" in next(h for h in hyps if h.cause == "lr_too_high").contradicted


def test_changed_optimizer_settings_are_not_a_too_high_lr_nor_the_data():
    # swapped betas: the KL blows up (or accuracy sinks) at the configured LR; no cause names the mechanism
    hyps = diagnose([_f("optimizer_state", "hparams"), _f("kl_explosion", "spike", 16)])
    assert hyps[0].cause == UNEXPLAINED
    assert "optimizer_state" in next(h for h in hyps if h.cause == "lr_too_high").contradicted
    assert diagnose([_f("optimizer_state", "hparams"), _f("data_shift", "unsolvable", 20, "warn")])[0].cause == UNEXPLAINED


def test_a_forward_that_differs_before_the_update_is_not_a_too_high_lr():
    # the KL and clipping of a trainer forward that differs from its scoring pass, present before any update
    hyps = diagnose([_f("forward_mismatch", "pre_update"), _f("kl_explosion", "spike"), _f("clip_saturation")])
    assert hyps[0].cause == "rollout_mismatch"
    lr = next(h for h in hyps if h.cause == "lr_too_high")
    assert lr.contradicted == ("forward_mismatch",)  # lr_too_high predicts no KL before the first step


def test_a_mask_over_unsampled_positions_is_not_a_sampler_mismatch():
    hyps = diagnose([_f("loss_mask", "position"), _f("logp_floor", "floor"), _f("loss_norm", "coverage", 16)])
    assert hyps[0].cause == "loss_mask_bug" and hyps[0].fit == 1.0  # the mask explains the gap and the normaliser
    # a sampler mismatch predicts the gap but is ruled out by the mask (its score falls to nothing)
    assert all(h.cause != "rollout_mismatch" for h in hyps)


def test_rewards_on_the_wrong_samples_are_not_noise():
    hyps = diagnose([_f("reward_linkage", "routed"), _f("reward_noise", "auc")])
    assert hyps[0].cause == "misaligned_reward"
    assert all(h.cause != "noisy_reward" for h in hyps[:1])


def test_a_wrong_pi_old_and_a_carried_gradient_are_not_named_after_their_consequences():
    # pi_old's rows off: the ratio's KL and clipping, a sampler-vs-pi_old gap - but the forwards agree
    hyps = diagnose([_f("forward_mismatch", "old_logp"), _f("logp_gap"), _f("logp_floor"), _f("kl_explosion", "spike"),
                     _f("update_size")])
    assert hyps[0].cause == UNEXPLAINED
    assert "forward_mismatch" in next(h for h in hyps if h.cause == "rollout_mismatch").contradicted
    # gradients accumulated across steps: the update grows like a too-high LR's, which the carry-over rules out
    hyps = diagnose([_f("grad_memory", "carryover"), _f("grad_spike"), _f("kl_explosion", "spike", 16), _f("param_drift", "drift", 17)])
    assert hyps[0].cause == UNEXPLAINED
    assert "grad_memory" in next(h for h in hyps if h.cause == "lr_too_high").contradicted


def test_evidence_no_cause_predicts_is_an_unexplained_anomaly_with_the_signals():
    drift = Finding("param_drift", "param_drift", "warn", 20, 17, "the norm changes +1% per step",
                    {"health/param_norm": {"value": 35.1, "rate": 0.01}, "rule": "drift"})
    hyps = diagnose([drift, _f("regression", step=22)])
    top = hyps[0]
    assert top.cause == UNEXPLAINED and top.actions == ("halt",)
    assert "health/param_norm" in top.moved and {e["detector"] for e in top.evidence} == {"param_drift", "regression"}
    against = diagnose([_f("progress", "against"), _f("entropy_collapse", step=18)])
    assert against[0].cause == UNEXPLAINED  # entropy alone would be named; the update's direction is not explained
    assert "progress" in against[1].unexplained and "nearest" in against[0].advice


def test_confidence_is_a_probability_that_rises_with_the_fit():
    from tether.health.diagnosis import compute_confidence

    lo, hi = compute_confidence(0.2, 0.5, 0.2), compute_confidence(1.0, 0.5, 0.2)
    assert 0.0 < lo < hi < 1.0
