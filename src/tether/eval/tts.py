"""Test-time scaling: pass@k, maj@k, best@k and mean@k curves for k = 1..K over many problems.

Each problem contributes the n samples drawn for it; every curve point is the exact expectation
over the size-k subsets of those n samples (the estimators of `tether.eval.passk`), averaged
over problems. One sample set therefore yields the whole curve, with no resampling noise:

    pass@k   some sample of k is correct (Chen et al. 2021, arXiv 2107.03374 §2.1)
    maj@k    the most frequent extracted answer among k is correct (self-consistency,
             Wang et al. 2022, arXiv 2203.11171)
    best@k   the sample a selector scores highest among k is correct (best-of-k /
             verifier reranking; DeepSWE: 42.2% pass@1 -> 59% Best@16)
    mean@k   mean reward of k samples (k-independent in expectation; reported for completeness)

pass@k rising with k while pass@1 stays put means the model *can* solve a problem but does not
prefer the answer: RL that lifts pass@1 and leaves large-k pass@k flat is sharpening (an
amplifier); RL that lifts large-k pass@k found new solutions (Yue et al. 2025, arXiv 2504.13837).

    probs = [ProblemSamples("p0", correct=(1, 0, 0, 0), answers=("4", "5", "5", None),
                            scores=(0.9, 0.1, 0.3, 0.2), rewards=(1, 0, 0, 0))]
    compute_tts_curves(probs, [1, 2, 4])["best@k"][4]      # 1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from tether.eval.passk import best_at_k, expected_maj_at_k, mean_at_k, pass_at_k

CURVES = ("pass@k", "maj@k", "best@k", "mean@k")


@dataclass(frozen=True)
class ProblemSamples:
    """The n samples of one problem: correctness (0/1), extracted answers (None: no answer),
    selector scores (higher is better) and rewards, all of length n."""

    task_id: str
    correct: tuple[float, ...]
    answers: tuple[Hashable | None, ...]
    scores: tuple[float, ...]
    rewards: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.correct)
        for name in ("answers", "scores", "rewards"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"problem {self.task_id}: {n} correctness flags but {len(getattr(self, name))} {name}")

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def num_correct(self) -> int:
        return sum(1 for c in self.correct if c >= 0.5)


def compute_curve_ks(k_max: int, dense_until: int = 16) -> list[int]:
    """k values for a curve: every k up to `dense_until`, then powers of two, then k_max itself."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    ks = list(range(1, min(k_max, dense_until) + 1))
    k = 32
    while k < k_max:
        if k > ks[-1]:
            ks.append(k)
        k *= 2
    if ks[-1] != k_max:
        ks.append(k_max)
    return ks


def _vote_keys(p: ProblemSamples) -> list[Hashable | None]:
    """maj@k votes on the extracted answer. If one answer string is judged both correct and
    incorrect (the verifier looks at more than the answer), its two verdicts vote separately."""
    return [None if a is None else (a, c >= 0.5) for a, c in zip(p.answers, p.correct)]


def compute_problem_point(p: ProblemSamples, k: int) -> dict[str, float]:
    """pass@k, maj@k, best@k and mean@k of one problem at one k (k <= n)."""
    flags = [c >= 0.5 for c in p.correct]
    return {
        "pass@k": pass_at_k(p.n, p.num_correct, k),
        "maj@k": expected_maj_at_k(_vote_keys(p), flags, k),
        "best@k": best_at_k(list(p.scores), [float(c) for c in p.correct], k),
        "mean@k": mean_at_k(list(p.rewards), k),
    }


def compute_tts_curves(problems: Sequence[ProblemSamples], ks: Iterable[int] | None = None) -> dict[str, dict[int, float]]:
    """{curve name: {k: mean over problems}} for `CURVES`; default ks: `compute_curve_ks(min n)`.

    Every problem needs n >= max(ks) (ValueError otherwise, naming the problem).
    """
    if not problems:
        raise ValueError("compute_tts_curves: no problems")
    n_min = min(p.n for p in problems)
    ks = sorted(set(ks)) if ks is not None else compute_curve_ks(n_min)
    if ks and ks[-1] > n_min:
        short = next(p for p in problems if p.n < ks[-1])
        raise ValueError(f"problem {short.task_id} has n={short.n} samples < k={ks[-1]}")
    curves: dict[str, dict[int, float]] = {name: {} for name in CURVES}
    for k in ks:
        total = dict.fromkeys(CURVES, 0.0)
        for p in problems:
            for name, v in compute_problem_point(p, k).items():
                total[name] += v
        for name in CURVES:
            curves[name][k] = total[name] / len(problems)
    return curves


def compute_power_of_two_metrics(curves: Mapping[str, Mapping[int, float]], prefix: str = "eval/") -> dict[str, float]:
    """Flat metrics for metrics.jsonl: `eval/{pass,maj,best}@k` at k = 1, 2, 4, ... (<= K)."""
    out: dict[str, float] = {}
    for name in ("pass@k", "maj@k", "best@k"):
        for k, v in curves.get(name, {}).items():
            if k & (k - 1) == 0:
                out[f"{prefix}{name[:-1]}{k}"] = float(v)
    return out


def compute_pass_rates(problems: Sequence[ProblemSamples]) -> dict[str, float]:
    """task_id -> fraction of its samples that are correct."""
    return {p.task_id: p.num_correct / p.n for p in problems if p.n}


def make_problem_samples(rows: Sequence[Mapping[str, Any]]) -> list[ProblemSamples]:
    """Group per-sample rows (`samples/eval_*.jsonl.gz`: task_id, correct, pred, score, reward)
    into ProblemSamples, in order of first appearance. Rows written before `pred`/`score`
    existed fall back to the stripped completion and the reward."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(str(r.get("task_id")), []).append(r)
    out = []
    for tid, rs in by_task.items():
        def num(x: Any, default: float = 0.0) -> float:
            try:
                v = float(x)
            except (TypeError, ValueError):
                return default
            return v if math.isfinite(v) else default

        answers = []
        for r in rs:
            a = r.get("pred")
            if a is None and "pred" not in r and isinstance(r.get("completion"), str):
                a = r["completion"].strip() or None
            answers.append(a)
        rewards = tuple(num(r.get("reward")) for r in rs)
        out.append(ProblemSamples(
            task_id=tid, correct=tuple(1.0 if r.get("correct") else 0.0 for r in rs), answers=tuple(answers),
            scores=tuple(num(r.get("score"), rw) for r, rw in zip(rs, rewards)), rewards=rewards))
    return out
