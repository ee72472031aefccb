"""Which model is a run's result: one function, `resolve_result`, that every command asks.

* A finished run's result is its final model: `final_model/` (SFT, rs_sft, DPO, merge, RM) or the
  final checkpoint (RL, distill: the RL loop saves one at its last step) — never a periodic
  checkpoint older than the run's end (with `sft.steps=50` and `checkpoint.every=20`, the result
  is the step-50 model, not `checkpoints/step_000040`).
* A checkpoint only when asked (`step=N`, the commands' `--step N`), or when the run did not
  finish (interrupted, halted, killed): then its last model, and `Result.note` says so in one line
  for the command to print.
* A pipeline's result is its last stage's result; the demo's is its RL stage's. Runs made of
  independent runs (a sweep, a context comparison, a fault benchmark) have no single result:
  `NoSingleResult` names the member runs to ask instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tether.errors import UserError
from tether.io.checkpoint import checkpoint_name, checkpoint_step, find_latest_checkpoint, verify_checkpoint
from tether.runs.record import MULTI_KINDS, RunRecord, read_record

FINAL = "final_model"


class NoResult(UserError):
    """The run has no model to use (not trained yet, or the asked step is not there); names what is."""


class NoSingleResult(UserError):
    """A sweep / comparison / benchmark: one result per member run; the message names them."""


@dataclass(frozen=True)
class Result:
    """A run's result model: `path` (a model or LoRA adapter directory), the step it was saved at
    (None: not known, e.g. a merge), and `note`: one line for the user when it is not the final
    model of a finished run (interrupted, killed, a chosen step), else None."""

    path: Path
    step: int | None = None
    note: str | None = None
    run: Path | None = None


def is_model_dir(path: Path) -> bool:
    """A Hugging Face model directory or a LoRA adapter (peft format)."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def _summary(run: Path) -> dict | None:
    try:
        s = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def _finished(summary: dict | None) -> bool:
    return bool(summary) and not summary.get("interrupted") and summary.get("complete", True) is not False \
        and not summary.get("interrupted_in")


def resolve_result(run_dir: str | Path, step: int | None = None) -> Result:
    """The result model of the run at `run_dir` (see the module doc); raises NoResult /
    NoSingleResult (exit 2 from the CLI) with a message that names what to do instead."""
    run = Path(run_dir)
    rec = read_record(run)
    kind = rec.kind or (_summary(run) or {}).get("kind")
    if kind in MULTI_KINDS or (kind is None and _legacy_stages(run)):
        return _multi_result(run, rec, kind, step)
    if step is not None:
        return _at_step(run, step)
    return _single_result(run, rec)


def _at_step(run: Path, step: int) -> Result:
    ckpt = run / "checkpoints" / checkpoint_name(step)
    problem = verify_checkpoint(ckpt) if ckpt.is_dir() else "missing"
    if problem is not None:
        have = sorted(checkpoint_step(p) for p in (run / "checkpoints").glob("step_*")
                      if p.is_dir() and not p.name.endswith(".corrupt")) if (run / "checkpoints").is_dir() else []
        listed = ", ".join(str(s) for s in have) or "none"
        raise NoResult(f"{run}: no usable checkpoint at step {step} ({problem}); checkpoints kept: {listed} "
                       "(drop --step for the run's result)")
    return Result(ckpt, step, f"using checkpoints/{ckpt.name} (--step {step}), not the run's final model", run)


def _single_result(run: Path, rec: RunRecord) -> Result:
    summary = _summary(run)
    steps = rec.steps_planned
    if rec.result and rec.status in ("complete", "interrupted") and is_model_dir(run / rec.result):
        note = None
        if rec.status == "interrupted":
            note = (f"{run} was interrupted at step {rec.result_step}" + (f" of {steps}" if steps else "")
                    + f": using its last model ({rec.result})")
        return Result(Path(os.path.normpath(run / rec.result)), rec.result_step, note, run)
    # no recorded result: a run written before the record, or one that stopped without finishing
    final = run / FINAL
    finished = _finished(summary)
    if is_model_dir(final) and summary is not None:
        note = None if finished else f"{run} was interrupted at step {summary.get('steps')}: using its last model ({FINAL})"
        return Result(final, summary.get("steps"), note, run)
    ckpt = find_latest_checkpoint(run)
    if ckpt is not None:
        at = checkpoint_step(ckpt)
        if finished and summary.get("steps") in (None, at) and rec.kind not in ("sft", "rs_sft", "dpo"):
            return Result(ckpt, at, None, run)  # an RL-style run's final checkpoint
        return Result(ckpt, at, f"{run} did not finish: using its latest checkpoint ({ckpt.name})", run)
    if is_model_dir(final):
        return Result(final, None, f"{run} did not finish: using its {FINAL}/", run)
    raise NoResult(f"{run}: no result model yet (no {FINAL}/ and no checkpoint); "
                   "train it first, or resume it with --resume")


def _legacy_stages(run: Path) -> list[Path]:
    """Sub-runs of a pipeline directory written before the record (the demo's sft/, rl/)."""
    return [run / s for s in ("sft", "rl") if (run / s / "config.yaml").is_file()]


def _multi_result(run: Path, rec: RunRecord, kind: str | None, step: int | None) -> Result:
    if kind in ("sweep", "compare_context", "faultbench"):
        some = ", ".join(str(run / m["path"]) for m in rec.members[:3]) or f"the runs under {run}"
        raise NoSingleResult(f"{run} is a {kind} of {len(rec.members) or 'several'} runs with one result each: "
                             f"pass one of them ({some}{', ...' if len(rec.members) > 3 else ''}; "
                             f"`tether show {run}` lists them)")
    stages = [run / m["path"] for m in rec.members] or _legacy_stages(run)
    done = [s for s in stages if _has_result(s)]
    if not done:
        raise NoResult(f"{run}: no stage has a result model yet; resume the pipeline with --resume")
    last = done[-1]
    if step is not None:
        raise NoResult(f"{run} is a pipeline: --step N names a checkpoint of one stage; pass the stage "
                       f"directory ({last}) with --step")
    res = resolve_result(last)
    note = res.note
    if last != stages[-1]:
        note = f"{run} stopped after stage {last.name} ({len(done)} of {len(stages)}): using that stage's result"
    return Result(res.path, res.step, note, last)


def _has_result(stage: Path) -> bool:
    try:
        resolve_result(stage)
    except (NoResult, NoSingleResult):
        return False
    return True


__all__ = ["FINAL", "NoResult", "NoSingleResult", "Result", "is_model_dir", "resolve_result"]
