"""Test-time-scaling curves and best@k selectors: hand cases, consistency with the estimators."""

from __future__ import annotations

import pytest

from tether.config import RewardConfig
from tether.eval.passk import expected_maj_at_k, mean_pass_at_k
from tether.eval.runner import compute_pred, compute_selector_scores, make_eval_problems
from tether.eval.tts import (
    ProblemSamples,
    compute_curve_ks,
    compute_pass_rates,
    compute_power_of_two_metrics,
    compute_tts_curves,
    make_problem_samples,
)
from tether.types import RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn


def _p(tid, correct, answers, scores=None, rewards=None):
    n = len(correct)
    return ProblemSamples(tid, tuple(map(float, correct)), tuple(answers), tuple(scores or [0.0] * n),
                          tuple(rewards if rewards is not None else map(float, correct)))


def test_curve_ks():
    assert compute_curve_ks(1) == [1]
    assert compute_curve_ks(5) == [1, 2, 3, 4, 5]
    assert compute_curve_ks(16) == list(range(1, 17))
    assert compute_curve_ks(100) == list(range(1, 17)) + [32, 64, 100]
    assert compute_curve_ks(64) == list(range(1, 17)) + [32, 64]
    with pytest.raises(ValueError):
        compute_curve_ks(0)


def test_hand_computed_curves():
    # p0: 1 correct of 4, and it is the best-scored sample -> best@4 = 1 (not 0.684, verl PR#7240)
    # p1: answers 7,7,8,None; 7 correct (2 votes) -> maj@1 = 2/4 (None abstains, scores 0)
    p0 = _p("p0", [1, 0, 0, 0], ["4", "5", "5", "6"], scores=[0.9, 0.1, 0.3, 0.2])
    p1 = _p("p1", [1, 1, 0, 0], ["7", "7", "8", None], scores=[0.0, 0.0, 0.5, 0.6])
    curves = compute_tts_curves([p0, p1], [1, 2, 4])
    assert curves["pass@k"][1] == pytest.approx((0.25 + 0.5) / 2)
    assert curves["pass@k"][4] == pytest.approx(1.0)
    assert curves["best@k"][4] == pytest.approx((1.0 + 0.0) / 2)  # p1's best-scored sample is wrong
    # best@1 is the mean correctness (a single sample is its own best)
    assert curves["best@k"][1] == pytest.approx(curves["pass@k"][1])
    assert curves["maj@k"][1] == pytest.approx((0.25 + 0.5) / 2)
    # k=4 uses every sample: p0 votes 5 (wrong, 2 of 4); p1 votes 7 (correct)
    assert curves["maj@k"][4] == pytest.approx(0.5)
    assert curves["mean@k"][2] == pytest.approx((0.25 + 0.5) / 2)


def test_curves_agree_with_estimators():
    probs = [_p("a", [1, 0, 1, 0, 0, 1], list("xyxzzx")), _p("b", [0] * 6, list("qqrrss")),
             _p("c", [1] * 6, ["k"] * 6)]
    curves = compute_tts_curves(probs)
    assert sorted(curves["pass@k"]) == [1, 2, 3, 4, 5, 6]
    for k in range(1, 7):
        assert curves["pass@k"][k] == pytest.approx(mean_pass_at_k([(6, 3), (6, 0), (6, 6)], k))
        exp = sum(expected_maj_at_k([(a, c >= 0.5) for a, c in zip(p.answers, p.correct)],
                                    [c >= 0.5 for c in p.correct], k) for p in probs) / 3
        assert curves["maj@k"][k] == pytest.approx(exp)
    assert all(curves["pass@k"][k] <= curves["pass@k"][k + 1] + 1e-12 for k in range(1, 6))


def test_conflicting_verdicts_on_one_answer_vote_separately():
    # the verifier judged "5" correct once and wrong once (it looks at more than the answer)
    p = _p("p", [1, 0, 0], ["5", "5", "6"])
    assert compute_tts_curves([p], [3])["maj@k"][3] == pytest.approx(1 / 3)  # 3-way tie


def test_too_few_samples_names_the_problem():
    with pytest.raises(ValueError, match="short"):
        compute_tts_curves([_p("ok", [1, 0, 1], "abc"), _p("short", [1], "a")], [2])
    with pytest.raises(ValueError):
        ProblemSamples("x", (1.0,), ("a", "b"), (0.0,), (1.0,))


def test_power_of_two_metric_keys():
    curves = compute_tts_curves([_p("a", [1, 0, 1, 0, 0, 1], list("xyxzzx"))])
    m = compute_power_of_two_metrics(curves)
    assert set(m) == {f"eval/{n}@{k}" for n in ("pass", "maj", "best") for k in (1, 2, 4)}


def test_rows_roundtrip_and_fallbacks():
    rows = [{"task_id": "t1", "correct": True, "pred": "3", "score": 0.5, "reward": 1.0},
            {"task_id": "t1", "correct": False, "pred": None, "score": None, "reward": 0.0},
            {"task_id": "t2", "correct": None, "completion": "  9 ", "reward": float("nan")}]
    probs = make_problem_samples(rows)
    assert [p.task_id for p in probs] == ["t1", "t2"]
    assert probs[0].answers == ("3", None) and probs[0].scores == (0.5, 0.0)  # missing score -> the reward
    assert probs[1].answers == ("9",) and probs[1].correct == (0.0,) and probs[1].rewards == (0.0,)
    assert compute_pass_rates(probs) == {"t1": 0.5, "t2": 0.0}


def test_compute_pred():
    assert compute_pred("so <answer>42</answer>") == "42"
    assert compute_pred(" 17 ") == "17"
    assert compute_pred("") is None and compute_pred(None) is None and compute_pred("   ") is None


def _group(texts, correct, logps, task=None):
    trajs = tuple(
        Trajectory("t", (Turn((1,), tuple(range(len(lp))), tuple(lp)),), RewardResult(float(c), {}, correct=bool(c)),
                   StopReason.EOS, {"text": t})
        for t, c, lp in zip(texts, correct, logps))
    return TrajectoryGroup("t", trajs, task or {"prompt": "q", "answer": "b"})


def test_selectors():
    g = _group(["a", "b", "c"], [0, 1, 0], [[-0.1, -0.1], [-2.0], []])
    cfg = RewardConfig(isolation="inline")
    assert compute_selector_scores([g], "verifier", cfg) == [[0.0, 1.0, 0.0]]
    assert compute_selector_scores([g], "reward", cfg) == [[0.0, 1.0, 0.0]]
    # mean token log-prob; a sample with no tokens has no confidence and ranks last
    assert compute_selector_scores([g], "logprob", cfg) == [[pytest.approx(-0.1), -2.0, pytest.approx(-3.0)]]
    # any reward function scores the text (here the registry's exact_match against the gold "b")
    assert compute_selector_scores([g], "exact_match", cfg) == [[0.0, 1.0, 0.0]]
    probs = make_eval_problems([g], [[0.0, 1.0, 0.0]])
    assert compute_tts_curves(probs, [3])["best@k"][3] == 1.0


def test_unknown_selector_lists_valid_names():
    g = _group(["a"], [1], [[-0.1]])
    with pytest.raises(Exception, match="exact_match"):
        compute_selector_scores([g], "no_such_scorer", RewardConfig(isolation="inline"))
