"""Absolute sanity checks (detectors_sanity.py): each fires on a fault present from step 1, and
stays quiet on the healthy series and on the healthy irregularities it must tolerate."""

from __future__ import annotations

import random

import pytest

from tether.health.config import HealthConfig
from tether.health.detectors import RunContext
from tether.health.diagnosis import diagnose
from tether.health.monitor import HealthMonitor
from health_helpers import healthy_row

CTX = RunContext("exact_match", {"exact_match": 1.0}, 0, rollout_n=8, advantage="grpo")
SANE = {  # what the new telemetry reads on a healthy GRPO step (measured on faultbench runs)
    "advantage/group_mean_max": 5e-8, "advantage/abs_max": 2.47, "advantage/range_ratio_max": 2.47,
    "health/group_size_min": 8.0, "health/group_size_max": 8.0, "health/dup_task_frac": 0.0, "health/max_turns": 1.0,
    "health/reward_corr_own": 1.0, "health/reward_corr_shift": 0.6, "health/reward_correct_pairs": 60.0,
    "health/accuracy_se": 0.06, "health/samples": 256.0, "batch/loss_tokens": 600.0, "health/action_tokens": 600.0,
    "health/action_tokens_ok": 600.0,
}


def monitor(only: str | None = None) -> HealthMonitor:
    class _C:
        health = HealthConfig()
    mon = HealthMonitor(_C(), rd=None, watchdog=False)
    if only:
        mon.detectors = {only: mon.detectors[only]}
    return mon


def run(change=None, n: int = 8, only: str | None = None, ctx: RunContext = CTX, seed: int = 0, start: int = 1):
    """Findings over n healthy rows, `change(row, step)` applied from `start` on."""
    rng, mon = random.Random(seed), monitor(only)
    for step in range(1, n + 1):
        row = {**healthy_row(step, rng), **SANE}
        if change and step >= start:
            change(row, step)
        mon.run_detectors(step, row, ctx)
    return mon.findings


def first(findings, detector: str):
    return next((f for f in findings if f.detector == detector), None)


def test_healthy_series_raises_nothing_over_60_steps():
    for seed in range(3):
        assert run(n=60, seed=seed) == []


def test_topk_gap_from_step_1_is_critical_at_step_1():
    f = first(run(lambda r, s: r.update(logp_gap_mean=3.5)), "logp_floor")
    assert f is not None and f.step == 1 and f.severity == "critical"
    assert diagnose([f])[0].cause == "rollout_mismatch"


def test_a_gap_that_lines_up_one_position_over_is_misfiled_log_probs_not_a_sampler_mismatch():
    f = first(run(lambda r, s: r.update(logp_gap_mean=1.2, logp_gap_rows=64.0, logp_shift_rows=64.0)), "logp_floor")
    assert f is not None and f.evidence["rule"] == "shifted" and "one position over" in f.message
    hyps = diagnose([f])
    assert hyps[0].cause == "unexplained"
    assert all(h.cause != "rollout_mismatch" or "logp_floor" in h.contradicted for h in hyps)
    # a gap that no shift explains in most rows stays a sampler/trainer mismatch
    f = first(run(lambda r, s: r.update(logp_gap_mean=1.2, logp_gap_rows=64.0, logp_shift_rows=20.0)), "logp_floor")
    assert f.evidence["rule"] == "floor" and diagnose([f])[0].cause == "rollout_mismatch"


def test_a_gap_on_tokens_recorded_at_log_prob_zero_is_a_padded_record_not_a_sampler_mismatch():
    """Faultbench rollout_logp_tail_zero_padded (round 10): the engine's log-probs padded with 0.0 at
    the tail. Neither a sampler that computes differently nor stale weights explains a gap that sits
    on tokens recorded at probability 1: the diagnosis abstains and says where the gap sits."""
    f = first(run(lambda r, s: r.update(logp_gap_mean=0.45, logp_gap_rows=64.0, logp_shift_rows=0.0,
                                        logp_zero_rows=64.0)), "logp_floor")
    assert f is not None and f.evidence["rule"] == "zeroed" and "log-prob 0.0" in f.message
    hyps = diagnose([f])
    assert hyps[0].cause == "unexplained"
    assert all(h.cause not in ("rollout_mismatch", "stale_weights") or "logp_floor" in h.contradicted for h in hyps)
    # zeros in a few gapped rows only: still a sampler/trainer mismatch
    f = first(run(lambda r, s: r.update(logp_gap_mean=0.45, logp_gap_rows=64.0, logp_zero_rows=10.0)), "logp_floor")
    assert f.evidence["rule"] == "floor" and diagnose([f])[0].cause == "rollout_mismatch"


