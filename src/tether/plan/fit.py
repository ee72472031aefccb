"""Compute-scaling fits of accuracy (or reward) versus compute: ScaleRL sigmoid and a power law.

ScaleRL (Khatri et al., arXiv 2510.13786, Eq. 1):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R0 is the starting value, A the asymptote, B > 0 the efficiency exponent and C_mid the compute at
which half of the gain A - R0 is reached. The power law approaches an asymptote E as

    R(C) = E - a * C^(-b),   a, b > 0

(the form used for loss/error scaling; the Scaling Behaviors notes in the seeds fit it too).
Parameters come from `scipy.optimize.curve_fit` (bounded trust-region least squares); their
standard errors from its covariance, and a prediction band from a bootstrap over the points
(refit on resampled points; percentiles of the predictions). With few points the band is wide,
and an extrapolation far past the data is a guess: `extrapolation_factor` says how far it goes.

    fit = fit_scaling(compute_C, acc_C, "sigmoid", r0=acc_C[0])
    fit.predict([1e5]), fit.params["A"], fit.stderr["A"]
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np


def sigmoid_law(c: np.ndarray, r0: float, a: float, c_mid: float, b: float) -> np.ndarray:
    """ScaleRL's R(C); C <= 0 gives R0 (the limit as C -> 0 for B > 0)."""
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        ratio = np.where(c > 0, np.power(c_mid / np.where(c > 0, c, 1.0), b), np.inf)
        return r0 + (a - r0) / (1.0 + ratio)


def power_law(c: np.ndarray, e: float, a: float, b: float) -> np.ndarray:
    """E - a * C^(-b) (C > 0)."""
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return e - a * np.power(np.maximum(c, 1e-300), -b)


@dataclass(frozen=True)
class ScalingFit:
    """One fitted law: parameters, their standard errors (NaN if undetermined), fit quality,
    the compute range of the data and bootstrap parameter draws for prediction bands."""

    law: str
    params: dict[str, float]
    stderr: dict[str, float]
    r2: float
    rmse: float
    n_points: int
    c_min: float
    c_max: float
    boot: list[dict[str, float]] = field(default_factory=list, repr=False)

    def predict(self, c: Sequence[float] | np.ndarray) -> np.ndarray:
        return LAWS[self.law].fn(np.asarray(c, dtype=np.float64), **self.params)

    def band(self, c: Sequence[float] | np.ndarray, lo: float = 5.0, hi: float = 95.0) -> tuple[np.ndarray, np.ndarray]:
        """Percentile band of the bootstrap predictions at `c` (the point prediction twice if none)."""
        c = np.asarray(c, dtype=np.float64)
        if not self.boot:
            y = self.predict(c)
            return y, y
        ys = np.stack([LAWS[self.law].fn(c, **p) for p in self.boot])
        return np.nanpercentile(ys, lo, axis=0), np.nanpercentile(ys, hi, axis=0)

    def extrapolation_factor(self, c: float) -> float:
        """How far past the largest fitted compute `c` lies (1 = inside the data)."""
        return max(1.0, c / self.c_max) if self.c_max > 0 else float("inf")

    def to_json(self) -> dict:
        return {"law": self.law, "params": self.params, "stderr": self.stderr, "r2": self.r2, "rmse": self.rmse,
                "n_points": self.n_points, "compute_range": [self.c_min, self.c_max], "bootstrap_fits": len(self.boot)}


@dataclass(frozen=True)
class _Law:
    fn: Callable[..., np.ndarray]
    names: tuple[str, ...]
    # (x, y, r0 or None, cap or None) -> (p0, lower, upper, fixed); `fixed` params are held constant
    # and `cap` bounds the asymptote (1.0 for pass rates)
    init: Callable[..., tuple[list[float], list[float], list[float], dict[str, float]]]


def _sigmoid_init(x, y, r0, cap):
    lo_y, hi_y = float(np.min(y)), float(np.max(y))
    span = max(hi_y - lo_y, 1e-3)
    top = min(hi_y + 10 * span, cap) if cap is not None else hi_y + 10 * span
    pos = x[x > 0]
    c_geo = float(np.exp(np.mean(np.log(pos)))) if len(pos) else 1.0
    c_lo, c_hi = (float(pos.min()) / 1e3, float(pos.max()) * 1e3) if len(pos) else (1e-6, 1e6)
    a0 = min(hi_y + 0.1 * span, top)
    if r0 is None:
        return ([lo_y, a0, c_geo, 1.0], [lo_y - 10 * span, lo_y - 10 * span, c_lo, 0.05], [top, top, c_hi, 10.0], {})
    return ([a0, c_geo, 1.0], [min(lo_y, r0) - 10 * span, c_lo, 0.05], [max(top, r0), c_hi, 10.0], {"r0": r0})


