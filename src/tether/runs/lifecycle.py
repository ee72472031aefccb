"""Writing the run record over a run's life: opened (`do_start_record`), finished or interrupted
(`do_finish_run`), and the members of a multi-run (`do_set_members`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from tether.runs.record import RUN_FILE, RunRecord, read_record, relative_to_run, update_record, write_record
from tether.runs.refs import compute_refs

# settings that name the model(s) a run starts from: (dotted key, holds a list)
MODEL_KEYS = (("model.path", False), ("distill.teacher", False), ("dpo.strong_model", False),
              ("dpo.weak_model", False), ("merge.models", True), ("merge.base", False))
# the step count a run of each kind plans
PLANNED_STEPS = {"sft": "sft.steps", "rs_sft": "sft.steps", "rl": "train.steps", "rl_async": "train.steps",
                 "distill": "train.steps", "dpo": "dpo.steps", "rm": "rm.steps"}


def default_run_dir(name: str) -> Path:
    """`runs/<name>-<timestamp>` (relative to the working directory): where a run goes when no run
    directory is given - by the Python API and by every command alike."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def enclosing_run(path: str | os.PathLike[str]) -> Path | None:
    """The run directory that holds `path` (a model inside `<run>/final_model` or a checkpoint), if any."""
    p = Path(path)
    for cand in (p, *list(p.parents)[:3]):
        if (cand / RUN_FILE).is_file() or (cand / "config.yaml").is_file():
            return cand
    return None


def compute_parents(cfg: Any, run_dir: str | os.PathLike[str]) -> tuple[str, ...]:
    """The runs this one starts from (its model, teacher, merged models), relative to `run_dir`."""
    out: list[str] = []
    for key, many in MODEL_KEYS:
        value = _get(cfg, key)
        for ref in (value or []) if many else [value]:
            if isinstance(ref, str) and ref and (parent := enclosing_run(ref)) is not None:
                rel = relative_to_run(run_dir, parent)
                if rel not in out and rel != ".":
                    out.append(rel)
    return tuple(out)


def do_start_record(run_dir: str | os.PathLike[str], cfg: Any, kind: str, members: Sequence[dict] = ()) -> RunRecord:
    """The record of a run that opens now (status `running`): its kind, planned steps, LoRA,
    prompt format, parent runs and re-rootable references."""
    stage_names = tuple(s.name for s in cfg.pipeline.stages if s.name) if hasattr(cfg, "pipeline") else ()
    planned = _get(cfg, PLANNED_STEPS[kind]) if kind in PLANNED_STEPS else None
    record = RunRecord(kind=kind, status="running", steps_planned=planned,
                       lora=getattr(cfg.model, "lora", None) is not None, chat_template=bool(cfg.data.chat),
                       parents=compute_parents(cfg, run_dir),
                       refs=compute_refs(cfg.model_dump(mode="json"), run_dir, names=stage_names),
                       members=tuple(members))
    write_record(run_dir, record)
    return record


def do_finish_run(run_dir: str | os.PathLike[str], summary: dict[str, Any], result: str | os.PathLike[str] | None,
                  step: int | None = None) -> RunRecord:
    """Record how the run ended (complete, or interrupted: `summary["interrupted"]`) and its result
    model (`result`: a directory inside the run, or the model a run without training hands on)."""
    rel = None if result is None else relative_to_run(run_dir, result)
    status = "interrupted" if summary.get("interrupted") else "complete"
    return update_record(run_dir, status=status, result=rel, result_step=step)


def do_set_members(run_dir: str | os.PathLike[str], members: Sequence[dict[str, Any]], status: str | None = None) -> RunRecord:
    """A multi-run's members (name, kind, path relative to it, status): which runs belong to it."""
    changes: dict[str, Any] = {"members": tuple(dict(m) for m in members)}
    if status is not None:
        changes["status"] = status
    return update_record(run_dir, **changes)


__all__ = ["compute_parents", "default_run_dir", "do_finish_run", "do_set_members", "do_start_record", "enclosing_run"]
