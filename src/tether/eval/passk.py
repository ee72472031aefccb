"""Unbiased sample-based evaluation metrics: pass@k, maj@k, best@k, mean@k.

All estimators take the n samples drawn for ONE problem and return the expected value of the
metric for a uniformly random size-k subset of them (drawn without replacement), i.e. the
quantity that drawing only k samples would estimate, with the variance of using all n.
Bootstrapping subsets *with* replacement is biased low (verl PR#7240: best@4 came out 0.684
instead of 1.0 when 1 of 4 samples was correct and best-scored; docs/design.md, correctness rule 24).

    pass_at_k(n=5, c=2, k=2)                      # 0.7
    mean_pass_at_k([(5, 2), (5, 0)], k=2)         # 0.35
    best_at_k([0.9, 0.1, 0.3, 0.2], [1, 0, 0, 0], k=4)   # 1.0
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from fractions import Fraction
from typing import Hashable, Sequence

import numpy as np


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def _check_k(n: int, k: int, what: str) -> None:
    if k < 1:
        raise ValueError(f"{what}: k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"{what}: k={k} > n={n} samples; draw at least k samples per problem")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, arXiv
    2107.03374 §2.1): 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials
    (C(200, 100) overflows float64 ratios in the naive form). If n - c < k every k-subset
    contains a correct sample, so the value is exactly 1.0. Raises ValueError if k > n.
    """
    n, c, k = _check_int("n", n), _check_int("c", c), _check_int("k", k)
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    _check_k(n, k, "pass_at_k")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of `pass_at_k(n, c, k)` over problems given as (n, c) pairs.

    Problems may have different n; each must have n >= k (ValueError otherwise, naming it).
    """
    if len(counts) == 0:
        raise ValueError("mean_pass_at_k: no problems")
    total = 0.0
    for i, (n, c) in enumerate(counts):
        try:
            total += pass_at_k(n, c, k)
        except ValueError as err:
            raise ValueError(f"problem {i}: {err}") from None
    return total / len(counts)


def _classes(answers: Sequence[Hashable | None], correct_flags: Sequence[bool]) -> dict[Hashable, bool]:
    """answer -> correctness; every copy of one answer must carry the same flag."""
    if len(answers) != len(correct_flags):
        raise ValueError(f"{len(answers)} answers but {len(correct_flags)} correctness flags")
    out: dict[Hashable, bool] = {}
    for a, ok in zip(answers, correct_flags):
        if a is None:
            continue
        if a in out and out[a] != bool(ok):
            raise ValueError(f"answer {a!r} is flagged both correct and incorrect")
        out[a] = bool(ok)
    return out


def maj_at_k(answers: Sequence[Hashable | None], correct_flags: Sequence[bool], k: int) -> float:
    """Majority vote over the FIRST k answers: 1.0 if the most frequent answer is correct.

    This is the deterministic variant (what a deployment drawing k samples would do). Ties go
    to the answer seen first; `None` (no answer extracted) does not vote, and k unparseable
    answers score 0. For the unbiased expectation over all k-subsets use `expected_maj_at_k`.
    """
    k = _check_int("k", k)
    flags = _classes(answers, correct_flags)
    _check_k(len(answers), k, "maj_at_k")
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    winner, _ = votes.most_common(1)[0]  # most_common keeps first-seen order among ties
    return 1.0 if flags[winner] else 0.0


def _ways_others_below(others: Sequence[int], abstain: int, x: int, total: int) -> Fraction:
    """Tie-weighted number of ways to draw `total` items from the other answer classes (sizes
    `others`, each contributing at most x) and the non-voting pool (`abstain`, unconstrained).

    dp[t][j]: ways to draw t items with j other classes drawn exactly x times (tied with the
    target); a j-way tie is won with probability 1/(j+1) (uniform tie-break).
    """
    dp = [[0] * (len(others) + 1) for _ in range(total + 1)]
    dp[0][0] = 1
    for m in others:
        new = [[0] * (len(others) + 1) for _ in range(total + 1)]
        for t in range(total + 1):
            for j, ways in enumerate(dp[t]):
                if ways:
                    for y in range(min(m, x, total - t) + 1):
                        new[t + y][j + (y == x)] += ways * math.comb(m, y)
        dp = new
    return sum((Fraction(w * math.comb(abstain, total - t), j + 1)
                for t in range(total + 1) for j, w in enumerate(dp[t]) if w), Fraction(0))


def expected_maj_at_k(answers: Sequence[Hashable | None], correct_flags: Sequence[bool], k: int) -> float:
    """Exact expected maj@k over all C(n, k) subsets (ties broken uniformly at random).

    Unbiased counterpart of `maj_at_k`: for each correct answer class a and each count x it
    could get in the subset, count the subsets where every other class gets <= x votes,
    weighting a j-way tie by 1/(j+1). Exact rational arithmetic; cost is polynomial
    (classes^2 * k^3 per correct class), fine for the usual n <= a few hundred.
    """
    k = _check_int("k", k)
    flags = _classes(answers, correct_flags)
    n = len(answers)
    _check_k(n, k, "expected_maj_at_k")
    sizes = Counter(a for a in answers if a is not None)
    abstain = n - sum(sizes.values())
    total = Fraction(0)
    for target, ok in flags.items():
        if not ok:
            continue
        m_a = sizes[target]
        others = [m for a, m in sizes.items() if a != target]
        for x in range(1, min(m_a, k) + 1):
            total += math.comb(m_a, x) * _ways_others_below(others, abstain, x, k - x)
    return float(total / math.comb(n, k))


def best_at_k(scores: Sequence[float], correct: Sequence[float], k: int) -> float:
    """Expected correctness of the best-scored sample among a random k-subset (no replacement).

    Sort by score (descending); the sample at rank i is the subset's best iff it is drawn and
    the other k-1 come from the n-1-i lower-ranked ones: P_i = C(n-1-i, k-1) / C(n, k). Equal
    scores are broken uniformly at random, so a tie block shares its probability mass evenly.
    `correct` may be 0/1 flags or graded values in [0, 1] (then this is the expected value).
    Example (verl PR#7240): 1 correct of 4, best-scored, k=4 -> 1.0 (a bootstrap gives 0.684).
    """
    k = _check_int("k", k)
    n = len(scores)
    if len(correct) != n:
        raise ValueError(f"best_at_k: {n} scores but {len(correct)} correctness values")
    _check_k(n, k, "best_at_k")
    if not all(math.isfinite(float(s)) for s in scores):
        raise ValueError("best_at_k: scores must be finite (a NaN score has no rank)")
    order = sorted(range(n), key=lambda i: -float(scores[i]))
    denom = math.comb(n, k)
    result, rank = 0.0, 0
    while rank < n:
        end = rank
        while end < n and float(scores[order[end]]) == float(scores[order[rank]]):
            end += 1
        mass = sum(math.comb(n - 1 - r, k - 1) for r in range(rank, end)) / denom
        block_mean = sum(float(correct[order[r]]) for r in range(rank, end)) / (end - rank)
        result += mass * block_mean
        rank = end
    return result


def mean_at_k(values: Sequence[float], k: int) -> float:
    """Expected mean of k samples drawn without replacement = the mean of all n.

    Identical for every k <= n (the estimator's variance, not its value, depends on k); k is
    validated so that mean@k is reported only where pass@k/best@k would be.
    """
    k = _check_int("k", k)
    _check_k(len(values), k, "mean_at_k")
    return float(sum(float(v) for v in values) / len(values))