def test_gap_at_bf16_floor_is_not_a_finding():
    assert first(run(lambda r, s: r.update(logp_gap_mean=0.02, ess=0.97), n=30), "logp_floor") is None


def test_small_one_sided_gap_from_step_1_is_flagged_a_bf16_noise_gap_is_not():
    """A subtle top-k filter: every sampled token's rollout log-prob is higher (renormalised), by
    0.02 nats - below the 0.1 floor, but one-sided; bf16 noise of the same size has no sign."""
    f = first(run(lambda r, s: r.update(logp_gap_mean=0.02, logp_gap_signed=0.019)), "logp_floor")
    assert f is not None and f.step <= 2 and f.evidence["rule"] == "one_sided"
    assert diagnose([f])[0].cause == "rollout_mismatch"
    noise = run(lambda r, s: r.update(logp_gap_mean=0.02, logp_gap_signed=2e-4), n=30)  # ~var/2 selection bias
    assert first(noise, "logp_floor") is None
    fp32 = run(lambda r, s: r.update(logp_gap_mean=3e-7, logp_gap_signed=3e-7), n=30)  # one-sided but at the fp32 floor
    assert first(fp32, "logp_floor") is None


def test_no_floor_when_staleness_is_allowed():
    ctx = RunContext("exact_match", {"exact_match": 1.0}, 2, rollout_n=8, advantage="grpo")
    assert first(run(lambda r, s: r.update(logp_gap_mean=0.3), ctx=ctx), "logp_floor") is None


@pytest.mark.parametrize("change,rule", [
    (lambda r, s: r.update({"advantage/score_corr": -0.95}), "sign"),
    (lambda r, s: r.update({"advantage/group_mean_max": 0.3}), "mean"),
    (lambda r, s: r.update({"advantage/abs_max": 4.0}), "scale"),
])
def test_advantage_invariants_from_step_1(change, rule):
    f = first(run(change), "advantage_invariants")
    assert f is not None and f.step == 1 and f.evidence["rule"] == rule
    assert diagnose([f])[0].cause == "advantage_bug"


def test_advantage_invariants_only_for_group_relative_single_turn():
    gae = RunContext("exact_match", {"exact_match": 1.0}, 0, rollout_n=8, advantage="gae")
    assert first(run(lambda r, s: r.update({"advantage/group_mean_max": 0.3}), ctx=gae), "advantage_invariants") is None
    multi = lambda r, s: r.update({"advantage/group_mean_max": 0.3, "health/max_turns": 3.0})  # noqa: E731
    assert first(run(multi), "advantage_invariants") is None


def test_group_size_mismatch_is_a_grouping_bug_at_once():
    f = first(run(lambda r, s: r.update({"health/group_size_min": 4.0, "health/group_size_max": 4.0})), "group_structure")
    assert f is not None and f.step == 1 and f.evidence["rule"] == "size"
    assert diagnose([f])[0].cause == "grouping_bug"


def test_groups_smaller_than_earlier_in_the_run_leave_no_signal():
    """`shrunk`: 8 samples a prompt until step 14, 2 from step 15 (the sampler no longer given rollout.n, the run's
    own setting following it, so `size` has nothing to compare with): found at step 15 and named no_signal; the
    same 30 steps at 8 samples, or with only some groups smaller (rows filtered), stay quiet."""
    free = RunContext("exact_match", {"exact_match": 1.0}, 0, rollout_n=0, advantage="grpo")
    two = lambda r, s: r.update({"health/group_size_min": 2.0, "health/group_size_max": 2.0})  # noqa: E731
    f = first(run(two, n=30, ctx=free, start=15), "group_structure")
    assert f is not None and f.step == 15 and f.evidence["rule"] == "shrunk"
    assert f.evidence["health/group_size_max"] == {"value": 2.0, "baseline": 8.0}
    assert diagnose([f])[0].cause == "no_signal"
    assert first(run(n=30, ctx=free), "group_structure") is None
    some = lambda r, s: r.update({"health/group_size_min": 5.0})  # noqa: E731
    assert first(run(some, n=30, ctx=free, start=15), "group_structure") is None


