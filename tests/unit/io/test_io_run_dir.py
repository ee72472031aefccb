"""RunDir: layout, durable metrics.jsonl (non-finite -> null), torn-line tolerance, resume
truncation, per-step samples never overwritten, atomic summary."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
import yaml

from tether.config import TetherConfig
from tether.io.run_dir import make_run_dir, read_metrics


@pytest.fixture
def run(tmp_path):
    return make_run_dir(tmp_path / "runs" / "demo")


def test_layout_created(run):
    for d in ("samples", "checkpoints", "plots", "tb"):
        assert (run.root / d).is_dir()
    assert run.metrics_path.name == "metrics.jsonl" and run.health_path.name == "health.jsonl"


def test_write_config_roundtrips(run):
    cfg = TetherConfig()
    path = run.write_config(cfg)
    data = yaml.safe_load(path.read_text())
    assert TetherConfig.model_validate(data) == cfg
    run.write_config({"a": 1})
    assert yaml.safe_load(path.read_text()) == {"a": 1}


def test_append_metrics_one_line_per_call_step_first(run):
    run.append_metrics(1, {"reward": 0.5, "kl": torch.tensor(0.25), "n": np.int64(3)})
    run.append_metrics(2, {"reward": 0.75})
    lines = run.metrics_path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert list(first)[0] == "step"
    assert first == {"step": 1, "reward": 0.5, "kl": 0.25, "n": 3}
    assert run.read_metrics()[1] == {"step": 2, "reward": 0.75}


def test_nonfinite_become_null_and_listed(run):
    run.append_metrics(3, {"loss": float("nan"), "ratio": float("inf"), "ok": 1.0,
                           "nested": {"x": -math.inf}, "t": torch.tensor(float("nan"))})
    raw = run.metrics_path.read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    row = json.loads(raw)  # strict JSON parse
    assert row["loss"] is None and row["ratio"] is None and row["t"] is None
    assert row["nested"] == {"x": None}
    assert row["nonfinite"] == ["loss", "ratio", "nested.x", "t"]
    assert row["ok"] == 1.0
    with pytest.raises(ValueError, match="reserved"):
        run.append_metrics(4, {"nonfinite": []})
    with pytest.raises(ValueError, match="step"):
        run.append_metrics(4, {"step": 5})


def test_read_metrics_skips_torn_last_line(run):
    run.append_metrics(1, {"a": 1.0})
    run.append_metrics(2, {"a": 2.0})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"step": 3, "a": 3.')  # crash mid-write
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3"):
        rows = read_metrics(run.metrics_path)
    assert [r["step"] for r in rows] == [1, 2]


def test_append_after_torn_line_repairs_file(run):
    run.append_metrics(1, {"a": 1.0})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"step": 2, "a"')
    with pytest.warns(UserWarning, match="torn"):
        run.append_metrics(2, {"a": 2.0})
    assert [r["step"] for r in read_metrics(run.metrics_path)] == [1, 2]


def test_malformed_middle_line_names_file_and_line(run):
    run.metrics_path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(run.metrics_path)


def test_truncate_metrics_after_resume_step(run):
    for s in range(1, 7):
        run.append_metrics(s, {"a": float(s)})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"step": 7')
    with pytest.warns(UserWarning):
        dropped = run.truncate_metrics_after(4)
    assert dropped == 2
    run.append_metrics(5, {"a": 50.0})
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["a"] == 50.0


def test_write_samples_per_step_gzip_never_overwritten(run):
    rows = [{"prompt": "1+1=", "completion": "2", "reward": 1.0, "lp": float("nan")}]
    p1 = run.write_samples(1, rows)
    assert p1.name == "step_000001.jsonl.gz"
    p2 = run.write_samples(1, [{"completion": "3"}])
    assert p2 != p1 and p1.exists()
    with gzip.open(p1, "rt") as fh:
        back = [json.loads(line) for line in fh]
    assert back == [{"prompt": "1+1=", "completion": "2", "reward": 1.0, "lp": None}]
    assert run.write_samples(1, rows, kind="eval").name == "eval_000001.jsonl.gz"
    assert run.write_samples(2, []).exists()


def test_write_summary_atomic(run):
    run.write_summary({"final_reward": 0.9, "bad": float("nan")})
    run.write_summary({"final_reward": 1.0})
    assert json.loads(run.summary_path.read_text()) == {"final_reward": 1.0}
    assert not [p for p in run.root.iterdir() if p.name.startswith(".tmp-")]


def test_append_health(run):
    run.append_health({"step": 3, "detector": "zero_std", "value": float("inf")})
    assert read_metrics(run.health_path) == [{"step": 3, "detector": "zero_std", "value": None}]
