"""Admission control and the staleness metrics, computed by hand."""

from collections import Counter

import pytest

from tether.dist.staleness import (
    add_to_histogram, compute_admissible_batches, compute_lags, compute_staleness_metrics, is_admissible,
)
from tether.types import RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn


def _traj(*versions):
    turns = tuple(Turn((1,), (2,), (-0.5,), policy_version=v) for v in versions)
    return Trajectory("t", turns, RewardResult(0.0), StopReason.EOS)


def test_admission_bound():
    assert is_admissible(5, 5, 0) and not is_admissible(5, 4, 0)
    assert is_admissible(5, 3, 2) and not is_admissible(5, 2, 2)
    # trainer at 4, batches 0..3 already out: with staleness 2 batches 4..6 may start now
    assert compute_admissible_batches(4, 4, 2) == [4, 5, 6]
    assert compute_admissible_batches(4, 7, 2) == []
    assert compute_admissible_batches(0, 0, 0) == [0]


def test_staleness_of_the_oldest_turn_and_histogram():
    # batch consumed at version 10: single-turn samples at 10, 9, 9; a resumed episode whose turns
    # came from versions 8, 8, 9 (lag of its oldest turn: 2; turn lags 2, 2, 1)
    groups = [TrajectoryGroup("a", (_traj(10), _traj(9), _traj(9))), TrajectoryGroup("b", (_traj(8, 8, 9),))]
    traj, turns = compute_lags(groups, 10)
    assert traj == [0, 1, 1, 2] and turns == [0, 1, 1, 2, 2, 1]
    m = compute_staleness_metrics(groups, 10, max_bucket=1)
    assert m["staleness/mean"] == pytest.approx(1.0) and m["staleness/max"] == 2.0
    assert m["staleness/turn_mean"] == pytest.approx(7 / 6)
    assert m["staleness/frac_lag_0"] == pytest.approx(0.25)
    assert m["staleness/frac_lag_1"] == pytest.approx(0.75)  # the last bucket also counts larger lags
    assert m["staleness/mixed_version_frac"] == pytest.approx(0.25)
    assert add_to_histogram(Counter(), traj) == Counter({1: 2, 0: 1, 2: 1})


def test_an_inflight_switch_inside_a_turn_counts_as_mixed():
    switched = Trajectory("t", (Turn((1,), (2, 3, 4), (-0.5,) * 3, policy_version=9, action_versions=(9, 9, 10)),),
                          RewardResult(0.0), StopReason.EOS)
    m = compute_staleness_metrics([TrajectoryGroup("a", (_traj(10), switched))], 10, max_bucket=1)
    assert m["staleness/mixed_version_frac"] == pytest.approx(0.5)
    assert m["staleness/max"] == 1.0  # the lag is that of the oldest token's version
    with pytest.raises(ValueError, match="versions"):
        Turn((1,), (2, 3), (-0.5, -0.5), action_versions=(9,))
