"""`tether.open_run` and `tether.Run`: a run directory as an object, whatever its kind.

    run = tether.open_run("runs/rev-sft")
    run.kind, run.path, run.config, run.summary      # "sft", the directory, its config, summary.json
    run.result_model()                               # the directory of the run's result model
    run.members                                      # a pipeline's stages, a sweep's runs (Run objects)

The kind comes from the run record (run.json, tether.runs.record); a run written before the
record existed is recognised by its files. The config is read back with its file references
re-rooted (tether.runs.refs), so a run opens from any working directory and after a move.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from tether.errors import UserError
from tether.runs.record import RunRecord, read_record
from tether.runs.refs import MissingReference, resolve_refs
from tether.runs.result import Result, resolve_result


class NotARun(UserError, FileNotFoundError):
    """The directory is not a tether run (no run.json, config.yaml, summary.json or metrics.jsonl)."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def infer_kind(path: Path, record: RunRecord) -> str | None:
    """The run's kind: its record, else its summary, else what its files say (older runs)."""
    if record.kind:
        return record.kind
    summary = _read_json(path / "summary.json")
    if isinstance(summary.get("kind"), str):
        return summary["kind"]
    if (path / "sweep.json").is_file() or (path / "sweep_spec.json").is_file():
        return "sweep"
    if (path / "cases.jsonl").is_file():
        return "faultbench"
    if any((path / s / "config.yaml").is_file() for s in ("sft", "rl")) and not (path / "metrics.jsonl").is_file():
        return "pipeline"
    if (path / "final_model").is_dir() and not (path / "checkpoints").is_dir():
        return None
    return None


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = (), strict: bool = True):
    """The run's config.yaml with its file references re-rooted and `overrides` applied.
    `strict`: a referenced file found nowhere raises MissingReference, naming it and the fix."""
    from tether.config import ConfigError, apply_overrides, build_config

    path = Path(run_dir) / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError:
        raise ConfigError(f"{run_dir}: no config.yaml: not a tether run directory") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    overridden = tuple(o.partition("=")[0].strip() for o in overrides)
    data, problems = resolve_refs(data, read_record(run_dir).refs, run_dir, skip=overridden)
    if problems and strict:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise MissingReference(f"{run_dir}: {problems[0]}{more}")
    return build_config(apply_overrides(data, list(overrides)), str(path))


@dataclass
class Run:
    """One run directory (see the module doc). Create with `open_run`."""

    path: Path
    record: RunRecord
    kind: str | None
    _config: Any = field(default=None, repr=False)

    @property
    def config(self):
        """The run's config (references re-rooted; None for a run without config.yaml, e.g. a sweep)."""
        if self._config is None and (self.path / "config.yaml").is_file():
            self._config = load_run_config(self.path, strict=False)
        return self._config

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json ({} while the run has not written one)."""
        return _read_json(self.path / "summary.json")

    @property
    def status(self) -> str:
        """running, complete, interrupted or failed (a run written before the record: from its summary)."""
        if self.record.status:
            return self.record.status
        s = self.summary
        if not s:
            return "unknown"
        return "interrupted" if s.get("interrupted") or s.get("interrupted_in") or s.get("complete") is False else "complete"

    @property
    def members(self) -> list["Run"]:
        """The runs that belong to this one: a pipeline's stages, a sweep's or comparison's runs."""
        paths = [self.path / m["path"] for m in self.record.members]
        if not paths and self.kind in ("pipeline", "demo"):
            paths = [self.path / s for s in ("sft", "rl") if (self.path / s / "config.yaml").is_file()]
        if not paths and self.kind == "sweep":
            paths = sorted(p.parent for p in self.path.glob("*/seed-*/config.yaml"))
        return [open_run(p) for p in paths if p.is_dir()]

    def result(self, step: int | None = None) -> Result:
        """The run's result model with the note a command prints (tether.runs.result)."""
        return resolve_result(self.path, step)

    def result_model(self, step: int | None = None) -> Path:
        """The directory of the run's result model (a checkpoint only with `step`)."""
        return self.result(step).path


def open_run(path: str | Path) -> Run:
    """The run at `path` (any run kind); raises NotARun for a directory that is not one."""
    p = Path(path)
    if not p.is_dir():
        raise NotARun(f"{p}: no such directory (a run directory is expected)")
    record = read_record(p)
    kind = infer_kind(p, record)
    if kind is None and not any((p / f).is_file() for f in ("config.yaml", "run.json", "summary.json", "metrics.jsonl")):
        raise NotARun(f"{p}: not a tether run directory (no run.json, config.yaml, summary.json or metrics.jsonl)")
    return Run(p, record, kind)


__all__ = ["NotARun", "Run", "infer_kind", "load_run_config", "open_run"]
