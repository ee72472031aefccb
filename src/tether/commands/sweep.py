"""CLI: `tether sweep CONFIG --grid key=v1,v2 ... --seeds 0,1,2` (tether.sweep)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import fail, default_run_dir



def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        config: Path = typer.Argument(..., help="YAML config (may hold a `sweep:` block: grid, arms, seeds, command, metric, workers, "
                                                 "overrides, prepare: runs the arms start from, as {prepare.NAME})"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides applied to every run"),
        grid: Optional[List[str]] = typer.Option(None, "--grid", help="key.path=v1,v2 (repeat for a cartesian product)"),
        arm: Optional[List[str]] = typer.Option(None, "--arm", help="one explicit arm: 'k=v k2=v2' (repeatable; before the grid)"),
        seeds: Optional[str] = typer.Option(None, "--seeds", help="comma-separated run seeds (default: 0,1,2)"),
        command: Optional[str] = typer.Option(None, "--command", help="what each run is: train | pipeline | sft (default train)"),
        metric: Optional[str] = typer.Option(None, "--metric", help="summary.json key compared (default final_accuracy); "
                                             "mean:KEY / last:KEY / max:KEY / sum:KEY / first5:KEY / last5:KEY read metrics.jsonl "
                                             "(KEY@STAGE: a pipeline stage's); stages.NAME.heldout.eval/pass@1: a pipeline stage's "
                                             "held-out metric; 'A - B': the per-run difference of two metrics"),
        extra_metric: Optional[List[str]] = typer.Option(None, "--extra-metric", help="further metrics to table (repeatable)"),
        workers: Optional[int] = typer.Option(None, "--workers", help="runs at a time (default 1)"),
        out: Optional[Path] = typer.Option(None, "--out", help="sweep directory (default runs/<name>-sweep-<timestamp>); "
                                                              "an existing one is resumed"),
    ) -> None:
        """Run a grid of configs x seeds (resumable); mean +- s.e. per arm and differences -> sweep.json, sweep.md."""
        from tether.commands.common import load_config_or_fail, offline_env
        from tether.sweep import (
            COMMANDS, SweepError, SweepSpec, check_metric, format_table, load_sweep_config, parse_grid, parse_seeds,
            run_sweep)
        from tether.sweep_prepare import resolve_prepare, substitute

        offline_env()
        try:
            base, block = load_sweep_config(config)
            base.setdefault("run", {}).setdefault("name", config.stem)
            spec = SweepSpec(
                grid=parse_grid(grid) if grid else {str(k): [str(v) for v in vs] for k, vs in (block.get("grid") or {}).items()},
                seeds=parse_seeds(seeds if seeds is not None else block.get("seeds", [0, 1, 2])),
                command=command or block.get("command", "train"), metric=metric or block.get("metric", "final_accuracy"),
                overrides=[str(o) for o in block.get("overrides") or []] + list(overrides or []),
                arm_list=[a.split() for a in arm] if arm else [[str(o) for o in a] for a in (block.get("arms") or [])],
                extra_metrics=list(extra_metric or block.get("extra_metrics") or []),
                prepare=resolve_prepare(block.get("prepare"), config.parent, COMMANDS, SweepError),
                prepare_overrides=[o for o in overrides or [] if "{prepare." not in o])
            spec.validate()
            n_workers = workers if workers is not None else int(block.get("workers", 1))
            if n_workers < 1:
                raise SweepError(f"--workers must be >= 1, got {n_workers}")
        except SweepError as err:
            fail(str(err))
        rd = out or default_run_dir(f"{base['run']['name']}-sweep")
        # every arm's (and prepare step's) config and the metrics must pass before anything runs: a typo fails now,
        # not after an hour
        for step in spec.prepare.values():
            _check_arm(step["config"], step["overrides"] + spec.prepare_overrides, load_config_or_fail)
        stages: list[str] = []
        for arm in spec.arms():
            cfg = _check_arm(base, substitute(spec.overrides + list(arm.overrides), spec.prepare, rd, spec.seeds[0]),
                             load_config_or_fail)
            stages = stages or _stage_names(cfg, spec.command)
        try:
            check_metric(spec.metric, spec.command, stages)
            for m in spec.extra_metrics:
                check_metric(m, spec.command, stages, "--extra-metric")
        except SweepError as err:
            fail(str(err))
        try:
            payload = run_sweep(spec, base, rd, workers=n_workers)
        except SweepError as err:
            fail(str(err))
        typer.echo(format_table(payload["table"]))
        if payload["failures"]:
            typer.echo(f"{len(payload['failures'])} run(s) failed: " + "; ".join(payload["failures"]), err=True)
        typer.echo(f"wrote {rd / 'sweep.json'} and {rd / 'sweep.md'}")
        if payload["failures"]:
            raise typer.Exit(1)


def _stage_names(cfg, command: str) -> list[str]:
    """The stage names of the pipeline each run of a `--command pipeline` sweep is."""
    if command != "pipeline":
        return []
    from tether.recipes.multistage import plan_stages

    return [st.name for st, _ in plan_stages(cfg)]


def _check_arm(base: dict, overrides: list[str], load):
    """Validate one arm's config (base + overrides) through the normal loader; exits 2 on an error; returns it."""
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(base, f)
    try:
        return load(Path(f.name), overrides)
    finally:
        Path(f.name).unlink(missing_ok=True)