def test_duplicates_every_step_are_flagged_on_the_second_step():
    f = first(run(lambda r, s: r.update({"health/dup_task_frac": 0.25})), "group_structure")
    assert f is not None and f.step == 2 and f.evidence["rule"] == "duplicate"
    assert diagnose([f])[0].cause == "duplicate_problems"


def test_an_epoch_boundary_duplicate_once_per_epoch_is_tolerated():
    boundary = lambda r, s: r.update({"health/dup_task_frac": 0.0625 if s % 5 == 0 else 0.0})  # noqa: E731
    assert first(run(boundary, n=40), "group_structure") is None


def test_reward_attached_to_the_neighbour_is_misalignment_not_noise():
    f = first(run(lambda r, s: r.update({"health/reward_corr_own": 0.45, "health/reward_corr_shift": 0.93})), "reward_linkage")
    assert f is not None and f.step == 2 and f.evidence["rule"] == "linkage"
    assert diagnose([f])[0].cause == "misaligned_reward"


def test_inverted_reward_from_step_1():
    f = first(run(lambda r, s: r.update({"health/reward_correct_auc": 0.05, "health/reward_corr_own": -0.9,
                                         "health/reward_corr_shift": -0.5})), "reward_linkage")
    assert f is not None and f.step <= 2 and f.evidence["rule"] == "inverted"


def test_noisy_reward_is_not_a_linkage_finding():
    noisy = lambda r, s: r.update({"health/reward_correct_auc": 0.7, "health/reward_corr_own": 0.4,  # noqa: E731
                                   "health/reward_corr_shift": 0.3})
    assert first(run(noisy, n=20), "reward_linkage") is None


def test_near_zero_start_that_degrades():
    acc = {1: 0.12, 2: 0.06, 3: 0.02, 4: 0.0, 5: 0.0}
    f = first(run(lambda r, s: r.update(accuracy=acc.get(s, 0.0), **{"health/accuracy_se": 0.03 if acc.get(s) else 0.0})),
              "accuracy_drop")
    assert f is not None and f.step <= 5


def test_post_sft_transient_of_a_higher_start_is_tolerated():
    acc = {1: 0.52, 2: 0.32, 3: 0.30, 4: 0.20, 5: 0.19, 6: 0.34}
    assert first(run(lambda r, s: r.update(accuracy=acc.get(s, 0.4))), "accuracy_drop") is None


def test_loss_mask_that_misses_sampled_tokens():
    f = first(run(lambda r, s: r.update({"batch/loss_tokens": 520.0})), "loss_mask")
    assert f is not None and f.step == 1 and diagnose([f])[0].cause == "loss_mask_bug"


def test_a_mask_on_the_right_positions_weighed_unequally_is_not_named_a_coverage_bug():
    # the count check would see 1132 weighed tokens over 628 sampled; the positions are right
    weighted = lambda r, s: r.update({"batch/loss_tokens": 1132.0, "health/mask_uneven": 1.0})  # noqa: E731
    f = first(run(weighted), "loss_mask")
    assert f is not None and f.step == 1 and f.evidence["rule"] == "weighted"
    hyps = diagnose([f])
    assert hyps[0].cause == "unexplained"  # loss_mask_bug describes coverage: this mechanism is outside it
    assert next(h for h in hyps if h.cause == "loss_mask_bug").contradicted == ("loss_mask",)
    # an even mask (every row's tokens weigh alike) keeps the count rule
    f = first(run(lambda r, s: r.update({"batch/loss_tokens": 520.0, "health/mask_uneven": 0.0})), "loss_mask")
    assert f.evidence["rule"] == "coverage" and diagnose([f])[0].cause == "loss_mask_bug"


def test_update_size_beyond_any_trust_region():
    f = first(run(lambda r, s: r.update(approx_kl=3.0)), "update_size")
    assert f is not None and f.step == 1 and diagnose([f])[0].cause == "lr_too_high"


