"""Opening a run directory: never clobber a run, resume only from a checkpoint the config fits.

    start = do_open_run(run_dir, cfg, "rl", resume=resume, overwrite=overwrite)
    start.run_dir, start.checkpoint, start.changes

The rules (docs/resume.md):

* A directory that holds a run (config.yaml, metrics.jsonl, summary.json, run.json or a
  checkpoint) is refused without `--resume` (`RunDirError`, exit 2 from the CLI, naming the two
  ways forward: `--resume`, or `--overwrite`, which deletes it first).
* `--resume` on a directory without a usable checkpoint (none yet, a kill before or during the
  first checkpoint, or every checkpoint damaged) starts from step 0, says so, and clears the
  outputs of the abandoned attempt, so no step is logged twice.
* `--resume` with a checkpoint compares the new config with the stored config.yaml. A change in
  `RESUMABLE` (steps, LR, group size, evaluation, logging, checkpoint cadence, health, devices
  and speed settings) is applied, printed, and recorded in `events.jsonl`; any other change
  (model, data, algorithm, optimizer, reward, environment, seed) would make the checkpoint
  inapplicable or the run a different experiment, and is refused with the differing keys. An
  SFT run is not resumed by `tether train`, nor an RL run by `tether sft`.
* Everything after the checkpoint's step (metrics rows, health events, sample files) is dropped
  on resume: those steps are redone, exactly (tests/integration/test_resume_kill.py).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from tether.config_text import ConfigError
from tether.io.checkpoint import find_latest_checkpoint
from tether.io.run_dir import RunDir, do_append_jsonl, do_truncate_jsonl_after, make_run_dir
from tether.runs.lifecycle import do_start_record
from tether.runs.record import RUN_FILE
EVENTS_FILE = "events.jsonl"
# Settings a resumed run may change (dotted key or section prefix ending in "."). train.lr/sft.lr
# are applied to the restored optimizer (`do_apply_lr`); rollout.n and
# rollout.problems_per_step change how many samples later steps draw, not what was learned.
RESUMABLE = (
    "train.steps", "train.lr", "train.micro_batch_tokens", "train.pack_sequences", "train.share_prefix",
    "train.compile", "train.max_bad_steps", "sft.steps", "sft.lr", "rollout.n", "rollout.problems_per_step",
    "rollout.batch_size", "eval.", "logging.", "checkpoint.", "health.", "dist.", "run.name", "run.threads",
    "run.retain_memory", "model.device", "model.gradient_checkpointing",
)
# the command that continues each kind of run (what a refusal names)
COMMANDS = {"rl": "tether train", "sft": "tether sft", "demo": "tether pipeline", "pipeline": "tether pipeline",
            "distill": "tether pipeline (its distill stage)", "rm": "tether rm", "merge": "tether pipeline (its merge stage)",
            "dpo": "tether pipeline (its dpo stage)", "rs_sft": "tether pipeline (its rs_sft stage)",
            "eval": "tether pipeline (its eval stage)", "sweep": "tether sweep --out", "rl_async": "tether train-async",
            "compare_context": "tether compare-context", "faultbench": "tether faultbench --out"}
_SAMPLE_RE = re.compile(r"^[a-z_]+_(\d+)(?:-\d+)?\.jsonl\.gz$")


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message names the ways forward (exit 2)."""


@dataclass(frozen=True)
class RunStart:
    """An opened run directory: where to resume from (None: step 0) and the config changes."""

    run_dir: RunDir
    checkpoint: Path | None = None
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def compute_config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every leaf that differs (a key missing on one side is None)."""
    a, b = _flatten(old), _flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def is_resumable_change(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE)


def _holds_run(path: Path) -> list[str]:
    """The files that mark `path` as a run directory (empty: free to use)."""
    found = [n for n in ("config.yaml", "metrics.jsonl", "summary.json", RUN_FILE) if (path / n).is_file()]
    ckpts = path / "checkpoints"
    if ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()):
        found.append("checkpoints/")
    return found


def stored_kind(path: Path) -> str | None:
    """What kind of run `path` holds (run.json; summary.json for runs written before run.json)."""
    for name in (RUN_FILE, "summary.json"):
        try:
            kind = json.loads((path / name).read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(kind, str):
            return kind
    return None


def do_log_event(rd: RunDir, record: dict[str, Any], log: Callable[[str], None] | None = None) -> None:
    """Append one record to `<run>/events.jsonl` and print its message."""
    do_append_jsonl(rd.root / EVENTS_FILE, record)
    (log or _print)(f"[tether] {record['message']}")


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def do_truncate_outputs(rd: RunDir, step: int) -> None:
    """Drop what a run wrote after `step` (step -1: everything): metrics, health and settings rows,
    samples, and, from step 0, the summary, plots and TensorBoard files."""
    for path in (rd.metrics_path, rd.health_path, rd.settings_path):
        if step < 0:
            path.unlink(missing_ok=True)
        else:
            do_truncate_jsonl_after(path, step)
    if rd.samples_dir.is_dir():
        for f in rd.samples_dir.iterdir():
            m = _SAMPLE_RE.match(f.name)
            if m and int(m.group(1)) > step:
                f.unlink()
    if step < 0:
        rd.summary_path.unlink(missing_ok=True)
        for d in (rd.tb_dir, rd.plots_dir):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True, exist_ok=True)


def check_kind(path: str | Path, kind: str) -> None:
    """`--resume` of a directory that holds another kind of run is refused, naming the command that resumes it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run directory: choose another --run-dir")
    if path.is_dir() and (old := stored_kind(path)) not in (None, kind):
        raise RunDirError(f"{path} holds a {old} run: resume it with `{COMMANDS.get(old, old)} ... --resume`, "
                          f"not `{COMMANDS.get(kind, kind)}`")


