"""What every CLI command shares (`tether.cli` and the `tether.commands.*` modules): one-line errors
with their exit codes (2: input the user can fix; 1: a failed run or a bug), loading a config,
the default run directory, tidying a run directory a failed command created, the common arguments
and the summary printout."""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from tether.runs.lifecycle import default_run_dir

DEBUG = False  # --debug: errors propagate with their traceback instead of one line
# An OSError with one of these errnos is the user's environment (path, permissions, disk), not a bug.
USER_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
               errno.ENOENT, errno.EDQUOT, errno.ENAMETOOLONG}


def describe_error(err: BaseException) -> tuple[str, int]:
    """(one-line message, exit code): 2 for input the user can fix, 1 for a failed run or a bug."""
    from tether.errors import UserError

    one_line = " ".join(str(err).split())
    if isinstance(err, UserError):
        return one_line, 2
    if isinstance(err, OSError) and err.errno is None:  # raised with a message of ours, e.g. FileNotFoundError(path)
        return one_line, 2 if isinstance(err, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                                                PermissionError, FileExistsError)) else 1
    if isinstance(err, OSError):
        name = errno.errorcode.get(err.errno, str(err.errno))
        where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f) or "a file"
        fix = {errno.ENOSPC: "free disk space or choose another --run-dir", errno.EDQUOT: "free disk space",
               errno.EROFS: "choose a --run-dir on a writable file system"}.get(err.errno, "check the path")
        return f"cannot use {where}: {err.strerror} ({name}); {fix}", 2 if err.errno in USER_ERRNOS else 1
    if isinstance(err, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({err}); save it as UTF-8", 2
    if isinstance(err, run_failures()):
        return one_line, 1
    return f"{type(err).__name__}: {one_line} (an internal error; rerun with --debug for the traceback)", 1


class OneLineErrors(TyperGroup):
    """Every exception a command lets through becomes one line on stderr (see `describe_error`)."""

    def invoke(self, ctx: Any) -> Any:
        global DEBUG
        DEBUG, formatwarning = bool(ctx.params.get("debug")), warnings.formatwarning
        if not DEBUG:  # warnings as one line each, not "file:line: UserWarning" plus a source line
            warnings.formatwarning = lambda msg, *_a, **_k: f"tether: warning: {msg}\n"
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # usage errors and exits of our own
            raise
        except Exception as err:
            if DEBUG:
                raise
            message, code = describe_error(err)
            typer.echo(f"tether: error: {message}", err=True)
            raise typer.Exit(code) from None
        finally:
            DEBUG, warnings.formatwarning = False, formatwarning



def fail(message: str, code: int = 2) -> None:
    """Print a one-line error and exit (2 = invalid use)."""
    typer.echo(f"tether: error: {message}", err=True)
    raise typer.Exit(code)


def fail_on(err: Exception) -> None:
    """Fail with `err` as one line and its exit code (`describe_error`); re-raise it under --debug."""
    if DEBUG:
        raise err
    message, code = describe_error(err)
    fail(message, code)


def offline_env() -> None:
    """Never reach a model or dataset hub: everything is built or read locally."""
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_config_or_fail(config: Optional[Path], overrides: List[str]) -> Any:
    """The validated config, or a one-line error naming the key and the fix (exit 2)."""
    from tether.config import ConfigError, load_config

    try:
        return load_config(config, overrides)
    except ConfigError as err:
        fail_on(err)


def run_failures() -> tuple[type[Exception], ...]:
    """Errors that end a run with a message naming the cause (exit 1): not bugs, not bad input."""
    from tether.rollout.runner import EnvFailure
    from tether.policy.chat import TokenizationDrift
    from tether.rewards import RewardFailure
    from tether.io.checkpoint import CheckpointError
    from tether.train.step import TrainingHalted

    return (RewardFailure, TrainingHalted, EnvFailure, TokenizationDrift, CheckpointError)


def known_errors() -> tuple[type[Exception], ...]:
    """What a command catches to tidy up its run directory before failing with one line."""
    from tether.errors import UserError

    return (UserError, OSError) + run_failures()


def fail_run(rd: Path, existed: bool, err: Exception) -> None:
    """Fail with `err`; a run directory this command created that holds nothing but its config goes."""
    files = [f for f in rd.rglob("*") if f.is_file() and f.name not in ("config.yaml", "run.json")] if rd.is_dir() else [None]
    if not existed and not files:
        shutil.rmtree(rd, ignore_errors=True)
        typer.echo(f"(removed the empty run directory {rd})", err=True)
    fail_on(err)


CONFIG_ARG = typer.Argument(..., help="YAML config (see configs/)")
OVERRIDES_ARG = typer.Argument(None, help="key.path=value overrides")
RUN_DIR_OPT = typer.Option(None, "--run-dir", help="default: runs/<config name>-<timestamp>")
RESUME_OPT = typer.Option(False, "--resume", help="continue from the run directory's latest good checkpoint "
                          "(none: start from step 0); the config may change only steps, lr, eval, logging, ... (docs/resume.md)")
OVERWRITE_OPT = typer.Option(False, "--overwrite", help="replace (delete) an existing run in --run-dir; without it "
                             "(or --resume) an existing run is refused")
STEP_OPT = typer.Option(None, "--step", help="a checkpoint of the run (checkpoints/step_N) instead of its result model")


def note(message: str) -> None:
    """One line to the user about what a command is working on (e.g. an interrupted run's last model)."""
    typer.echo(f"tether: note: {message}", err=True)


def start_command(config: Optional[Path], overrides: Optional[List[str]]) -> Any:
    """A command's opening: no hub access, then the validated config (or a one-line error, exit 2)."""
    offline_env()
    return load_config_or_fail(config, list(overrides or []))


def run_in_dir(rd: Path, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `body()` writing into the run directory `rd` (named first): on a known error, a directory it
    created for nothing goes and the command fails with one line; else its summary is printed."""
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        summary = body()
    except known_errors() as err:
        fail_run(rd, existed, err)
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """A run's summary.json, its top-level numbers one per line."""
    keys = [k for k in summary if not isinstance(summary[k], dict)]
    for k in keys:
        v = summary[k]
        typer.echo(f"  {k:28s} {v:.4f}" if isinstance(v, float) else f"  {k:28s} {v}")


__all__ = [
    "CONFIG_ARG", "OVERRIDES_ARG", "OVERWRITE_OPT", "RESUME_OPT", "RUN_DIR_OPT", "STEP_OPT", "OneLineErrors", "default_run_dir",
    "describe_error", "fail", "fail_on", "fail_run", "known_errors", "load_config_or_fail", "note", "offline_env",
    "print_summary", "run_failures", "run_in_dir", "start_command",
]
