"""The run record: `<run>/run.json`, what a run directory is and what it produced.

    {"format": 1, "kind": "sft", "status": "complete", "result": "final_model", "result_step": 50,
     "steps_planned": 50, "lora": false, "chat_template": false, "parents": ["../sft"],
     "refs": {"data.path": {"rel": "../../data/train.parquet", "abs": "/home/u/proj/data/train.parquet"}},
     "members": [{"name": "sft", "kind": "sft", "path": "sft"}]}

* `kind`: what wrote the directory (`KINDS`); a command that takes a run asks the kind what it
  can do with it (tether.runs.commands).
* `status`: `running` (written when the run opens; a run killed mid-way stays `running`),
  `complete`, `interrupted` (Ctrl-C, a health halt: its last model is kept) or `failed`.
* `result`: the run's result model, relative to the run directory (`final_model`, or the final
  checkpoint of an RL-style run); `tether.runs.result.resolve_result` is the one place that reads it.
* `chat_template`: whether training rendered prompts through the tokenizer's chat template
  (`data.chat`), for the tools that must feed the model the same way.
* `parents` (runs this one started from) and `members` (a pipeline's stages, a sweep's runs) are
  paths relative to this run directory; `refs` are the files the config names, re-rootable
  (tether.runs.refs). A run works from any working directory and after its directory is moved.

The file is replaced atomically; a run written before the record existed (`{"kind": ...}` only,
or nothing) still resolves: every field has a default that `read_record` fills in.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tether.io.run_dir import write_text_atomic

RUN_FILE = "run.json"
FORMAT = 1
# The kinds of run directories, and the command that writes each.
KINDS = {
    "sft": "tether sft", "rl": "tether train", "rl_async": "tether train-async", "distill": "a pipeline's distill stage",
    "dpo": "a pipeline's dpo stage", "rs_sft": "a pipeline's rs_sft stage", "merge": "a pipeline's merge stage",
    "rm": "tether rm", "eval": "a pipeline's eval stage", "pipeline": "tether pipeline", "demo": "tether demo",
    "sweep": "tether sweep", "compare_context": "tether compare-context", "faultbench": "tether faultbench",
}
MULTI_KINDS = ("pipeline", "demo", "sweep", "compare_context", "faultbench")  # runs made of member runs
STATUSES = ("running", "complete", "interrupted", "failed")


@dataclass(frozen=True)
class RunRecord:
    """The parsed run.json (see the module doc); paths are relative to the run directory."""

    kind: str | None = None
    status: str | None = None  # None: a record written before statuses (tether.api.run infers it)
    result: str | None = None
    result_step: int | None = None
    steps_planned: int | None = None
    lora: bool = False
    chat_template: bool = False
    parents: tuple[str, ...] = ()
    refs: dict[str, Any] = field(default_factory=dict)
    members: tuple[dict[str, Any], ...] = ()
    format: int = FORMAT

    @property
    def is_multi(self) -> bool:
        return self.kind in MULTI_KINDS

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["parents"], d["members"] = list(self.parents), [dict(m) for m in self.members]
        return {"format": d.pop("format"), **d}


def read_record(run_dir: str | os.PathLike[str]) -> RunRecord:
    """The record of `run_dir` (defaults for a run without one, or with an older, shorter one)."""
    path = Path(run_dir) / RUN_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    if not isinstance(raw, dict):
        raw = {}
    known = {f for f in RunRecord.__dataclass_fields__}
    data = {k: v for k, v in raw.items() if k in known}
    data["parents"] = tuple(data.get("parents") or ())
    data["members"] = tuple(data.get("members") or ())
    data["refs"] = dict(data.get("refs") or {})
    return RunRecord(**data)


def write_record(run_dir: str | os.PathLike[str], record: RunRecord) -> Path:
    """Replace `<run>/run.json` atomically (readers see the old or the new record, never half)."""
    path = Path(run_dir) / RUN_FILE
    write_text_atomic(path, json.dumps(record.to_json(), indent=1) + "\n")
    return path


def update_record(run_dir: str | os.PathLike[str], **changes: Any) -> RunRecord:
    """Read, change the given fields, write back; returns the new record."""
    record = replace(read_record(run_dir), **changes)
    write_record(run_dir, record)
    return record


def relative_to_run(run_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """`path` relative to the run directory (`..` where needed), for a record that must survive a move."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(run_dir))


__all__ = ["KINDS", "MULTI_KINDS", "RUN_FILE", "RunRecord", "read_record", "relative_to_run", "update_record",
           "write_record"]
