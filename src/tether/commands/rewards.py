"""CLI: `tether rm CONFIG` — train a Bradley-Terry reward model (tether.recipes.rm)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import default_run_dir


def register(app: typer.Typer) -> None:
    @app.command()
    def rm(
        config: Path = typer.Argument(..., help="YAML config: model.path (the base causal LM) and the rm: section"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides, e.g. rm.pairs=pairs.jsonl"),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/<name>-rm-<timestamp>"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace (delete) an existing run in --run-dir"),
    ) -> None:
        """Train a reward model on preference pairs; held-out pair accuracy -> summary.json, model -> final_model/."""
        from tether.commands.common import fail_run, known_errors, load_config_or_fail, offline_env, print_summary
        from tether.recipes.rm import run_rm

        offline_env()
        cfg = load_config_or_fail(config, overrides or [])
        rd = run_dir or default_run_dir(f"{cfg.run.name}-rm")
        typer.echo(f"run directory: {rd}")
        existed = rd.exists()
        try:
            summary = run_rm(cfg, rd, overwrite=overwrite)
        except known_errors() as err:
            fail_run(rd, existed, err)
        print_summary(summary)
