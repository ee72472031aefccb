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

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import (
    CONFIG_ARG, OVERRIDES_ARG, OVERWRITE_OPT, RESUME_OPT, RUN_DIR_OPT, STEP_OPT, OneLineErrors, default_run_dir, fail,
    fail_on, fail_run, known_errors, note, offline_env, print_summary, run_in_dir, start_command,
)

app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tether: reinforcement fine-tuning of LLMs and LLM agents.")


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the full traceback of an error")) -> None:
    """tether: reinforcement fine-tuning of LLMs and LLM agents."""  # --debug is read by OneLineErrors.invoke


def _run_recipe(kind: str, config: Path, overrides: List[str], run_dir: Optional[Path], resume: bool,
                overwrite: bool = False) -> None:
    """Shared body of `train` and `sft` over the Python API (tether.sft / tether.train, which check
    the inputs first): pick the run dir, run, summarise."""
    from tether.api.training import sft as run_sft, train as run_train

    cfg = start_command(config, overrides)
    if resume and run_dir is None:
        fail("--resume needs --run-dir DIR (the run to continue)")
    rd = run_dir or default_run_dir(cfg.run.name + ("-sft" if kind == "sft" else ""))
    run_in_dir(rd, lambda: (run_sft if kind == "sft" else run_train)(cfg, rd, resume=resume, overwrite=overwrite).summary)
    typer.echo(f"run directory: {rd}")


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
    offline_env()
    from tether.config import ConfigError
    from tether.recipes.demo import run_demo

    rd = run_dir or default_run_dir("demo")
    typer.echo(f"run directory: {rd}")
    existed = rd.exists()
    try:
        summary = run_demo(rd, overrides or [], overwrite=overwrite)
    except ConfigError as err:
        fail_on(err)
    except known_errors() as err:
        fail_run(rd, existed, err)
    print_summary(summary)
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
    offline_env()
    from tether.api.evaluate import run_eval_command

    try:
        metrics, path = run_eval_command(target, overrides or [], out, plot=plot, step=step, log=note)
    except known_errors() as err:
        fail_on(err)
    for k, v in sorted(metrics.items()):
        typer.echo(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    typer.echo(f"wrote {path}")


@app.command()
def show(run_dir: Path = typer.Argument(..., help="a run directory of any kind (a pipeline, a sweep, ...)")) -> None:
    """A summary of a run: kind, result model, config highlights, metrics, stages or arms, checkpoints."""
    from tether.api.show import render_run_summary

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a directory")
    try:
        typer.echo(render_run_summary(run_dir))
    except known_errors() as err:
        fail_on(err)


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
