"""The `tether` command.

    tether demo                       build a tiny model, SFT, GRPO, evaluate, plot (the embedded default)
    tether train CONFIG [k=v ...]     RL (recipes/rl.py)
    tether sft CONFIG [k=v ...]       supervised cold start (recipes/sft.py)
    tether eval RUN_DIR|CONFIG        held-out evaluation of a run's final checkpoint or a config's model
    tether show RUN_DIR               a summary of a run

Invalid use exits with code 2 and a one-line error (any `tether.errors.UserError`, or an OSError
such as a full or read-only disk, naming the path); a failed run exits 1 naming the cause; nothing
prints a traceback unless `tether --debug COMMAND ...`. Further commands (doctor, faultbench, plan,
fit, report, compare) register themselves from `tether.commands.*` modules.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import pkgutil
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, List, Optional

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

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
    if isinstance(err, _run_failures()):
        return one_line, 1
    return f"{type(err).__name__}: {one_line} (an internal error; rerun with --debug for the traceback)", 1


class _OneLineErrors(TyperGroup):
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


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tether: reinforcement fine-tuning of LLMs and LLM agents.")


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the full traceback of an error")) -> None:
    """tether: reinforcement fine-tuning of LLMs and LLM agents."""  # --debug is read by _OneLineErrors.invoke


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


def _offline_env() -> None:
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(config: Optional[Path], overrides: List[str]):
    from tether.config import ConfigError, load_config

    try:
        return load_config(config, overrides)
    except ConfigError as err:
        fail_on(err)


def default_run_dir(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run_failures() -> tuple[type[Exception], ...]:
    """Errors that end a run with a message naming the cause (exit 1): not bugs, not bad input."""
    from tether.rollout.runner import EnvFailure
    from tether.policy.chat import TokenizationDrift
    from tether.rewards import RewardFailure
    from tether.io.checkpoint import CheckpointError
    from tether.train.update import TrainingHalted

    return (RewardFailure, TrainingHalted, EnvFailure, TokenizationDrift, CheckpointError)


def _known_errors() -> tuple[type[Exception], ...]:
    """What a command catches to tidy up its run directory before failing with one line."""
    from tether.errors import UserError

    return (UserError, OSError) + _run_failures()


def _fail_run(rd: Path, existed: bool, err: Exception) -> None:
    """Fail with `err`; a run directory this command created that holds nothing but its config goes."""
    files = [f for f in rd.rglob("*") if f.is_file() and f.name not in ("config.yaml", "run.json")] if rd.is_dir() else [None]
    if not existed and not files:
        shutil.rmtree(rd, ignore_errors=True)
        typer.echo(f"(removed the empty run directory {rd})", err=True)
    fail_on(err)


def _run_recipe(kind: str, config: Path, overrides: List[str], run_dir: Optional[Path], resume: bool,
                overwrite: bool = False) -> None:
    """Shared body of `train` and `sft` over the Python API (tether.sft / tether.train): pick the
    run dir, run, summarise."""
    from tether.api.training import sft as run_sft, train as run_train

    _offline_env()
    cfg = _load(config, overrides)
    if resume and run_dir is None:
        fail("--resume needs --run-dir DIR (the run to continue)")
    rd = run_dir or default_run_dir(cfg.run.name + ("-sft" if kind == "sft" else ""))
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        run = (run_sft if kind == "sft" else run_train)(cfg, rd, resume=resume, overwrite=overwrite)
    except _known_errors() as err:
        _fail_run(rd, existed, err)
    _print_summary(run.summary)
    typer.echo(f"run directory: {rd}")


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


@app.command()
def train(config: Path = CONFIG_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
          run_dir: Optional[Path] = RUN_DIR_OPT, resume: bool = RESUME_OPT, overwrite: bool = OVERWRITE_OPT) -> None:
    """Run RL (GRPO by default) from a config."""
    _run_recipe("rl", config, overrides or [], run_dir, resume, overwrite)


@app.command()
def sft(config: Path = CONFIG_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
        run_dir: Optional[Path] = RUN_DIR_OPT, resume: bool = RESUME_OPT, overwrite: bool = OVERWRITE_OPT) -> None:
    """Supervised fine-tuning on demonstrations (cold start); writes final_model/."""
    _run_recipe("sft", config, overrides or [], run_dir, resume, overwrite)


@app.command()
def demo(
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/demo-<timestamp>"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides of configs/demo.yaml"),
    overwrite: bool = OVERWRITE_OPT,
) -> None:
    """The embedded default: tiny model built locally -> SFT -> GRPO -> held-out eval -> plots."""
    _offline_env()
    from tether.config import ConfigError
    from tether.recipes.demo import run_demo

    rd = run_dir or default_run_dir("demo")
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        summary = run_demo(rd, overrides or [], overwrite=overwrite)
    except ConfigError as err:
        fail_on(err)
    except _known_errors() as err:
        _fail_run(rd, existed, err)
    _print_summary(summary)
    typer.echo(f"run directory: {rd}")


@app.command("eval")
def eval_cmd(
    target: Path = typer.Argument(..., help="a run directory (its result model; a pipeline's last stage; a reward "
                                  "model's held-out pair accuracy), a checkpoint directory, or a YAML config"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides, e.g. eval.samples=16 eval.best_of=reward"),
    out: Optional[Path] = typer.Option(None, "--out", help="where to write eval.json (default: the run dir)"),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="write plots/eval_tts.png (pass@k, maj@k, best@k vs k)"),
    step: Optional[int] = STEP_OPT,
) -> None:
    """Held-out pass@k, maj@k, best@k (k = 1..eval.samples) and greedy accuracy -> eval.json."""
    _offline_env()
    from tether.api.evaluate import run_eval_command

    try:
        metrics, path = run_eval_command(target, overrides or [], out, plot=plot, step=step, log=note)
    except _known_errors() as err:
        fail_on(err)
    for k, v in sorted(metrics.items()):
        typer.echo(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    typer.echo(f"wrote {path}")


@app.command()
def show(run_dir: Path = typer.Argument(..., help="a run directory of any kind (a pipeline, a sweep, ...)")) -> None:
    """A summary of a run: kind, result model, config highlights, metrics, stages or arms, checkpoints."""
    from tether.show import render_run_summary

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a directory")
    try:
        typer.echo(render_run_summary(run_dir))
    except _known_errors() as err:
        fail_on(err)


def _print_summary(summary: dict[str, Any]) -> None:
    keys = [k for k in summary if not isinstance(summary[k], dict)]
    for k in keys:
        v = summary[k]
        typer.echo(f"  {k:28s} {v:.4f}" if isinstance(v, float) else f"  {k:28s} {v}")


def _register_plugins() -> None:
    """Each module in tether.commands exposes `register(app)` (doctor, faultbench, plan, ...)."""
    try:
        import tether.commands as pkg
    except ImportError:
        return
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"tether.commands.{info.name}")
        if hasattr(mod, "register"):
            mod.register(app)


_register_plugins()


def main() -> None:  # pragma: no cover - console entry
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
