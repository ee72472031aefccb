"""Metric sinks: JSONL + TensorBoard, lazy optional extras, failing sinks disabled not fatal."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from tether.config import LoggingConfig
from tether.io.run_dir import make_run_dir
from tether.io.sinks import (
    JsonlSink,
    MetricSink,
    MissingExtraError,
    MLflowSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    build_sinks,
    compute_scalars,
)


@pytest.fixture
def run(tmp_path):
    return make_run_dir(tmp_path / "run")


def test_compute_scalars_skips_non_numbers():
    got = compute_scalars({"a": 1, "b": 2.5, "t": torch.tensor(3.0), "s": "x", "n": None,
                           "v": torch.ones(3), "l": [1, 2], "flag": True})
    assert got == {"a": 1.0, "b": 2.5, "t": 3.0, "flag": 1.0}


def test_build_sinks_default_jsonl_and_tensorboard(run):
    sinks = build_sinks(run, LoggingConfig())
    assert [type(s) for s in sinks] == [JsonlSink, TensorBoardSink]
    assert all(isinstance(s, MetricSink) for s in sinks)
    multi = MultiSink(sinks)
    multi.log(1, {"reward": 0.5, "text": "skip me"})
    multi.log(2, {"reward": 0.7})
    multi.close()
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert run.read_metrics()[0]["text"] == "skip me"  # jsonl keeps everything
    assert any(p.name.startswith("events.out.tfevents") for p in run.tb_dir.iterdir())


def test_tensorboard_scalars_readable(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(run.tb_dir)
    for step in range(3):
        sink.log(step, {"loss": float(step), "name": "x"})
    sink.close()
    acc = EventAccumulator(str(run.tb_dir))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["loss"]
    assert [e.value for e in acc.Scalars("loss")] == [0.0, 1.0, 2.0]


def test_build_sinks_tensorboard_off(run):
    sinks = build_sinks(run, LoggingConfig(tensorboard=False))
    assert [type(s) for s in sinks] == [JsonlSink]


@pytest.mark.parametrize(("flag", "module", "cls", "extra"), [
    ("wandb", "wandb", WandbSink, "tether[wandb]"),
    ("mlflow", "mlflow", MLflowSink, "tether[mlflow]"),
])
def test_missing_extra_names_pip_command(run, monkeypatch, flag, module, cls, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(MissingExtraError, match=re.escape(f"pip install '{extra}'")):
        cls("proj")
    with pytest.raises(ImportError, match=f"logging.{flag}"):
        build_sinks(run, LoggingConfig(tensorboard=False, **{flag: True}))


class _Boom:
    name = "boom"

    def __init__(self):
        self.calls = 0
        self.closed = False

    def log(self, step, metrics):
        self.calls += 1
        raise OSError("disk full")

    def close(self):
        self.closed = True


def test_failing_sink_disabled_with_one_warning(run):
    boom = _Boom()
    multi = MultiSink([boom, JsonlSink(run)])
    with pytest.warns(RuntimeWarning, match="'boom' failed at step 1.*disk full") as rec:
        for step in (1, 2, 3):
            multi.log(step, {"a": float(step)})
    assert len([w for w in rec if "boom" in str(w.message)]) == 1
    assert boom.calls == 1 and boom.closed
    assert multi.disabled == {"boom": "OSError: disk full"}
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    multi.close()


def _fake_services(monkeypatch):
    """Stand-ins for wandb and mlflow (neither is installed here) that record how runs start."""
    from types import ModuleType, SimpleNamespace

    calls = {"wandb": [], "mlflow": []}
    wandb = ModuleType("wandb")

    def init(**kw):
        calls["wandb"].append(kw)
        return SimpleNamespace(id=kw.get("id") or "wb-new", log=lambda *a, **k: None, finish=lambda: None)

    wandb.init = init
    mlflow = ModuleType("mlflow")
    mlflow.set_experiment = lambda name: None

    def start_run(**kw):
        calls["mlflow"].append(kw)
        return SimpleNamespace(info=SimpleNamespace(run_id=kw.get("run_id") or "ml-new"))

    mlflow.start_run = start_run
    mlflow.log_params = lambda params: calls["mlflow"].append({"params": len(params)})
    mlflow.log_metrics = lambda metrics, step: None
    mlflow.end_run = lambda: None
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    return calls


def test_a_resumed_run_continues_its_wandb_and_mlflow_runs(run, monkeypatch):
    """Issue 14: sinks resume too: the W&B/MLflow run ids are kept in the run directory and a
    resumed run continues those runs instead of starting new ones."""
    calls = _fake_services(monkeypatch)
    cfg = LoggingConfig(tensorboard=False, wandb=True, mlflow=True)
    MultiSink(build_sinks(run, cfg, {"a": 1})).close()
    assert "id" not in calls["wandb"][0] and "run_id" not in calls["mlflow"][0]
    assert json.loads((run.root / "sinks.json").read_text()) == {"wandb": "wb-new", "mlflow": "ml-new"}
    calls["wandb"].clear(), calls["mlflow"].clear()
    MultiSink(build_sinks(run, cfg, {"a": 1}, start_step=3)).close()  # the resume
    assert calls["wandb"][0]["id"] == "wb-new" and calls["wandb"][0]["resume"] == "allow"
    assert calls["mlflow"] == [{"run_id": "ml-new"}]  # same run, params not logged twice
