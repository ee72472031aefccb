"""Compute planning: from pilot pass rates to rollouts per problem n, problems per step B_p and
update steps M for a sampling budget C = B_p * n * M (IsoCompute Playbook, arXiv 2603.12151).

The pilot (`tether.plan.pilot`) draws a few rollouts per problem from the starting checkpoint;
here its per-problem success counts become

1. classes: unsolved (no success), hard (pass rate < 0.25), medium, easy (> 0.75);
2. a beta-binomial model of the pass-rate distribution (maximum likelihood), which gives for
   any group size n the fraction of groups with mixed outcomes,
   phi(n) = 1 - E[p^n] - E[(1-p)^n]   (all-equal groups carry no GRPO signal), the
   normalised-advantage energy per rollout e(n) = phi(n) * (n - 1) / n (an informative group's
   GRPO advantages have squared sum n - 1, Bessel-corrected std), and the signal per rollout
   v(n) = e(n) / (1 + (n - 1) rho), discounted by the design effect of correlated rollouts
   (rho = 1 / (alpha + beta + 1), the beta-binomial intra-class correlation);
3. the allocation, built greedily from the most sequential plan (n = 2, B_p = the smallest
   batch with at least `min_informative` informative group per step), each doubling allowed
   only while M stays >= `min_steps`, in this order of priority:
   - B_p, until a step holds `target_informative` informative groups (a gradient averaged over
     a few problems, not one);
   - n, while doubling still raises v(n) by more than `signal_gain` (coverage on hard
     problems, sharpening on easy ones): n* grows with the budget and saturates;
   - past `max_useful_steps`, B_p (stability, less cross-problem interference), then n.

The first version of this rule (v1) grew n before B_p and scored e(n) without the design effect;
its iso-compute sweep (`benchmarks/plan_sweep.py`, docs/analysis.md) put it in the top quarter at
small budgets but near the bottom at 16k rollouts, where large groups of few problems lost to
small groups of many problems. v2 is that lesson; on the one setting it had not seen (count,
8k rollouts) it ranked 9 of 25, outside the top quarter: the best runs there used n = 2-4, and
v2 still grows n to 8. Treat n above 4 from this rule as a hypothesis to test, not a finding.

The step floor encodes the playbook's other finding (sequential iterations M are the axis
that low budgets must protect); with Adam each step moves the weights a bounded distance, so
too few steps cannot be made up by larger batches. `min_steps` is the plan's main assumption:
it depends on the learning rate (it was set on tether's tiny-model sweeps at lr 1e-3; see
`benchmarks/plan_sweep.py`) and is printed with every plan.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

CLASSES = ("unsolved", "hard", "medium", "easy")
HARD_BELOW, EASY_ABOVE = 0.25, 0.75


@dataclass(frozen=True)
class PlanConstraints:
    """Knobs of the allocation rule (defaults: see the module docstring)."""

    min_steps: int = 100
    max_useful_steps: int = 400
    n_min: int = 2
    n_max: int = 64
    bp_min: int = 4
    bp_max: int = 256
    min_informative: float = 1.0
    target_informative: float = 4.0
    signal_gain: float = 0.25


@dataclass(frozen=True)
class Plan:
    """A recommendation: n, B_p, M (C = B_p * n * M rollouts), and why."""

    n: int
    problems_per_step: int
    steps: int
    budget_rollouts: int
    budget_tokens: float | None
    used_rollouts: int
    regime: str
    classes: dict[str, float]
    informative_fraction: float
    signal_n: int
    beta: tuple[float, float]
    explanation: list[str] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    constraints: dict[str, Any] = field(default_factory=dict)

    @property
    def overrides(self) -> list[str]:
        return [f"rollout.n={self.n}", f"rollout.problems_per_step={self.problems_per_step}", f"train.steps={self.steps}"]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["overrides"] = self.overrides
        return out


# ----------------------------------------------------------------------------- pass rates


def compute_classes(counts: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Fraction of problems in each class from (n, c) pilot counts."""
    if not counts:
        raise ValueError("no pilot counts")
    out = dict.fromkeys(CLASSES, 0.0)
    for n, c in counts:
        out[classify_pass_rate(n, c)] += 1.0 / len(counts)
    return out


def classify_pass_rate(n: int, c: int) -> str:
    if n <= 0 or not 0 <= c <= n:
        raise ValueError(f"bad pilot count n={n}, c={c}")
    p = c / n
    if c == 0:
        return "unsolved"
    if p < HARD_BELOW:
        return "hard"
    return "easy" if p > EASY_ABOVE else "medium"


