"""Scaling fits: recovery of known parameters, uncertainty, bounds, and the run-level driver."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tether.plan.fit import fit_scaling, power_law, sigmoid_law
from tether.plan.scaling import FitOptions, collect_points, format_fit_report, run_fit

C = np.geomspace(100, 1e5, 14)


def test_sigmoid_law_limits():
    # R(C_mid) is halfway; C -> 0 gives R0; C -> inf gives A
    assert sigmoid_law(np.array([1000.0]), 0.1, 0.7, 1000.0, 1.5)[0] == pytest.approx(0.4)
    assert sigmoid_law(np.array([0.0]), 0.1, 0.7, 1000.0, 1.5)[0] == pytest.approx(0.1)
    assert sigmoid_law(np.array([1e12]), 0.1, 0.7, 1000.0, 1.5)[0] == pytest.approx(0.7, abs=1e-6)


def test_sigmoid_fit_recovers_parameters_with_fixed_r0():
    y = sigmoid_law(C, 0.1, 0.8, 3000.0, 1.2) + np.random.default_rng(0).normal(0, 0.005, len(C))
    f = fit_scaling(C, y, "sigmoid", r0=0.1, bootstrap=30)
    assert f.params["r0"] == 0.1 and f.stderr["r0"] == 0.0
    assert f.params["a"] == pytest.approx(0.8, abs=0.02)
    assert f.params["c_mid"] == pytest.approx(3000, rel=0.1)
    assert f.params["b"] == pytest.approx(1.2, rel=0.15)
    assert 0 < f.stderr["a"] < 0.05 and f.r2 > 0.99
    lo, hi = f.band([1e6])
    assert lo[0] <= f.predict([1e6])[0] + 1e-9 and hi[0] >= f.predict([1e6])[0] - 1e-9
    assert f.extrapolation_factor(1e6) == pytest.approx(10.0)


def test_sigmoid_fit_with_free_r0_and_zero_compute_point():
    x = np.r_[0.0, C]
    y = sigmoid_law(x, 0.2, 0.6, 500.0, 1.0)
    f = fit_scaling(x, y, "sigmoid", bootstrap=0)
    assert f.params["r0"] == pytest.approx(0.2, abs=0.01) and f.params["a"] == pytest.approx(0.6, abs=0.01)


def test_power_law_recovery_and_cap():
    y = power_law(C, 0.9, 2.0, 0.4)
    f = fit_scaling(C, y, "power", bootstrap=0)
    assert f.params["e"] == pytest.approx(0.9, abs=0.01) and f.params["b"] == pytest.approx(0.4, rel=0.05)
    noisy = np.clip(0.3 + 0.05 * np.random.default_rng(1).normal(size=len(C)), 0, 1)
    capped = fit_scaling(C, noisy, "sigmoid", r0=0.3, bootstrap=20, cap=1.0)
    assert capped.params["a"] <= 1.0 and max(capped.band([1e7])[1]) <= 1.0 + 1e-9


def test_fit_errors():
    with pytest.raises(ValueError, match="at least"):
        fit_scaling([100, 200], [0.1, 0.2], "sigmoid")
    with pytest.raises(ValueError, match="unknown law"):
        fit_scaling(C, C, "cubic")


def write_run(root, n=4, bp=8, steps=40, every=5, a=0.7, seed=0):
    """A synthetic run whose eval/pass@1 follows a sigmoid in rollouts."""
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(f"rollout:\n  n: {n}\n  problems_per_step: {bp}\n")
    rng = np.random.default_rng(seed)
    rows = [{"step": 0, "eval/pass@1": 0.1}]
    for s in range(1, steps + 1):
        row = {"step": s, "reward/mean": 0.1 + 0.01 * s, "rollout/gen_tokens": 100.0}
        if s % every == 0:
            row["eval/pass@1"] = float(sigmoid_law(np.array([s * n * bp]), 0.1, a, 400.0, 1.3)[0] + rng.normal(0, 0.003))
        rows.append(row)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_collect_points_and_run_fit(tmp_path):
    r1, r2 = write_run(tmp_path / "a"), write_run(tmp_path / "b", n=8, bp=8, steps=20, seed=1)
    pts = collect_points([r1, r2])
    assert pts[0].compute[:3] == (0.0, 160.0, 320.0) and pts[0].values[0] == 0.1
    assert collect_points([r1], unit="tokens")[0].compute[1] == 500.0
    assert collect_points([r1], metric="reward/mean", unit="steps")[0].compute[:2] == (1.0, 2.0)
    rep = run_fit([r1, r2], FitOptions(bootstrap=10), plot_path=tmp_path / "fit.png")
    sig = rep["fits"]["a"]["sigmoid"]
    assert sig["params"]["r0"] == 0.1 and sig["params"]["a"] == pytest.approx(0.7, abs=0.05)
    assert "pooled" in rep["fits"] and (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    assert rep["fits"]["a"]["sigmoid"]["predictions"][-1]["extrapolation_factor"] == pytest.approx(10.0)
    assert "sigmoid" in format_fit_report(rep)
    json.dumps(rep)  # JSON-able
    final = run_fit([r1, r2], FitOptions(final_only=True, bootstrap=0, laws=("power",)))
    assert list(final["fits"]) == ["pooled"] and "error" in final["fits"]["pooled"]["power"]  # 2 points only
    with pytest.raises(ValueError, match="no points"):
        run_fit([r1], FitOptions(metric="nope"))
