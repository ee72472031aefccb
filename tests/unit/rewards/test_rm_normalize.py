"""The reward model's `winrate` normalisation: each sample's Bradley–Terry win rate against the
other samples of its prompt (SPPO's reward, arXiv 2405.00675), by hand."""

from __future__ import annotations

import math

import pytest

from tether.rewards.rm import compute_win_rates


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_win_rates_by_hand():
    # prompt "a": scores 2, 0, 0 ; prompt "b": 5 alone
    got = compute_win_rates([2.0, 0.0, 5.0, 0.0], ["a", "a", "b", "a"])
    assert got[0] == pytest.approx(_sig(2.0))  # beats both zeros with P = sigmoid(2)
    assert got[1] == pytest.approx((_sig(-2.0) + 0.5) / 2) == pytest.approx(got[3])
    assert got[2] == 0.5  # alone: no sibling to compare with


def test_win_rates_ignore_a_per_prompt_offset_and_average_one_half():
    a = compute_win_rates([1.0, -3.0, 0.5, 2.0], ["p"] * 4)
    b = compute_win_rates([101.0, 97.0, 100.5, 102.0], ["p"] * 4)  # the same scores + 100
    assert a == pytest.approx(b)
    assert sum(a) / 4 == pytest.approx(0.5)  # sigmoid(d) + sigmoid(-d) = 1: a group's mean win rate is 1/2
    assert a.index(max(a)) == 3 and a.index(min(a)) == 1  # the order of the scores is kept
