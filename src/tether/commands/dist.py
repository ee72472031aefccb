"""CLI: `tether train-async CONFIG` (recipes/rl_async.py) and `tether dist-preflight CONFIG` (tether.dist)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    from tether.commands import common

    @app.command("train-async")
    def train_async(config: Path = common.CONFIG_ARG, overrides: Optional[List[str]] = common.OVERRIDES_ARG,
                    run_dir: Optional[Path] = common.RUN_DIR_OPT, resume: bool = common.RESUME_OPT,
                    overwrite: bool = common.OVERWRITE_OPT) -> None:
        """Asynchronous RL on Ray: rollout workers generate while the trainer updates (docs/distributed.md)."""
        common.offline_env()
        cfg = common.load_config_or_fail(config, overrides or [])
        if resume and run_dir is None:
            common.fail("--resume needs --run-dir DIR (the run to continue)")
        rd = run_dir or common.default_run_dir(cfg.run.name + "-async")
        typer.echo(f"run directory: {rd}")
        from tether.dist.cluster import PreflightError
        from tether.dist.controller import SyncError
        from tether.errors import UserError
        from tether.recipes.rl_async import run_rl_async

        try:
            summary = run_rl_async(cfg, rd, resume=resume, overwrite=overwrite)
        except common.known_errors() + (PreflightError, SyncError) as err:
            common.fail(str(err), 2 if isinstance(err, UserError) else 1)  # e.g. a refused run directory: 2
        common.print_summary(summary)
        typer.echo(f"run directory: {rd}")

    @app.command("dist-preflight")
    def dist_preflight(config: Path = common.CONFIG_ARG, overrides: Optional[List[str]] = common.OVERRIDES_ARG) -> None:
        """Check the dist: request against the Ray cluster (dist.ray_address, or a local instance)."""
        cfg = common.load_config_or_fail(config, overrides or [])
        from tether.dist.cluster import PreflightError, compute_bundles, list_node_resources, start_cluster

        try:
            with start_cluster(cfg.dist):
                nodes = list_node_resources()
        except PreflightError as err:
            common.fail(str(err), 1)
        typer.echo(f"ok: {len(compute_bundles(cfg.dist))} bundles fit on {len(nodes)} node(s): "
                   + "; ".join(f"{n.get('CPU', 0):g} CPU, {n.get('GPU', 0):g} GPU" for n in nodes))
