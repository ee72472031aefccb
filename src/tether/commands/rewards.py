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
        resume: bool = typer.Option(False, "--resume", help="(refused: a reward model trains in one go; see --overwrite)"),
    ) -> None:
        """Train a reward model on preference pairs; held-out pair accuracy -> summary.json, model -> final_model/."""
        from tether.commands.common import fail, run_in_dir, start_command
        from tether.recipes.rm import run_rm

        if resume:
            fail("a reward-model run does not resume (it keeps no checkpoints: it trains in one go); rerun it with "
                 "--overwrite, or into a new --run-dir")
        cfg = start_command(config, overrides)
        rd = run_dir or default_run_dir(f"{cfg.run.name}-rm")
        run_in_dir(rd, lambda: run_rm(cfg, rd, overwrite=overwrite))
