"""`tether.export` / `tether export`: a run's result model as a plain Hugging Face model directory.

* A run directory exports its result model (tether.runs.result: the final model, never a stale
  periodic checkpoint; `step=N` a chosen checkpoint); a pipeline its last stage's result; a
  reward-model run its classifier (`AutoModelForSequenceClassification`) as it is.
* A LoRA adapter is merged into its base (`merge_and_unload`), so that
  `AutoModelForCausalLM.from_pretrained(out)` loads the result with no peft installed.
* The model is written into a temporary folder beside `out` and renamed into place at the end: a
  failed export leaves no half-written `out` to block the retry (and removes its temporary folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from tether.api.run import Run, open_run
from tether.errors import UserError
from tether.runs.lifecycle import enclosing_run
from tether.runs.result import is_model_dir


def _source(target: str | Path | Run, step: int | None) -> tuple[Path, str | None, str | None]:
    """(model directory, run kind, note) of what `target` exports."""
    if isinstance(target, Run):
        run = target
    else:
        target = Path(target)
        if not target.is_dir():
            raise UserError(f"{target}: no such directory (a run directory or a checkpoint is expected)")
        if is_model_dir(target):  # a checkpoint or final_model/ given directly
            owner = enclosing_run(target.parent)
            return target, open_run(owner).kind if owner is not None else None, None
        run = open_run(target)
    res = run.result(step)
    kind = open_run(res.run).kind if res.run is not None and res.run != run.path else run.kind
    return res.path, kind, res.note


def export(target: str | Path | Run, out: str | Path, step: int | None = None,
           log: Callable[[str], None] | None = None) -> Path:
    """Write `target`'s result model to `out` (a new or empty directory); returns `out`."""
    model_dir, kind, note = _source(target, step)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: the {'directory' if out.is_dir() else 'path'} exists and is not empty; "
                        "choose a new one")
    if note and log is not None:
        log(note)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if kind == "rm":  # a classifier, not a causal LM: its directory is already the plain model
            shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("*.pt", "manifest.json"))
        else:
            _write_plain(model_dir, tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_plain(model_dir: Path, out: Path) -> None:
    from tether.policy.hf import load_policy

    policy = load_policy(model_dir)  # a LoRA adapter is merged into its base here
    policy.model.save_pretrained(str(out), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(out))


__all__ = ["export"]