def fit_beta_binomial(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Maximum-likelihood (alpha, beta) of a beta-binomial for (n, c) counts (scipy)."""
    from scipy.optimize import minimize
    from scipy.special import betaln

    n = np.array([a for a, _ in counts], dtype=np.float64)
    c = np.array([b for _, b in counts], dtype=np.float64)
    if len(n) == 0:
        raise ValueError("no pilot counts")

    def nll(theta: np.ndarray) -> float:
        a, b = np.exp(theta)
        return -float(np.sum(betaln(c + a, n - c + b) - betaln(a, b)))

    m = float(np.clip(c.sum() / n.sum(), 1e-3, 1 - 1e-3))
    res = minimize(nll, np.log([m, 1 - m]), method="L-BFGS-B", bounds=[(-9.0, 9.0), (-9.0, 9.0)])
    a, b = np.exp(res.x)
    return float(a), float(b)


def compute_informative_fraction(beta: tuple[float, float], n: int) -> float:
    """phi(n) = 1 - E[p^n] - E[(1-p)^n] for p ~ Beta(alpha, beta): groups with mixed outcomes."""
    from scipy.special import betaln

    a, b = beta
    e_all = math.exp(betaln(a + n, b) - betaln(a, b))
    e_none = math.exp(betaln(a, b + n) - betaln(a, b))
    return max(0.0, 1.0 - e_all - e_none)


def compute_signal_energy(beta: tuple[float, float], n: int) -> float:
    """e(n) = phi(n) * (n - 1) / n: normalised-advantage energy per rollout."""
    return compute_informative_fraction(beta, n) * (n - 1) / n


def compute_intra_class_correlation(beta: tuple[float, float]) -> float:
    """rho = 1 / (alpha + beta + 1): the correlation of two rollouts' outcomes on one problem."""
    return 1.0 / (beta[0] + beta[1] + 1.0)


def compute_signal_value(beta: tuple[float, float], n: int) -> float:
    """v(n) = e(n) / (1 + (n - 1) rho): signal per rollout, discounted by the design effect.

    Rollouts of one problem share its difficulty, so n of them are worth n / (1 + (n-1) rho)
    independent samples (Kish's design effect for cluster samples); a new problem is worth more
    than another rollout of a problem already in the batch once rho is large.
    """
    return compute_signal_energy(beta, n) / (1.0 + (n - 1) * compute_intra_class_correlation(beta))


def compute_signal_n(beta: tuple[float, float], k: PlanConstraints) -> int:
    """The smallest power-of-two n after which doubling raises v(n) by less than `signal_gain`."""
    n = k.n_min
    while 2 * n <= k.n_max and compute_signal_value(beta, 2 * n) > (1 + k.signal_gain) * compute_signal_value(beta, n):
        n *= 2
    return n


# ----------------------------------------------------------------------------- allocation


def _bp_floor(beta: tuple[float, float], n: int, k: PlanConstraints, informative: float | None = None) -> int:
    """Smallest power-of-two B_p >= bp_min with B_p * phi(n) >= informative (default: min_informative)."""
    phi = max(compute_informative_fraction(beta, n), 1e-9)
    want = k.min_informative if informative is None else informative
    bp = k.bp_min
    while bp * phi < want and bp < k.bp_max:
        bp *= 2
    return bp


def _regime(classes: dict[str, float]) -> str:
    low, high = classes["unsolved"] + classes["hard"], classes["easy"]
    if low >= 0.5:
        return "coverage"
    if high >= 0.5:
        return "sharpening"
    return "mixed"


def recommend_allocation(counts: Sequence[tuple[int, int]], budget_rollouts: int,
                         constraints: PlanConstraints | None = None, tokens_per_rollout: float | None = None,
                         budget_tokens: float | None = None) -> Plan:
    """n, B_p, M for `budget_rollouts` from pilot (n_pilot, successes) counts (module docstring)."""
    k = constraints or PlanConstraints()
    if budget_rollouts < 1:
        raise ValueError(f"budget must be >= 1 rollout, got {budget_rollouts}")
    beta = fit_beta_binomial(counts)
    classes = compute_classes(counts)
    n_sig = compute_signal_n(beta, k)
    n, bp = k.n_min, _bp_floor(beta, k.n_min, k)
    trace = [{"n": n, "problems_per_step": bp, "steps": budget_rollouts // (n * bp), "why": "start: most sequential plan"}]

    def steps(n_: int, bp_: int) -> int:
        return budget_rollouts // (n_ * bp_)

    def informative(n_: int, bp_: int) -> float:
        return bp_ * compute_informative_fraction(beta, n_)

    while True:
        m = steps(n, bp)
        # with n doubled, the batch that keeps this step's informative groups (up to the target)
        bp_2n = _bp_floor(beta, 2 * n, k, min(informative(n, bp), k.target_informative))
        if informative(n, bp) < k.target_informative and 2 * bp <= k.bp_max and steps(n, 2 * bp) >= k.min_steps:
            bp, why = 2 * bp, f"double B_p: fewer than {k.target_informative:g} informative groups per step"
        elif n < n_sig and 2 * n <= k.n_max and steps(2 * n, bp_2n) >= min(k.min_steps, m):
            n, bp, why = 2 * n, bp_2n, "double n: the signal per rollout v(n) still grows"
        elif m > k.max_useful_steps and 2 * bp <= k.bp_max and steps(n, 2 * bp) >= k.min_steps:
            bp, why = 2 * bp, "double B_p: steps beyond max_useful_steps buy little; a larger batch buys stability"
        elif m > k.max_useful_steps and 2 * n <= k.n_max and steps(2 * n, bp) >= k.min_steps:
            n, why = 2 * n, "double n past saturation: the budget still exceeds max_useful_steps"
        else:
            break
        trace.append({"n": n, "problems_per_step": bp, "steps": steps(n, bp), "why": why})
    m = max(1, steps(n, bp))
    plan = Plan(n=n, problems_per_step=bp, steps=m, budget_rollouts=int(budget_rollouts), budget_tokens=budget_tokens,
                used_rollouts=n * bp * m, regime=_regime(classes), classes=classes,
                informative_fraction=compute_informative_fraction(beta, n), signal_n=n_sig, beta=beta, trace=trace,
                constraints=asdict(k))
    return Plan(**{**asdict(plan), "beta": beta, "explanation": explain_plan(plan, counts, k, tokens_per_rollout)})


def explain_plan(plan: Plan, counts: Sequence[tuple[int, int]], k: PlanConstraints,
                 tokens_per_rollout: float | None) -> list[str]:
    """Plain-language reasons for the plan, with the numbers behind each."""
    c = plan.classes
    beta = plan.beta
    pilot_n = max(n for n, _ in counts)
    lines = [
        f"pilot: {len(counts)} problems x {pilot_n} samples; unsolved {c['unsolved']:.0%}, hard {c['hard']:.0%}, "
        f"medium {c['medium']:.0%}, easy {c['easy']:.0%} -> {plan.regime} regime",
    ]
    phis = ", ".join(f"n={n}: {compute_informative_fraction(beta, n):.0%}" for n in (2, 4, 8, 16, 32, 64) if n <= k.n_max)
    lines.append(f"groups with mixed outcomes (GRPO signal) by group size: {phis}")
    rho = compute_intra_class_correlation(beta)
    lines.append(f"rollouts of one problem correlate (rho={rho:.2f}): a group of n is worth n/(1+(n-1)rho) independent "
                 f"samples, so past n={plan.signal_n} another problem is worth more than more rollouts of one")
    if plan.regime == "coverage":
        lines.append("most problems are rarely solved: larger groups buy coverage (a success to learn from) "
                     f"until n={plan.signal_n}, past which doubling n adds < {k.signal_gain:.0%} signal per rollout")
    elif plan.regime == "sharpening":
        lines.append("most problems are usually solved: larger groups are needed to see failures (sharpening) "
                     f"until n={plan.signal_n}; saturated problems waste rollouts (drop them: ScaleRL's no-positive-resampling)")
    else:
        lines.append(f"pass rates are spread: groups of n={plan.signal_n} already carry most of the available signal")
    if plan.n < plan.signal_n:
        lines.append(f"the budget cannot afford n={plan.signal_n} while keeping >= {k.min_steps} update steps: "
                     f"n={plan.n} (n* grows with the budget; sequential steps come first at low compute)")
    lines.append(f"B_p={plan.problems_per_step}: {plan.problems_per_step * plan.informative_fraction:.1f} informative groups "
                 f"per step expected (target {k.target_informative:g} when the budget keeps >= {k.min_steps} steps)"
                 + ("; raised further because the budget exceeds max_useful_steps"
                    if any("max_useful_steps" in t["why"] and "B_p" in t["why"] for t in plan.trace) else ""))
    lines.append(f"M={plan.steps} update steps uses {plan.used_rollouts} of {plan.budget_rollouts} rollouts"
                 + (f" (~{plan.used_rollouts * tokens_per_rollout:,.0f} sampled tokens at {tokens_per_rollout:.1f}/rollout)"
                    if tokens_per_rollout else ""))
    if plan.steps < k.min_steps:
        lines.append(f"warning: the budget allows only {plan.steps} steps at the smallest allocation (< {k.min_steps}); "
                     "expect little learning, or raise the budget")
    if c["unsolved"] >= 0.3:
        lines.append(f"{c['unsolved']:.0%} of problems had no success in {pilot_n} samples: consider dynamic sampling "
                     "(algo.dynamic_sampling.enable=true) or an easier curriculum")
    lines.append(f"assumption: >= {k.min_steps} sequential steps are needed to learn (set at lr 1e-3 on tiny models; "
                 "scale with 1/lr: --min-steps)")
    return lines


def format_plan(plan: Plan) -> str:
    head = (f"recommended: n={plan.n} rollouts/problem, B_p={plan.problems_per_step} problems/step, "
            f"M={plan.steps} steps  (C = {plan.used_rollouts} rollouts)")
    return "\n".join([head, *("  - " + line for line in plan.explanation), "  overrides: " + " ".join(plan.overrides)])
