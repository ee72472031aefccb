"""pass@k / maj@k / best@k / mean@k: hand-computed cases and brute force over all k-subsets."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from tether.eval.passk import (
    best_at_k,
    expected_maj_at_k,
    maj_at_k,
    mean_at_k,
    mean_pass_at_k,
    pass_at_k,
)


# ----------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_cases():
    assert pass_at_k(5, 0, 3) == 0.0  # no correct sample: never passes
    assert pass_at_k(5, 5, 1) == 1.0  # all correct
    assert pass_at_k(5, 3, 3) == 1.0  # n-c=2 < k=3: every 3-subset holds a correct one
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25, abs=1e-12)  # k=1: c/n


def test_pass_at_k_matches_binomials_and_is_stable():
    for n, c, k in [(10, 3, 4), (20, 7, 5), (16, 1, 16), (64, 10, 8)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # C(1000, 500) is ~1e299; the product form stays finite and in [0, 1]
    v = pass_at_k(1000, 1, 500)
    assert v == pytest.approx(0.5, abs=1e-12)


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match="k=6 > n=5"):
        pass_at_k(5, 1, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 1, 0)
    with pytest.raises(TypeError):
        pass_at_k(5.0, 1, 1)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(5, 2), (5, 0), (5, 5)], 2) == pytest.approx((0.7 + 0 + 1) / 3)
    with pytest.raises(ValueError, match="problem 1"):
        mean_pass_at_k([(5, 2), (1, 0)], 2)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


# ----------------------------------------------------------------------------- maj@k


def test_maj_at_k_first_k():
    answers = ["4", "5", "4", "5", "5"]
    flags = [True, False, True, False, False]
    assert maj_at_k(answers, flags, 3) == 1.0  # 4,5,4 -> "4"
    assert maj_at_k(answers, flags, 5) == 0.0  # "5" wins 3-2
    assert maj_at_k(answers, flags, 2) == 1.0  # tie 1-1: first seen ("4")
    assert maj_at_k([None, None, "5"], [False, False, False], 2) == 0.0  # nobody voted
    assert maj_at_k([None, "4", None], [False, True, False], 3) == 1.0  # None does not vote
    with pytest.raises(ValueError, match="both correct and incorrect"):
        maj_at_k(["4", "4"], [True, False], 1)


def _brute_maj(answers, flags, k):
    total = 0.0
    subsets = list(itertools.combinations(range(len(answers)), k))
    for sub in subsets:
        votes = Counter(answers[i] for i in sub if answers[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        ok = {answers[i]: flags[i] for i in sub}
        total += sum(ok[w] for w in winners) / len(winners)  # uniform tie-break
    return total / len(subsets)


def test_expected_maj_at_k_hand_case():
    # answers A(correct) x2, B x1; k=2: subsets AA (A wins), AB x2 (tie: 1/2) -> (1 + 2*0.5)/3
    assert expected_maj_at_k(["A", "A", "B"], [1, 1, 0], 2) == pytest.approx(2 / 3)
    assert expected_maj_at_k(["A", "B", "C"], [1, 0, 0], 1) == pytest.approx(1 / 3)  # k=1: c/n


def test_expected_maj_at_k_matches_brute_force():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 9)
        answers = [rng.choice(["a", "b", "c", None]) for _ in range(n)]
        flags = [a == "a" for a in answers]
        k = rng.randint(1, n)
        assert expected_maj_at_k(answers, flags, k) == pytest.approx(_brute_maj(answers, flags, k), abs=1e-12)


# ----------------------------------------------------------------------------- best@k


def _brute_best(scores, correct, k):
    subsets = list(itertools.combinations(range(len(scores)), k))
    total = 0.0
    for sub in subsets:
        top = max(scores[i] for i in sub)
        best = [i for i in sub if scores[i] == top]
        total += sum(correct[i] for i in best) / len(best)
    return total / len(subsets)


def test_best_at_k_not_biased_low_verl_7240():
    # 1 correct of 4 and it has the best score: the best of all 4 is always the correct one.
    scores, correct = [0.9, 0.1, 0.3, 0.2], [1, 0, 0, 0]
    assert best_at_k(scores, correct, 4) == 1.0
    # k=2: the correct one is in 3 of the 6 pairs, and wins each of them.
    assert best_at_k(scores, correct, 2) == pytest.approx(0.5)
    # a bootstrap (with replacement) of 4 draws contains sample 0 only 1 - (3/4)^4 = 68.4% of
    # the time: the bias PR#7240 reported
    assert 1 - (3 / 4) ** 4 == pytest.approx(0.684, abs=1e-3)


def test_best_at_k_hand_and_brute_force():
    # worst-scored correct sample is only judged when it is alone: k=1 -> 1/3, k>=2 -> 0
    assert best_at_k([0.1, 0.5, 0.9], [1, 0, 0], 1) == pytest.approx(1 / 3)
    assert best_at_k([0.1, 0.5, 0.9], [1, 0, 0], 2) == 0.0
    # ties share their mass: two tied top scores, one correct -> 1/2 at k=n
    assert best_at_k([1.0, 1.0, 0.0], [1, 0, 1], 3) == pytest.approx(0.5)
    rng = random.Random(1)
    for _ in range(30):
        n = rng.randint(1, 8)
        scores = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(n)]
        correct = [rng.random() < 0.4 for _ in range(n)]
        k = rng.randint(1, n)
        assert best_at_k(scores, correct, k) == pytest.approx(_brute_best(scores, correct, k), abs=1e-12)
    with pytest.raises(ValueError):
        best_at_k([0.1, float("nan")], [1, 0], 1)
    with pytest.raises(ValueError):
        best_at_k([0.1], [1], 2)


def test_mean_at_k():
    assert mean_at_k([1.0, 0.0, 0.5, 0.5], 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_at_k([1.0], 2)
