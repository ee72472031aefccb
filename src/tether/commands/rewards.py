"""CLI: `tether rm CONFIG` — train a Bradley-Terry reward model (tether.recipes.rm)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def rm(
        config: Path = typer.Argument(..., help="YAML config: model.path (the base causal LM) and the rm: section"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides, e.g. rm.pairs=pairs.jsonl"),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/<name>-rm-<timestamp>"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace (delete) an existing run in --run-dir"),
        resume: bool = typer.Option(False, "--resume", help="(refused: a reward model trains in one go; see --overwrite)"),
    ) -> None:
        """Train a reward model on preference pairs; held-out pair accuracy -> summary.json, model -> final_model/."""
        from tether.cli import _fail_run, _known_errors, _load, _offline_env, _print_summary, fail
        from tether.recipes.rm import run_rm

        if resume:
            fail("a reward-model run does not resume (it keeps no checkpoints: it trains in one go); rerun it with "
                 "--overwrite, or into a new --run-dir")
        _offline_env()
        cfg = _load(config, overrides or [])
        rd = run_dir or Path("runs") / f"{cfg.run.name}-rm-{time.strftime('%Y%m%d-%H%M%S')}"
        typer.echo(f"run directory: {rd}")
        existed = rd.exists()
        try:
            summary = run_rm(cfg, rd, overwrite=overwrite)
        except _known_errors() as err:
            _fail_run(rd, existed, err)
        _print_summary(summary)
