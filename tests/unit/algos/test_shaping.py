"""Reward shaping: DAPO overlong penalty, Kimi k1.5 length reward, gamma-decayed step rewards."""

from __future__ import annotations

import random

import pytest
import torch

from tether.algos import compute_gamma_decayed_rewards, compute_length_reward, compute_overlong_penalty


def test_overlong_penalty_hand_values():
    # max_len 20, cache 4 -> L_exp 16
    # 10 -> 0; 16 -> 0; 18 -> (16-18)/4 = -0.5; 20 -> -1; 25 (past max) -> -1 (paper floor)
    got = compute_overlong_penalty(torch.tensor([10, 16, 18, 20, 25]), max_len=20, cache_len=4)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    half = compute_overlong_penalty(torch.tensor([18, 25]), max_len=20, cache_len=4, factor=0.5)
    assert half.tolist() == pytest.approx([-0.25, -0.5])


def test_overlong_penalty_matches_loop():
    rng = random.Random(0)
    lengths = [rng.randint(0, 40) for _ in range(50)]
    got = compute_overlong_penalty(torch.tensor(lengths), max_len=32, cache_len=8, factor=0.7).tolist()
    for n, g in zip(lengths, got):
        if n <= 24:
            expected = 0.0
        elif n <= 32:
            expected = (24 - n) / 8
        else:
            expected = -1.0
        assert g == pytest.approx(0.7 * expected)


def test_overlong_penalty_rejects_bad_cache():
    with pytest.raises(ValueError):
        compute_overlong_penalty(torch.tensor([1]), max_len=4, cache_len=8)


def test_length_reward_hand_values():
    # lengths [100, 200, 300]: min 100, max 300 -> lambda = 0.5 - (len-100)/200 = [0.5, 0, -0.5]
    # correct [T, F, F] -> [0.5, min(0, 0) = 0, min(0, -0.5) = -0.5]
    got = compute_length_reward(torch.tensor([100, 200, 300]), torch.tensor([True, False, False]))
    assert got.tolist() == pytest.approx([0.5, 0.0, -0.5])
    # correct [F, T, T] -> [min(0, 0.5) = 0 (short wrong answers are not rewarded), 0, -0.5]
    got = compute_length_reward(torch.tensor([100, 200, 300]), torch.tensor([False, True, True]))
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.5])


def test_length_reward_all_equal_lengths_is_zero():
    got = compute_length_reward(torch.tensor([7, 7, 7]), torch.tensor([True, False, True]))
    assert got.tolist() == [0.0, 0.0, 0.0]


def test_length_reward_matches_loop():
    rng = random.Random(1)
    lengths = [rng.randint(1, 500) for _ in range(16)]
    correct = [rng.random() < 0.5 for _ in range(16)]
    got = compute_length_reward(torch.tensor(lengths), torch.tensor(correct)).tolist()
    lo, hi = min(lengths), max(lengths)
    for n, c, g in zip(lengths, correct, got):
        lam = 0.5 - (n - lo) / (hi - lo)
        assert g == pytest.approx(lam if c else min(0.0, lam), abs=1e-6)


def test_gamma_decayed_rewards_hand_values():
    # T = 3, gamma 0.5, r = 1: step i gets r * gamma^(T-i) = [0.25, 0.5, 1]
    assert compute_gamma_decayed_rewards(1.0, 3, 0.5).tolist() == [0.25, 0.5, 1.0]
    # r = -2, T = 2, gamma 0.9 -> [-1.8, -2]
    assert compute_gamma_decayed_rewards(-2.0, 2, 0.9).tolist() == pytest.approx([-1.8, -2.0])
    assert compute_gamma_decayed_rewards(1.0, 0, 0.9).numel() == 0
    with pytest.raises(ValueError):
        compute_gamma_decayed_rewards(1.0, 3, 0.0)
