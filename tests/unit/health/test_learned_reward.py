"""Learned rewards as suspects: held-out agreement with the verifier (by hand), the detector, and
the diagnosis that names an exploited learned reward and down-weights it."""

from __future__ import annotations

import pytest
from health_helpers import replay, series

from tether.eval.runner import compute_reward_agreement
from tether.health.diagnosis import diagnose
from tether.types import Outcome, RewardResult, StopReason, Trajectory, TrajectoryGroup


def _group(tid, rows):
    trajs = tuple(Trajectory(tid, (), RewardResult(0.0, comps, Outcome.OK, ok), StopReason.EOS) for comps, ok in rows)
    return TrajectoryGroup(tid, trajs, {"prompt": "p"})


def test_agreement_by_hand():
    g1 = _group("a", [({"exact_match": 1.0, "rm": 0.9, "rm/extra": 1.0}, True),
                      ({"exact_match": 0.0, "rm": 0.2}, False),
                      ({"exact_match": 0.0, "rm": 0.95}, False)])
    g2 = _group("b", [({"exact_match": 1.0, "rm": 0.5}, True), ({"exact_match": 0.0, "rm": 0.5}, False)])
    g3 = _group("c", [({"exact_match": 0.0, "rm": 0.1}, False)])  # no correct sample: no pair
    # pairs: (0.9 vs 0.2) win, (0.9 vs 0.95) loss, (0.5 vs 0.5) tie -> (1 + 0 + 0.5) / 3
    m = compute_reward_agreement([g1, g2, g3], "exact_match")
    assert m == {"eval/reward_agreement/rm": pytest.approx(0.5)}


def _agreement(values):
    def fn(row, step):
        if step % 5 == 0:  # evaluations every 5 steps
            row["eval/reward_agreement/reward_model"] = values(step)
    return fn


def test_detector_fires_when_agreement_falls_and_diagnosis_names_the_learned_reward():
    rows = series(40, 1, {"a": _agreement(lambda s: 0.85 if s < 20 else 0.52)}, start=1)
    found = replay(rows, detector="learned_reward")
    assert found and found[0].step == 20 and found[0].evidence["component"] == "reward_model"
    hyps = diagnose(found)
    assert hyps[0].cause == "learned_reward_exploited" and "downweight_component" in hyps[0].actions


