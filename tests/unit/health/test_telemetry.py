"""Per-step health telemetry from trajectories, the advantage alignment signal, and History."""

from __future__ import annotations

import math

import pytest
import torch

from tether.health.telemetry import History, compute_advantage_alignment, compute_baseline, compute_trajectory_stats
from health_helpers import make_group


def test_reward_correctness_agreement_and_paid_wrong():
    good = make_group("a", (1, 2), [1.0, 0.0, 1.0, 0.0], [True, False, True, False])
    s = compute_trajectory_stats([good])
    assert s["health/reward_correct_auc"] == 1.0
    assert s["health/reward_incorrect_mean"] == 0.0 and s["health/reward_correct_mean"] == 1.0
    # a loophole pays one incorrect sample like a correct one: 2 of 4 pairs tie -> auc 0.75
    hacked = make_group("a", (1, 2), [1.0, 1.0, 1.0, 0.0], [True, False, True, False])
    s = compute_trajectory_stats([hacked])
    assert s["health/reward_correct_auc"] == 0.75
    assert s["health/reward_incorrect_mean"] == 0.5


def test_no_mixed_group_gives_nan_auc():
    s = compute_trajectory_stats([make_group("a", (1,), [1.0, 1.0], [True, True])])
    assert math.isnan(s["health/reward_correct_auc"]) and math.isnan(s["health/reward_incorrect_mean"])


def test_group_integrity_diversity_versions_and_repeats():
    g1 = make_group("a", (1, 2, 3), [1.0, 0.0], [True, False], responses=[(5, 2), (5, 2)], version=7)
    g2 = make_group("b", (4, 5), [0.0, 0.0], [False, False], version=7)
    mixed = g2.__class__("c", (g1.trajectories[0], g2.trajectories[0]), {})
    s = compute_trajectory_stats([g1, g2, mixed], prev_task_ids=["b"])
    assert s["health/group_mixed_frac"] == 1 / 3
    assert s["health/distinct_frac"] == (0.5 + 1.0 + 1.0) / 3
    assert s["health/rollout_version_min"] == 7.0
    assert s["health/task_repeat_frac"] == 1 / 3
    assert s["health/all_wrong_groups"] == 1 / 3
    assert s["health/prompt_len_mean"] == (3 + 2 + 3) / 3


def test_repetition():
    g = make_group("a", (1,), [0.0], [False], responses=[(7, 8, 7, 8, 7, 8, 7, 8)])
    assert compute_trajectory_stats([g])["health/repetition"] > 0.5


def _grpo_like():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    mean = torch.tensor([1 / 3, 2 / 3])[group]
    adv = (scores - mean)[:, None].expand(6, 4).clone()
    mask = torch.ones(6, 4)
    mask[:, 0] = 0
    return adv * mask, scores, mask, group


def test_advantage_alignment_detects_sign_flip():
    adv, scores, mask, group = _grpo_like()
    assert compute_advantage_alignment(adv, scores, mask, group)["advantage/score_corr"] > 0.999
    assert compute_advantage_alignment(-adv, scores, mask, group)["advantage/score_corr"] < -0.999
    zero = compute_advantage_alignment(torch.zeros_like(adv), scores, mask, group)
    assert math.isnan(zero["advantage/score_corr"])


def test_baseline_is_robust_and_floored():
    b = compute_baseline([1.0, 1.0, 1.0, 1.0, 100.0])
    assert b.median == 1.0 and b.scale == 0.05  # MAD 0 -> floor 5% of the median
    assert compute_baseline([]) is None


def test_history_baseline_window_exclusion_and_rebase():
    h = History(skip=1, window=4, rebase_every=10, lag=5)
    for s in range(1, 6):
        h.add(s, {"x": float(s)})
    assert h.ready and h.baseline_steps == [2, 3, 4, 5]
    assert h.baseline("x").median == 3.5
    h.exclude([3])
    assert not h.ready
    h.add(6, {"x": 6.0})
    assert h.baseline_steps == [2, 4, 5, 6]
    for s in range(7, 21):
        h.add(s, {"x": float(s)})
    assert h.baseline_steps == [12, 13, 14, 15]  # re-anchored at step 20 on healthy steps >= lag old
    assert h.values("x", 2) == [19.0, 20.0]


def test_advantage_alignment_is_one_for_grpo_on_a_continuous_reward_of_any_spread():
    """GRPO divides each group by its own std: a group whose scores differ by 0.01 gets the same
    unit advantages as one whose scores differ by 1. Within each group the advantages follow the
    score exactly, so the alignment is 1 (pooled over the batch: 0.88); one group's advantages
    reversed (a sign bug in one of two groups) averages to 0."""
    scores = torch.tensor([0.0, 0.01, 0.004, 0.3, 1.0, 0.2, 0.0, 0.9])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    mean_G = torch.stack([scores[group == i].mean() for i in (0, 1)])
    std_G = torch.stack([scores[group == i].std() for i in (0, 1)])
    adv = ((scores - mean_G[group]) / (std_G[group] + 1e-6))[:, None].expand(8, 3).clone()
    mask = torch.ones(8, 3)
    assert compute_advantage_alignment(adv, scores, mask, group)["advantage/score_corr"] == pytest.approx(1.0, abs=1e-6)
    pooled = torch.corrcoef(torch.stack([adv[:, 0], scores - mean_G[group]]))[0, 1]
    assert pooled < 0.9  # 0.88: what the pooled correlation made of the same healthy advantages
    flipped = adv.clone()
    flipped[group == 1] *= -1
    assert compute_advantage_alignment(flipped, scores, mask, group)["advantage/score_corr"] == pytest.approx(0.0, abs=1e-6)
