"""compute_rollout_stats: lengths split by verified correctness (Dr. GRPO's wrong-answer length)."""

from tether.rollout.stats import compute_rollout_stats
from tether.types import Outcome, RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn


def _traj(n_tokens: int, correct: bool | None) -> Trajectory:
    turn = Turn(context_ids=(1, 2), action_ids=tuple(range(3, 3 + n_tokens)), action_logprobs=(-0.5,) * n_tokens)
    reward = RewardResult(float(bool(correct)), {}, Outcome.OK, correct)
    return Trajectory("t", (turn,), reward, StopReason.EOS)


def test_wrong_and_correct_lengths_are_averaged_separately():
    groups = [TrajectoryGroup("a", (_traj(2, True), _traj(10, False))),
              TrajectoryGroup("b", (_traj(4, True), _traj(6, False), _traj(9, None)))]
    stats = compute_rollout_stats(groups)
    assert stats["response_length/correct_mean"] == 3.0  # (2 + 4) / 2
    assert stats["response_length/wrong_mean"] == 8.0  # (10 + 6) / 2; the unverified 9 is in neither
    assert stats["response_length/mean"] == (2 + 10 + 4 + 6 + 9) / 5


def test_a_step_without_wrong_answers_has_no_wrong_length():
    stats = compute_rollout_stats([TrajectoryGroup("a", (_traj(5, True), _traj(7, True)))])
    assert "response_length/wrong_mean" not in stats
    assert stats["response_length/correct_mean"] == 6.0
    unverified = compute_rollout_stats([TrajectoryGroup("a", (_traj(5, None),))])
    assert not any(k.startswith("response_length/") and k.endswith(("correct_mean", "wrong_mean")) for k in unverified)