def test_quiet_while_the_learned_reward_agrees():
    rows = series(40, 2, {"a": _agreement(lambda s: 0.8 + 0.02 * ((s // 5) % 3))}, start=1)
    assert replay(rows, detector="learned_reward") == []


def test_a_drop_from_a_good_start_is_flagged_before_chance():
    rows = series(40, 3, {"a": _agreement(lambda s: 0.95 if s < 25 else 0.7)}, start=1)
    found = replay(rows, detector="learned_reward")
    assert found and found[0].step == 25 and found[0].evidence["why"] == "drop" and found[0].severity == "warn"


# --------------------------------------------------------------- every step, on the policy's own rollouts

from tether.health.config import HealthConfig  # noqa: E402
from tether.health.detectors import RunContext  # noqa: E402
from tether.health.detectors_learned import compute_component_agreement, is_learned  # noqa: E402
from tether.health.monitor import HealthMonitor  # noqa: E402

RM_CTX = RunContext("exact_match", {"exact_match": 0.0, "reward_model": 1.0}, 0)


def _replay_ctx(rows, ctx=RM_CTX, params=None):
    class _C:  # `params`: the detector's thresholds, through health.thresholds as a user sets them
        health = HealthConfig(thresholds={f"learned_reward.{k}": v for k, v in (params or {}).items()})
    mon = HealthMonitor(_C(), rd=None, watchdog=False)
    mon.detectors = {"learned_reward": mon.detectors["learned_reward"]}
    for i, row in enumerate(rows, 1):
        mon.run_detectors(i, row, ctx)
    return mon.findings


def _train_rows(n, agreement, pairs=100.0, comp="reward_model", seed=0):
    rows = series(n, seed, start=1)
    for step, row in enumerate(rows, 1):
        row[f"health/reward_agreement/{comp}"] = agreement(step)
        row["health/reward_agreement_pairs"] = pairs
    return rows


def test_rollout_agreement_by_hand():
    g1 = _group("a", [({"exact_match": 1.0, "reward_model": 0.9}, True),
                      ({"exact_match": 0.0, "reward_model": 0.2}, False),
                      ({"exact_match": 0.0, "reward_model": 0.95}, False)])
    g2 = _group("b", [({"exact_match": 1.0, "reward_model": 0.5}, True), ({"exact_match": 0.0, "reward_model": 0.5}, False)])
    m = compute_component_agreement([g1, g2])
    assert m["health/reward_agreement/reward_model"] == pytest.approx(0.5)
    assert m["health/reward_agreement/exact_match"] == 1.0 and m["health/reward_agreement_pairs"] == 3.0


def test_rm_that_ranks_rollouts_against_the_verifier_is_flagged_at_step_one():
    found = _replay_ctx(_train_rows(10, lambda s: 0.34))
    assert found[0].step == 1 and found[0].severity == "critical"
    assert found[0].evidence["rule"] == "agreement" and found[0].evidence["where"] == "rollouts"
    assert diagnose(found)[0].cause == "learned_reward_exploited"


def test_chance_agreement_needs_two_steps_and_enough_pairs():
    found = _replay_ctx(_train_rows(10, lambda s: 0.5))
    assert found[0].step == 2 and found[0].severity == "warn"
    assert _replay_ctx(_train_rows(10, lambda s: 0.2, pairs=10.0)) == []  # 20 pairs over two steps: too few


def test_rollout_agreement_that_falls_from_a_good_start_is_exploitation():
    found = _replay_ctx(_train_rows(20, lambda s: 0.9 if s < 10 else 0.66))
    assert found and found[0].step == 11 and found[0].evidence["why"] == "drop"


def test_quiet_for_a_good_rm_an_unpaid_one_and_a_rule_based_component():
    assert _replay_ctx(_train_rows(30, lambda s: 0.85 + 0.05 * (s % 3 - 1))) == []
    low = _train_rows(10, lambda s: 0.3)
    assert _replay_ctx(low, RunContext("exact_match", {"exact_match": 0.0, "reward_model": 0.0}, 0)) == []
    fmt = _train_rows(10, lambda s: 0.5, comp="format")
    assert not is_learned("format") and is_learned("reward_model") and is_learned("pkg.mod:my_judge", proxy=True)
    assert _replay_ctx(fmt, RunContext("exact_match", {"exact_match": 1.0, "format": 0.2}, 0)) == []


def test_a_user_reward_is_a_suspect_only_when_it_stands_in_for_the_verifier():
    rows = _train_rows(10, lambda s: 0.3, comp="pkg.mod:bonus")
    shaping = RunContext("exact_match", {"exact_match": 1.0, "pkg.mod:bonus": 0.3}, 0)  # a shaping term next to a paid verifier
    assert _replay_ctx(rows, shaping) == []
    proxy = RunContext("exact_match", {"exact_match": 0.0, "pkg.mod:bonus": 1.0}, 0)  # the verifier unpaid: a stand-in
    assert _replay_ctx(rows, proxy)[0].step == 1


def _trend_rows(acc, rm_mean):
    rows = series(12, 4, start=1)
    for step, row in enumerate(rows, 1):
        row["accuracy"], row["health/accuracy_se"] = acc(step), 0.03
        row["reward/reward_model/mean"], row["reward/reward_model/std"] = rm_mean(step), 1.0
    return rows


def test_trend_rm_paid_while_verified_correctness_falls():
    found = _replay_ctx(_trend_rows(lambda s: 0.45 - 0.02 * s, lambda s: 0.1 * s))
    assert found and found[0].evidence["rule"] == "trend" and found[0].step == 7
    # an RM whose reward falls with correctness is not being exploited; nor is a run whose accuracy rises
    assert _replay_ctx(_trend_rows(lambda s: 0.45 - 0.02 * s, lambda s: -0.5 * s)) == []
    assert _replay_ctx(_trend_rows(lambda s: 0.45 + 0.02 * s, lambda s: 0.1 * s)) == []


def test_few_pairs_per_step_are_pooled_before_a_drop_or_floor_is_judged():
    # 40 pairs per step (8 samples per prompt): the windows pool 5 steps (200 pairs) each. The
    # fourth round's false alarms: a lucky first window (0.91) against ordinary later values, and
    # two unlucky steps of an RM that agrees ~0.72 — neither is flagged now.
    cycle = [0.62, 0.70, 0.66, 0.74]
    assert _replay_ctx(_train_rows(40, lambda s: 0.91 if s <= 2 else cycle[s % 4], pairs=40.0)) == []
    assert _replay_ctx(_train_rows(40, lambda s: {12: 0.50, 13: 0.55}.get(s, 0.72), pairs=40.0)) == []
    # with two-step windows (the old rule) both are findings: the pooling is what silences them
    old = {"window_pairs": 0.0}
    mon_rows = _train_rows(40, lambda s: 0.91 if s <= 2 else cycle[s % 4], pairs=40.0)
    assert _replay_ctx(mon_rows, params=old) and _replay_ctx(_train_rows(40, lambda s: {12: 0.50, 13: 0.55}.get(s, 0.72),
                                                                  pairs=40.0), params=old)
    # a real fall from 0.85 to 0.55 is still found, once the recent window holds mostly fallen steps
    found = _replay_ctx(_train_rows(20, lambda s: 0.85 if s <= 10 else 0.55, pairs=40.0))
    assert found and found[0].step == 14 and found[0].evidence["why"] == "drop"
    assert found[0].evidence["health/reward_agreement/reward_model"]["baseline"] == pytest.approx(0.85)

