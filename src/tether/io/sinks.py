"""Metric sinks: where a step's metrics go (metrics.jsonl always; TensorBoard, W&B, MLflow opt-in).

`metrics.jsonl` is the contract (docs/metrics.md); the other sinks are views of it. Logging must never
kill a run: a sink that raises inside `log` is disabled by `MultiSink` with one warning that
names it, and the run continues with the remaining sinks. W&B and MLflow are optional extras,
imported lazily; a missing package fails at construction with the `pip install` line to run.

    sinks = MultiSink(build_sinks(run_dir, cfg.logging, config=cfg))
    sinks.log(step, {"reward/mean": 0.4, "kl": 1e-3})
    sinks.close()
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import warnings
from types import ModuleType
from typing import Any, Mapping, Protocol, runtime_checkable

from tether.io.run_dir import RunDir


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra to install."""


@runtime_checkable
class MetricSink(Protocol):
    """Receives one dict of metrics per step."""

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def _import_extra(module: str, extra: str, flag: str) -> ModuleType:
    """Import an optional package or raise a MissingExtraError with the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f"{flag}=true needs the {module!r} package, which is not installed: "
            f"run `pip install 'tether[{extra}]'` (or set {flag}=false)"
        ) from err


def compute_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The real-number entries of `metrics` as floats (0-d tensors/numpy scalars unwrapped).

    Strings, lists, None, multi-element tensors are skipped: scalar dashboards cannot plot them.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()
        if isinstance(value, numbers.Real):  # bool is a Real: logged as 0/1 on purpose
            out[str(key)] = float(value)
    return out


class JsonlSink:
    """Appends to `<run>/metrics.jsonl` (fsynced per row; non-finite -> null + "nonfinite")."""

    name = "jsonl"

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run_dir.append_metrics(step, metrics)

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars into `<run>/tb` via torch's SummaryWriter; non-numbers are skipped."""

    name = "tensorboard"

    def __init__(self, log_dir: Any, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: pulls in tensorboard

        # purge_step (resume): TensorBoard hides the earlier files' events from that step on
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in compute_scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a crashed run still shows its curves

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases run (needs `pip install 'tether[wandb]'`)."""

    name = "wandb"

    def __init__(self, project: str, run_name: str | None = None, config: Mapping[str, Any] | None = None,
                 directory: str | None = None, run_id: str | None = None) -> None:
        """`run_id` (a resumed tether run): continue that W&B run instead of starting a new one."""
        self.wandb = _import_extra("wandb", "wandb", "logging.wandb")
        more = {"id": run_id, "resume": "allow"} if run_id else {}
        self.run = self.wandb.init(project=project, name=run_name, config=dict(config or {}), dir=directory, **more)
        self.run_id = str(self.run.id)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        # Scalars only: tables under a fixed key keep only the last step (trl PR#6568);
        # completions live per step in <run>/samples instead.
        self.run.log(compute_scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowSink:
    """MLflow run under experiment `project` (needs `pip install 'tether[mlflow]'`)."""

    name = "mlflow"

    def __init__(self, project: str, run_name: str | None = None, config: Mapping[str, Any] | None = None,
                 run_id: str | None = None) -> None:
        """`run_id` (a resumed tether run): continue that MLflow run (its params are already logged)."""
        self.mlflow = _import_extra("mlflow", "mlflow", "logging.mlflow")
        self.mlflow.set_experiment(project)
        self.run = self.mlflow.start_run(run_id=run_id) if run_id else self.mlflow.start_run(run_name=run_name)
        self.run_id = str(self.run.info.run_id)
        if config and not run_id:
            self.mlflow.log_params(_flatten(config))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        # MLflow rejects NaN in some backends; a non-finite value is already in metrics.jsonl.
        scalars = {k: v for k, v in compute_scalars(metrics).items() if math.isfinite(v)}
        self.mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1} (MLflow params are flat)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


class MultiSink:
    """Fan-out to several sinks; a sink that raises is disabled with one warning."""

    name = "multi"

    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = list(sinks)
        self.disabled: dict[str, str] = {}  # sink name -> error that disabled it

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for sink in list(self.sinks):
            try:
                sink.log(step, metrics)
            except Exception as err:  # noqa: BLE001 — logging must never kill the run
                self._disable(sink, f"{type(err).__name__}: {err}", step)

    def _disable(self, sink: MetricSink, why: str, step: int) -> None:
        name = getattr(sink, "name", type(sink).__name__)
        self.sinks.remove(sink)
        self.disabled[name] = why
        warnings.warn(
            f"metric sink {name!r} failed at step {step} ({why}); it is disabled for the rest "
            "of the run (metrics.jsonl and the other sinks continue)",
            RuntimeWarning,
            stacklevel=3,
        )
        try:
            sink.close()
        except Exception:  # noqa: BLE001 — already broken; the warning above names it
            pass

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001
                name = getattr(sink, "name", type(sink).__name__)
                warnings.warn(f"metric sink {name!r} failed to close: {err}", RuntimeWarning, stacklevel=2)
        self.sinks = []


SINK_IDS = "sinks.json"


def _read_sink_ids(run_dir: RunDir) -> dict[str, str]:
    try:
        ids = json.loads((run_dir.root / SINK_IDS).read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def build_sinks(run_dir: RunDir, logging_cfg: Any, config: Any = None, start_step: int | None = None) -> list[MetricSink]:
    """The sinks that `logging_cfg` (a `LoggingConfig`) asks for; JSONL is always first.

    `config` (optional, the full TetherConfig or a dict) is attached to W&B/MLflow runs, whose ids
    are kept in `<run>/sinks.json` so that a resumed run (`start_step` given) continues the same
    W&B/MLflow run. (Steps an interrupted attempt logged past the checkpoint stay in those
    services: W&B ignores steps at or below its last one, MLflow keeps both values of a step.)
    Raises MissingExtraError when wandb/mlflow is requested but not installed: failing at
    startup beats discovering after a day that nothing was logged. `start_step` (a resumed run):
    the checkpoint's step; TensorBoard drops what an interrupted attempt logged after it.
    """
    cfg_dict: dict[str, Any] = {}
    if config is not None:
        cfg_dict = config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(config)
    run_name = run_dir.root.name
    sinks: list[MetricSink] = [JsonlSink(run_dir)]
    try:
        if logging_cfg.tensorboard:
            sinks.append(TensorBoardSink(run_dir.tb_dir, None if start_step is None else start_step + 1))
        ids = _read_sink_ids(run_dir) if start_step is not None else {}
        if logging_cfg.wandb:
            sinks.append(WandbSink(logging_cfg.project, run_name, cfg_dict, str(run_dir.root), ids.get("wandb")))
        if logging_cfg.mlflow:
            sinks.append(MLflowSink(logging_cfg.project, run_name, cfg_dict, ids.get("mlflow")))
        if logging_cfg.wandb or logging_cfg.mlflow:
            (run_dir.root / SINK_IDS).write_text(json.dumps({s.name: s.run_id for s in sinks if hasattr(s, "run_id")}))
    except BaseException:
        MultiSink(sinks).close()  # don't leak open writers when a later sink cannot start
        raise
    return sinks
