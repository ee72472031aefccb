"""Per-step statistics of a rollout's groups (any rollout kind)."""

from __future__ import annotations

from typing import Sequence

from tether.types import TrajectoryGroup


def compute_rollout_stats(groups: Sequence[TrajectoryGroup], tol: float = 1e-6) -> dict[str, float]:
    """Response length, truncation rate and zero-variance-group fraction of a step's rollouts.

    With verified correctness, also the mean length of the correct and of the wrong responses
    (`response_length/correct_mean`, `response_length/wrong_mean`; absent when a step has none of
    that kind): Dr. GRPO (arXiv:2503.20783) shows GRPO's per-sequence length normalisation makes
    wrong answers grow longer, which the overall mean hides."""
    lengths = [t.num_action_tokens for g in groups for t in g.trajectories]
    truncated = [t.stop.truncated for g in groups for t in g.trajectories]
    zero_var = [max(g.rewards_G) - min(g.rewards_G) <= tol for g in groups if g.trajectories]
    correct = [t.reward.correct for g in groups for t in g.trajectories if t.reward.correct is not None]
    out = {
        "response_length/mean": sum(lengths) / max(len(lengths), 1),
        "response_length/max": float(max(lengths, default=0)),
        "response_length/min": float(min(lengths, default=0)),
        "truncation_rate": sum(truncated) / max(len(truncated), 1),
        "frac_zero_variance_groups": sum(zero_var) / max(len(zero_var), 1),
    }
    if correct:
        out["accuracy"] = sum(bool(c) for c in correct) / len(correct)
    for name, want in (("correct_mean", True), ("wrong_mean", False)):
        lens = [t.num_action_tokens for g in groups for t in g.trajectories
                if t.reward.correct is not None and bool(t.reward.correct) is want]
        if lens:
            out[f"response_length/{name}"] = sum(lens) / len(lens)
    return out