def test_weight_check_uses_the_version_the_fingerprint_was_taken_at():
    """Async with in-flight updates (dist.inflight): tokens of version 4 were sampled, then the
    worker adopted version 5 mid-generation and its fingerprint is version 5's. Comparing it with
    version 4's (the oldest version that sampled) was a false stale-weights alarm."""
    from tether.dist.controller import pick_fingerprint

    mon = monitor()
    mon.weight_fps = {4: 123.5, 5: 130.25}
    row = {"rollout/weights_fp": 130.25, "rollout/weights_fp_version": 5.0, "health/rollout_version_min": 4.0}
    assert mon._check_weights(row) == 0.0
    assert mon._check_weights({**row, "rollout/weights_fp": 123.5}) == 1.0  # version 4's weights claimed as 5
    workers = [{"metrics": {"rollout/weights_fp": 130.25, "rollout/weights_fp_version": 5.0}},
               {"metrics": {"rollout/weights_fp": 123.5, "rollout/weights_fp_version": 4.0}}]
    picked = pick_fingerprint(workers)  # never the mean of two workers' fingerprints
    assert picked == {"rollout/weights_fp": 123.5, "rollout/weights_fp_version": 4.0}
    assert mon._check_weights({**row, **picked}) == 0.0


def test_weight_checksum_mismatch_is_stale_weights_not_sampler_mismatch():
    mon = monitor()
    mon.weight_fps = {4: 123.5}
    assert mon._check_weights({"rollout/weights_fp": 123.5, "health/rollout_version_min": 4.0}) == 0.0
    assert mon._check_weights({"rollout/weights_fp": 120.0, "health/rollout_version_min": 4.0}) == 1.0
    f = first(run(lambda r, s: r.update({"health/weights_mismatch": 1.0, "logp_gap_mean": 0.2})), "stale_weights")
    assert f is not None and f.step == 1 and f.evidence["rule"] == "checksum"
    gap = first(run(lambda r, s: r.update({"health/weights_mismatch": 1.0, "logp_gap_mean": 0.2})), "logp_floor")
    assert diagnose([f, gap])[0].cause == "stale_weights"
    assert diagnose([gap])[0].cause == "rollout_mismatch"


def test_unexplained_when_no_cause_explains_most_of_the_evidence():
    from tether.health.detectors import Finding

    a = Finding("stall", "stall", "critical", 5, 5, "slow")
    b = Finding("error_surge", "reward_errors", "critical", 5, 5, "errors")
    c = Finding("data_shift", "data", "critical", 5, 5, "repeats", {"rule": "repeat"})
    d = Finding("truncation", "truncation", "critical", 5, 5, "cut")
    hyps = diagnose([a, b, c, d])
    assert hyps[0].cause == "unexplained" and hyps[0].actions == ("halt",)
    assert {e["detector"] for e in hyps[0].evidence} == {"stall", "error_surge", "data_shift", "truncation"}
    assert hyps[1].cause != "unexplained" and hyps[1].fit < 0.6  # the nearest explains half at most
    assert diagnose([b])[0].cause == "reward_failures"  # one clear fingerprint: named


def test_task_normalised_advantages_are_not_checked_as_group_relative():
    from tether.config import TetherConfig
    from tether.health.monitor import build_context

    cfg = TetherConfig()
    assert build_context(cfg).advantage == "grpo"
    ctx = build_context(TetherConfig.model_validate({"algo": {"advantage": {"task_norm": "task"}}}))
    assert first(run(lambda r, s: r.update({"advantage/group_mean_max": 0.3}), ctx=ctx), "advantage_invariants") is None


def test_the_loss_scoring_other_token_ids_than_sampled_is_critical_at_once_and_unexplained():
    """`token_ids`: exact (0 in every correct step). With the log-prob gap it opens, the diagnosis
    does not name a sampler mismatch or a stale sync (the forwards agree; the ids differ)."""
    assert first(run(lambda r, s: r.update({"health/token_mismatch": 0.0, "health/token_mismatch_rows": 0.0})),
                 "token_ids") is None
    # a prefix changes the layout: only the rows are compared, and they differ
    prefix = first(run(lambda r, s: r.update({"health/token_mismatch_rows": 1.0})), "token_ids")
    assert prefix is not None and "another context or layout" in prefix.message

    def shifted(r, s):
        r.update({"health/token_mismatch": 0.12, "health/token_mismatch_rows": 1.0, "logp_gap_mean": 2.0})
    found = run(shifted)
    f = first(found, "token_ids")
    assert f is not None and f.step == 1 and f.severity == "critical" and f.evidence["rule"] == "ids"
    assert first(found, "logp_floor") is not None
    hyp = diagnose(found)
    assert hyp[0].cause == "unexplained" and "token_ids" in {e["detector"] for e in hyp[0].evidence}
    assert all(h.contradicted == ("token_ids",) for h in hyp if h.cause in ("rollout_mismatch", "stale_weights"))
