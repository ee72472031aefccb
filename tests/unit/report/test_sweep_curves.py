"""tether.report.sweep_curves: per-step mean +- s.e. over seeds from hand-written metrics files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tether.report.sweep_curves import compute_sweep_curves, main, read_curve


def _run(d: Path, rows, stage=None) -> Path:
    target = d / stage if stage else d
    target.mkdir(parents=True)
    (target / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d


def test_curve_mean_and_standard_error_by_step(tmp_path):
    # arm a: seeds 0/1 log eval/pass@1 at steps 0 and 10 (seed 1 lacks step 10 -> n = 1 there, se nan)
    a0 = _run(tmp_path / "a0", [{"step": 0, "eval/pass@1": 0.1}, {"step": 5, "reward/mean": 0.3},
                                {"step": 10, "eval/pass@1": 0.5}], stage="rl")
    a1 = _run(tmp_path / "a1", [{"step": 0, "eval/pass@1": 0.3}, {"step": 10, "eval/pass@1": float("nan")}], stage="rl")
    b0 = _run(tmp_path / "b0", [{"step": 0, "eval/pass@1": 0.2}], stage="rl")
    runs = [{"arm": "a", "seed": 0, "run_dir": str(a0)}, {"arm": "a", "seed": 1, "run_dir": str(a1)},
            {"arm": "b", "seed": 0, "run_dir": str(b0)}]
    curves = compute_sweep_curves(runs, "eval/pass@1", stage="rl")
    a = curves["a"]
    assert [p["step"] for p in a] == [0, 10]
    assert a[0]["n"] == 2 and a[0]["mean"] == pytest.approx(0.2)
    # sd of (0.1, 0.3) with ddof 1 = 0.141421..., se = sd / sqrt 2 = 0.1
    assert a[0]["se"] == pytest.approx(0.1)
    assert a[1]["n"] == 1 and a[1]["mean"] == pytest.approx(0.5) and math.isnan(a[1]["se"])
    assert curves["b"] == [{"step": 0, "n": 1, "mean": pytest.approx(0.2), "sd": curves["b"][0]["sd"],
                            "se": curves["b"][0]["se"]}]


def test_read_curve_falls_back_to_the_run_metrics_and_missing_is_empty(tmp_path):
    d = _run(tmp_path / "r", [{"step": 1, "accuracy": 0.25}, {"step": 1, "accuracy": 0.5}])
    assert read_curve(d, "accuracy", stage="rl") == {1: 0.5}  # no rl/ folder: the run's own file; last row wins
    assert read_curve(tmp_path / "none", "accuracy") == {}


def test_main_writes_curves_json_and_plot(tmp_path, capsys):
    a0 = _run(tmp_path / "runs" / "a0", [{"step": 0, "eval/pass@1": 0.1}, {"step": 10, "eval/pass@1": 0.4}])
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"runs": [{"arm": "a", "seed": 0, "run_dir": str(a0)}]}))
    assert main([str(sweep), "--key", "eval/pass@1"]) == 0
    saved = json.loads((sweep / "curves.json").read_text())
    assert [p["mean"] for p in saved["curves"]["a"]] == pytest.approx([0.1, 0.4])
    assert (sweep / "plots" / "curves.png").stat().st_size > 0
    assert main([str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().out
