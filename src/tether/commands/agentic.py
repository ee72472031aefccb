"""CLI: `tether pipeline CONFIG` (the config's stages; by default SFT cold start -> RL) and `tether compare-context CONFIG`
(Agent-R1's context-management comparison); see `tether.recipes.pipeline`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import fail, default_run_dir



def register(app: typer.Typer) -> None:
    @app.command()
    def pipeline(
        config: Path = typer.Argument(..., help="YAML config (e.g. configs/household.yaml)"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides"),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/<config name>-<timestamp>"),
        resume: bool = typer.Option(False, "--resume", help="skip finished stages, resume the interrupted one"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace (delete) an existing run in --run-dir"),
    ) -> None:
        """The config's pipeline.stages (sft, rl, rs_sft, dpo, distill, merge, eval), each stage's model
        handed to the next; without stages: SFT on the task's demonstrations, then RL. summary.json
        holds held-out metrics after every stage."""
        from tether.commands.common import fail_on, run_in_dir, start_command
        from tether.errors import UserError
        from tether.preflight_stages import check_pipeline_inputs
        from tether.recipes.multistage import plan_stages
        from tether.recipes.pipeline import run_pipeline

        cfg = start_command(config, overrides)
        if resume and run_dir is None:
            fail("--resume needs --run-dir DIR (the pipeline to continue)", 2)
        try:  # stage overrides and model references, then every stage's inputs, before anything runs
            check_pipeline_inputs(cfg, plan_stages(cfg))
        except UserError as err:
            fail_on(err)  # one line, exit 2 (the traceback under --debug)
        rd = run_dir or default_run_dir(cfg.run.name)
        run_in_dir(rd, lambda: run_pipeline(cfg, rd, resume=resume, overwrite=overwrite))

    @app.command("compare-context")
    def compare_context(
        config: Path = typer.Argument(..., help="YAML config of one environment (e.g. configs/qa.yaml)"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides"),
        builders: str = typer.Option("sliding_window,append,summary", help="context builders to compare"),
        seeds: Optional[str] = typer.Option(None, help="comma-separated run seeds (default: the config's)"),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/<name>-context-<timestamp>"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace (delete) an existing run in --run-dir"),
        resume: bool = typer.Option(False, "--resume", help="reuse finished pipelines, resume the unfinished one"),
    ) -> None:
        """Agent-R1's comparison: the same pipeline per context builder; prints the ordering found."""
        from tether.commands.common import fail_run, known_errors, start_command
        from tether.envs.context import CONTEXT_BUILDERS
        from tether.recipes.pipeline import run_context_comparison

        cfg = start_command(config, overrides)
        names = [b.strip() for b in builders.split(",") if b.strip()]
        unknown = [b for b in names if b not in CONTEXT_BUILDERS]
        if unknown or not names:
            fail(f"--builders: unknown {unknown or names}; valid: {', '.join(CONTEXT_BUILDERS)}", 2)
        try:
            seed_list = [int(s) for s in seeds.split(",")] if seeds else None
        except ValueError:
            fail(f"--seeds {seeds!r}: expected integers like 0,1,2", 2)
        if resume and run_dir is None:
            fail("--resume needs --run-dir DIR (the comparison to continue)", 2)
        rd = run_dir or default_run_dir(f"{cfg.run.name}-context")
        typer.echo(f"run directory: {rd}")
        existed = rd.exists()
        try:
            run_context_comparison(cfg, rd, names, seed_list, overwrite=overwrite, resume=resume)
        except known_errors() as err:
            fail_run(rd, existed, err)