def do_open_run(path: str | Path, cfg: Any, kind: str, resume: bool = False, overwrite: bool = False,
                log: Callable[[str], None] | None = None) -> RunStart:
    """Open `path` for a `kind` run ("rl", "sft", "demo", "pipeline") under the rules above.

    Writes the config and `run.json`; raises `RunDirError` when the directory cannot be used."""
    path = Path(path)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or replace it")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run directory: choose another --run-dir")
    markers = _holds_run(path) if path.is_dir() else []
    if markers and overwrite:
        shutil.rmtree(path)
        (log or _print)(f"[tether] --overwrite: deleted the previous run in {path}")
        markers = []
    if markers and not resume:
        raise RunDirError(f"{path} already holds a run ({', '.join(markers)}): continue it with --resume, or replace "
                          "it with --overwrite (deletes it), or choose another --run-dir")
    if markers:
        check_kind(path, kind)
    rd = make_run_dir(path)
    start = RunStart(rd)
    if resume:
        start = _resume_point(rd, cfg, bool(markers), log)
    rd.write_config(cfg)
    do_start_record(rd.root, cfg, kind)  # run.json: kind, status running, references (tether.runs.record)
    return start


def _resume_point(rd: RunDir, cfg: Any, had_run: bool, log: Callable[[str], None] | None) -> RunStart:
    def skipped(message: str) -> None:
        do_log_event(rd, {"kind": "checkpoint_skipped", "message": message}, log)

    ckpt = find_latest_checkpoint(rd, move_aside=True, log=skipped) if had_run else None
    if ckpt is None:
        why = "no usable checkpoint" if had_run else "no run yet"
        do_truncate_outputs(rd, -1)
        do_log_event(rd, {"kind": "resume_fresh", "step": 0,
                          "message": f"--resume: {why} in {rd.root}; starting from step 0"}, log)
        return RunStart(rd)
    step = int(ckpt.name.removeprefix("step_"))
    stored = yaml.safe_load(rd.config_path.read_text()) if rd.config_path.is_file() else None
    changes = compute_config_changes(stored, cfg.model_dump(mode="json")) if isinstance(stored, dict) else {}
    refuse_changes(rd, changes, is_resumable_change, "its checkpoint does not apply to that")
    do_truncate_outputs(rd, step)
    listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items()) or "none"
    do_log_event(rd, {"kind": "resume", "step": step, "checkpoint": ckpt.name,
                      "resume_changes": {k: list(v) for k, v in changes.items()},
                      "message": f"resuming {rd.root} from {ckpt.name}; config changes: {listed}"}, log)
    return RunStart(rd, ckpt, changes)


def refuse_changes(rd: RunDir, changes: dict[str, tuple[Any, Any]], allowed: Callable[[str], bool], why: str) -> None:
    """Raise RunDirError naming every change `allowed` rejects (the one wording of every resume)."""
    refused = {k: v for k, v in changes.items() if not allowed(k)}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise RunDirError(f"cannot resume {rd.root} with a changed config ({listed}): {why}; undo these changes, "
                          "or start a new run (another --run-dir, or --overwrite)")


def check_config_resume(rd: RunDir, stored: dict[str, Any], new: dict[str, Any], allowed: Callable[[str], bool],
                        why: str, log: Callable[[str], None] | None = None) -> dict[str, tuple[Any, Any]]:
    """The resume rule of runs made of other runs (a pipeline, a context comparison): the changes
    from `stored` to `new` that `allowed` accepts are returned and recorded in events.jsonl; any
    other is refused with each differing key, before anything is written."""
    changes = compute_config_changes(stored, new)
    refuse_changes(rd, changes, allowed, why)
    if changes:
        listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        do_log_event(rd, {"kind": "resume", "resume_changes": {k: list(v) for k, v in changes.items()},
                          "message": f"resuming {rd.root}; config changes: {listed} (finished parts keep their results)"},
                     log)
    return changes


def do_apply_lr(optimizer: Any, scheduler: Any, lr: float, group: int = 0) -> None:
    """Set a restored optimizer's base LR for `group` (the schedule's current factor kept):
    `load_state_dict` brings back the LR of the checkpoint, which a resume with a new
    `train.lr` replaces."""
    if scheduler is not None and getattr(scheduler, "base_lrs", None):
        old = scheduler.base_lrs[group]
        scheduler.base_lrs[group] = lr
        factor = optimizer.param_groups[group]["lr"] / old if old else 1.0
        optimizer.param_groups[group]["lr"] = lr * factor
    else:
        optimizer.param_groups[group]["lr"] = lr
