"""Plots: valid PNGs for the metric groups present, nothing for absent ones, no crash."""

from __future__ import annotations

import math

from tether.io.plots import compute_groups, plot_eval_curve, plot_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows():
    return [
        {"step": s, "reward/mean": 0.1 * s, "reward/std": 0.5, "accuracy": s / 10,
         "kl": 1e-3 * s if s != 2 else None, "entropy": 2.0 - 0.1 * s,
         "response_length/mean": 20 + s, "pg_loss": math.nan if s == 3 else 0.1, "note": "x"}
        for s in range(1, 6)
    ]


def test_groups_from_default_patterns():
    groups = compute_groups(_rows())
    assert groups == {
        "reward": ["reward/mean", "reward/std"], "accuracy": ["accuracy"], "kl": ["kl"],
        "entropy": ["entropy"], "response_length": ["response_length/mean"], "loss": ["pg_loss"],
    }


def test_plot_metrics_writes_valid_pngs(tmp_path):
    paths = plot_metrics(_rows(), tmp_path / "plots")
    names = sorted(p.name for p in paths)
    assert names == sorted(["reward.png", "accuracy.png", "kl.png", "entropy.png",
                            "response_length.png", "loss.png"])
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_missing_keys_are_skipped(tmp_path):
    assert plot_metrics([], tmp_path) == []
    assert plot_metrics([{"step": 1, "unrelated": "text"}], tmp_path) == []
    paths = plot_metrics(_rows(), tmp_path, keys=["kl", "does_not_exist"])
    assert [p.name for p in paths] == ["kl.png"]
    paths = plot_metrics(_rows(), tmp_path, keys={"policy": ["entropy", "nope"], "empty": ["nope"]})
    assert [p.name for p in paths] == ["policy.png"]
    assert paths[0].read_bytes().startswith(PNG_MAGIC)


def test_plot_eval_curve(tmp_path):
    single = plot_eval_curve({1: 0.2, 2: 0.35, 4: 0.5, 8: float("nan")}, tmp_path / "a.png")
    multi = plot_eval_curve({"step 0": {1: 0.2, 4: 0.5}, "step 50": {1: 0.4, 4: 0.7}},
                            tmp_path / "sub" / "b.png", title="pass@k")
    for p in (single, multi):
        assert p.read_bytes().startswith(PNG_MAGIC)