def _power_init(x, y, r0, cap):
    lo_y, hi_y = float(np.min(y)), float(np.max(y))
    span = max(hi_y - lo_y, 1e-3)
    top = max(min(hi_y + 10 * span, cap), hi_y) if cap is not None else hi_y + 10 * span
    c_min = float(np.min(x[x > 0])) if np.any(x > 0) else 1.0
    return ([min(hi_y + 0.1 * span, top), span * c_min**0.5, 0.5], [lo_y, 0.0, 1e-3], [top, np.inf, 5.0], {})


LAWS: dict[str, _Law] = {
    "sigmoid": _Law(sigmoid_law, ("r0", "a", "c_mid", "b"), _sigmoid_init),
    "power": _Law(power_law, ("e", "a", "b"), _power_init),
}


def _curve_fit(law: _Law, x: np.ndarray, y: np.ndarray, r0: float | None,
               cap: float | None = None) -> tuple[dict[str, float], dict[str, float]]:
    from scipy.optimize import curve_fit

    p0, lo, hi, fixed = law.init(x, y, r0, cap)
    free = [n for n in law.names if n not in fixed]

    def f(c, *theta):
        return law.fn(c, **fixed, **dict(zip(free, theta)))

    p0 = [min(max(v, lo_i + 1e-12), hi_i - 1e-12) if math.isfinite(hi_i) else max(v, lo_i + 1e-12)
          for v, lo_i, hi_i in zip(p0, lo, hi)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OptimizeWarning when the covariance is undetermined
        theta, cov = curve_fit(f, x, y, p0=p0, bounds=(lo, hi), maxfev=20000)
    err = np.sqrt(np.clip(np.diag(cov), 0, None)) if np.all(np.isfinite(cov)) else np.full(len(free), np.nan)
    params = {**fixed, **{n: float(v) for n, v in zip(free, theta)}}
    stderr = {**{n: 0.0 for n in fixed}, **{n: float(e) for n, e in zip(free, err)}}
    return params, stderr


def fit_scaling(compute: Sequence[float], values: Sequence[float], law: str = "sigmoid", r0: float | None = None,
                bootstrap: int = 200, seed: int = 0, cap: float | None = None) -> ScalingFit:
    """Fit `law` ("sigmoid" | "power") to (compute, value) points.

    `r0` fixes the sigmoid's starting value (ScaleRL: the initial pass rate); points at
    compute <= 0 then only anchor it. `cap` bounds the asymptote (A or E; 1.0 for pass rates).
    Raises ValueError with too few points for the free parameters. `bootstrap` refits on
    resampled points for prediction bands (0: none).
    """
    if law not in LAWS:
        raise ValueError(f"unknown law {law!r}; valid: {sorted(LAWS)}")
    x = np.asarray(compute, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if law == "power" or r0 is not None:
        ok &= x > 0
    x, y = x[ok], y[ok]
    spec = LAWS[law]
    n_free = len(spec.names) - (1 if (law == "sigmoid" and r0 is not None) else 0)
    if len(x) < n_free + 1:
        raise ValueError(f"{law} fit needs at least {n_free + 1} points with compute > 0, got {len(x)}")
    params, stderr = _curve_fit(spec, x, y, r0, cap)
    pred = spec.fn(x, **params)
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    boot: list[dict[str, float]] = []
    rng = np.random.default_rng(seed)
    for _ in range(bootstrap):
        idx = rng.integers(0, len(x), len(x))
        if len(np.unique(x[idx])) < n_free:
            continue
        try:
            boot.append(_curve_fit(spec, x[idx], y[idx], r0, cap)[0])
        except (RuntimeError, ValueError):
            continue
    return ScalingFit(law, params, stderr, 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
                      math.sqrt(ss_res / len(x)), len(x), float(x.min()), float(x.max()), boot)
