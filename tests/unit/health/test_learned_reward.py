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
