"""CLI: `tether export RUN_DIR|CHECKPOINT --out DIR` — a plain Hugging Face model directory (tether.api.export)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    from tether.commands import common

    @app.command("export")
    def export(target: Path = typer.Argument(..., help="a run directory (its result model; a pipeline's last stage) or a "
                                                       "checkpoint; LoRA adapters are merged"),
               out: Path = typer.Option(..., "--out", help="the directory to write (a plain Hugging Face model)"),
               step: Optional[int] = common.STEP_OPT) -> None:
        """Write a run's result model as a plain Hugging Face model directory (LoRA adapters merged in)."""
        from tether.api.export import export as run_export

        common.offline_env()
        try:
            path = run_export(target, out, step=step, log=common.note)
        except common.known_errors() as err:
            common.fail_on(err)
        typer.echo(f"exported: {path}")
