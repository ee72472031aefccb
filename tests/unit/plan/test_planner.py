"""The compute planner: classes, the beta-binomial signal model, and the allocation rule."""

from __future__ import annotations

import numpy as np
import pytest

from tether.plan.pilot import PilotResult
from tether.plan.planner import (
    PlanConstraints,
    compute_classes,
    compute_informative_fraction,
    compute_intra_class_correlation,
    compute_signal_n,
    compute_signal_value,
    fit_beta_binomial,
    format_plan,
    recommend_allocation,
)


def _counts(rates, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return [(n, int(rng.binomial(n, p))) for p in rates]


def test_classes():
    c = compute_classes([(16, 0), (16, 3), (16, 4), (16, 12), (16, 13), (16, 16)])
    assert c == pytest.approx({"unsolved": 1 / 6, "hard": 1 / 6, "medium": 2 / 6, "easy": 2 / 6})
    with pytest.raises(ValueError):
        compute_classes([(4, 5)])


def test_beta_binomial_recovers_parameters():
    rng = np.random.default_rng(0)
    counts = _counts(rng.beta(0.8, 3.0, size=3000))
    a, b = fit_beta_binomial(counts)
    assert a == pytest.approx(0.8, rel=0.15) and b == pytest.approx(3.0, rel=0.15)


def test_informative_fraction_matches_monte_carlo():
    rng = np.random.default_rng(1)
    p = rng.beta(0.5, 2.0, size=200_000)
    for n in (2, 8, 32):
        mc = float(np.mean(1 - p**n - (1 - p) ** n))
        assert compute_informative_fraction((0.5, 2.0), n) == pytest.approx(mc, abs=5e-3)
    # n=2: 2 E[p(1-p)] = 2 ab / ((a+b)(a+b+1))
    assert compute_informative_fraction((1.0, 1.0), 2) == pytest.approx(1 / 3)


def test_signal_n_depends_on_the_pass_rate_distribution():
    k = PlanConstraints()
    medium = compute_signal_n((20.0, 20.0), k)  # everything near 0.5: small groups are already mixed
    assert medium <= 4
    assert compute_signal_n((5.0, 45.0), k) >= 4 * medium  # all hard (p ~ 0.1): coverage needs large groups
    assert compute_signal_n((45.0, 5.0), k) >= 4 * medium  # all easy: failures are rare too (sharpening)
    # same mean pass rate, but spread across problems: rollouts of one problem correlate
    # (rho = 1/(a+b+1)), so more problems beat more rollouts of each
    assert compute_intra_class_correlation((0.5, 4.5)) == pytest.approx(1 / 6)
    assert compute_signal_n((0.5, 4.5), k) < compute_signal_n((5.0, 45.0), k)
    assert compute_signal_value((5.0, 45.0), 8) > compute_signal_value((0.5, 4.5), 8)


def test_n_star_grows_with_budget_then_saturates():
    counts = _counts(np.random.default_rng(2).beta(3.0, 17.0, size=64))
    ns, bps, ms = [], [], []
    for budget in (256, 1024, 4096, 16384, 65536, 262144):
        plan = recommend_allocation(counts, budget)
        assert plan.used_rollouts == plan.n * plan.problems_per_step * plan.steps <= budget
        ns.append(plan.n)
        bps.append(plan.problems_per_step)
        ms.append(plan.steps)
    assert ns == sorted(ns) and ns[-1] >= 4 * ns[0]
    sat = compute_signal_n(fit_beta_binomial(counts), PlanConstraints())
    assert ns[-3:] == [sat] * 3  # saturated at the signal n ...
    assert all(m >= 100 for m in ms[2:])  # ... every affordable plan keeps the step floor ...
    assert bps[-1] > bps[-3]  # ... and past max_useful_steps compute goes into the batch


def test_batch_reaches_target_informative_groups_before_n_grows():
    counts = _counts(np.random.default_rng(4).beta(3.0, 17.0, size=64))
    beta = fit_beta_binomial(counts)
    plan = recommend_allocation(counts, 16384)
    steps = plan.trace
    first_n = next(i for i, t in enumerate(steps) if t["why"].startswith("double n"))
    assert first_n > 1 and all(t["why"].startswith("double B_p") for t in steps[1:first_n])
    before = steps[first_n - 1]
    assert before["problems_per_step"] * compute_informative_fraction(beta, before["n"]) >= 4.0
    # doubling n keeps the informative groups per step (the batch shrinks only as groups get richer)
    assert plan.problems_per_step * plan.informative_fraction >= 4.0


def test_small_budget_protects_steps_and_warns():
    counts = _counts([0.5] * 32)
    plan = recommend_allocation(counts, 300)
    assert (plan.n, plan.problems_per_step) == (2, 4) and plan.steps == 37
    assert any("warning" in line for line in plan.explanation)
    with pytest.raises(ValueError):
        recommend_allocation(counts, 0)


def test_huge_budget_goes_into_batch_after_the_step_cap():
    plan = recommend_allocation(_counts([0.5] * 32), 10**7, PlanConstraints(max_useful_steps=400))
    assert plan.steps <= 800 and plan.problems_per_step > 4
    assert any("B_p" in t["why"] for t in plan.trace)


def test_regimes_and_explanations():
    hard = recommend_allocation([(16, 0)] * 30 + [(16, 1)] * 30 + [(16, 8)] * 4, 4096)
    easy = recommend_allocation([(16, 16)] * 30 + [(16, 15)] * 30 + [(16, 8)] * 4, 4096)
    assert hard.regime == "coverage" and easy.regime == "sharpening"
    assert any("dynamic sampling" in line for line in hard.explanation)  # many unsolved problems
    assert any("saturated" in line for line in easy.explanation)
    text = format_plan(hard)
    assert "recommended: n=" in text and "rollout.n=" in text
    js = hard.to_json()
    assert js["overrides"] == hard.overrides and js["classes"]["unsolved"] == pytest.approx(30 / 64)


def test_constraints_are_respected():
    k = PlanConstraints(min_steps=10, n_max=8, bp_min=16)
    plan = recommend_allocation(_counts(np.random.default_rng(3).beta(0.3, 3.0, size=64)), 10**6, k)
    assert plan.n <= 8 and plan.problems_per_step >= 16


def test_pilot_json_roundtrip(tmp_path):
    p = PilotResult(("a", "b"), ((16, 3), (16, 0)), 5.5, 7.0, model="m")
    path = tmp_path / "pilot.json"
    path.write_text(__import__("json").dumps(p.to_json()))
    q = PilotResult.load(path)
    assert q == p and q.pass_rates == {"a": 3 / 16, "b": 0.0}
