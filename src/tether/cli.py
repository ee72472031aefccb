"""The `tether` command.

    tether demo                       build a tiny model, SFT, GRPO, evaluate, plot (the embedded default)
    tether train CONFIG [k=v ...]     RL (recipes/rl.py)
    tether sft CONFIG [k=v ...]       supervised cold start (recipes/sft.py)
    tether eval RUN_DIR|CONFIG        held-out evaluation of a run's final checkpoint or a config's model
    tether show RUN_DIR               a summary of a run

Invalid use exits with code 2 and a one-line error. Further commands (doctor, faultbench, plan,
fit, report, compare) register themselves from `tether.commands.*` modules.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import shutil
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tether: reinforcement fine-tuning of LLMs and LLM agents.")


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error and exit (2 = invalid use)."""
    typer.echo(f"tether: error: {message}", err=True)
    raise typer.Exit(code)


def _offline_env() -> None:
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(config: Optional[Path], overrides: List[str]):
    from tether.config import ConfigError, load_config

    try:
        return load_config(config, overrides)
    except ConfigError as err:
        fail(str(err))


def default_run_dir(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _known_errors():
    from tether.config import ConfigError
    from tether.envs.runner import EnvFailure
    from tether.policy.chat import TemplateError, TokenizationDrift
    from tether.rewards import RewardFailure
    from tether.tasks import DataError
    from tether.update import TrainingHalted

    return (ConfigError, DataError, FileNotFoundError, RewardFailure, TrainingHalted, EnvFailure, TokenizationDrift,
            TemplateError)


def _fail_run(rd: Path, existed: bool, err: Exception) -> None:
    """Fail with `err`; a run directory this command created that holds nothing but its config goes."""
    files = [f for f in rd.rglob("*") if f.is_file() and f.name != "config.yaml"] if rd.is_dir() else [None]
    if not existed and not files:
        shutil.rmtree(rd, ignore_errors=True)
        typer.echo(f"(removed the empty run directory {rd})", err=True)
    fail(str(err), 1)


def _run_recipe(kind: str, config: Path, overrides: List[str], run_dir: Optional[Path], resume: bool) -> None:
    """Shared body of `train` and `sft`: validate, pick the run dir, run, summarise."""
    _offline_env()
    cfg = _load(config, overrides)
    if resume and run_dir is None:
        fail("--resume needs --run-dir DIR (the run to continue)")
    rd = run_dir or default_run_dir(cfg.run.name + ("-sft" if kind == "sft" else ""))
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        if kind == "sft":
            from tether.recipes.sft import run_sft

            _, summary = run_sft(cfg, rd, resume=resume)
        else:
            from tether.recipes.rl import run_rl

            summary = run_rl(cfg, rd, resume=resume)
    except _known_errors() as err:
        _fail_run(rd, existed, err)
    _print_summary(summary)
    typer.echo(f"run directory: {rd}")


CONFIG_ARG = typer.Argument(..., help="YAML config (see configs/)")
OVERRIDES_ARG = typer.Argument(None, help="key.path=value overrides")
RUN_DIR_OPT = typer.Option(None, "--run-dir", help="default: runs/<config name>-<timestamp>")
RESUME_OPT = typer.Option(False, "--resume", help="continue from the run directory's latest checkpoint")


@app.command()
def train(config: Path = CONFIG_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
          run_dir: Optional[Path] = RUN_DIR_OPT, resume: bool = RESUME_OPT) -> None:
    """Run RL (GRPO by default) from a config."""
    _run_recipe("rl", config, overrides or [], run_dir, resume)


@app.command()
def sft(config: Path = CONFIG_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
        run_dir: Optional[Path] = RUN_DIR_OPT, resume: bool = RESUME_OPT) -> None:
    """Supervised fine-tuning on demonstrations (cold start); writes final_model/."""
    _run_recipe("sft", config, overrides or [], run_dir, resume)


@app.command()
def demo(
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/demo-<timestamp>"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides of configs/demo.yaml"),
) -> None:
    """The embedded default: tiny model built locally -> SFT -> GRPO -> held-out eval -> plots."""
    _offline_env()
    from tether.config import ConfigError
    from tether.recipes.demo import run_demo

    rd = run_dir or default_run_dir("demo")
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        summary = run_demo(rd, overrides or [])
    except ConfigError as err:
        fail(str(err))
    except _known_errors() as err:
        _fail_run(rd, existed, err)
    _print_summary(summary)
    typer.echo(f"run directory: {rd}")


@app.command("eval")
def eval_cmd(
    target: Path = typer.Argument(..., help="a run directory (its latest checkpoint), a checkpoint directory, or a YAML config"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides, e.g. eval.samples=16 eval.best_of=reward"),
    out: Optional[Path] = typer.Option(None, "--out", help="where to write eval.json (default: the run dir)"),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="write plots/eval_tts.png (pass@k, maj@k, best@k vs k)"),
) -> None:
    """Held-out pass@k, maj@k, best@k (k = 1..eval.samples) and greedy accuracy -> eval.json."""
    _offline_env()
    from tether.recipes.evaluate import run_eval_command

    try:
        metrics, path = run_eval_command(target, overrides or [], out, plot=plot)
    except _known_errors() as err:
        fail(str(err), 1)
    for k, v in sorted(metrics.items()):
        typer.echo(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    typer.echo(f"wrote {path}")


@app.command()
def show(run_dir: Path = typer.Argument(..., help="a run directory")) -> None:
    """A summary of a run: config highlights, last metrics, evaluation, checkpoints."""
    from tether.show import render_run_summary

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a directory")
    try:
        typer.echo(render_run_summary(run_dir))
    except (ValueError, FileNotFoundError) as err:
        fail(str(err), 1)


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
