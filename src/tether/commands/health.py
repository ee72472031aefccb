"""CLI: `tether doctor RUN_DIR` and `tether faultbench` (tether.health)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer


def _seeds(text: str) -> list[int]:
    """'0,1,5' or '0-9' -> a list of ints."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part[1:]:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


SMOKE = {"faults": ["lr_spike", "group_mixing"], "severities": ("obvious",), "seeds": [0], "healthy_seeds": [0],
         "steps": 26, "start": 13}


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        run_dir: Path = typer.Argument(..., help="a run directory (metrics.jsonl, health.jsonl)"),
        as_json: bool = typer.Option(False, "--json", help="machine-readable report"),
    ) -> None:
        """Health of a run: findings, ranked root causes with evidence, and repairs taken."""
        from tether.health.doctor import examine, format_report

        if not run_dir.is_dir():
            typer.echo(f"tether: error: {run_dir}: not a directory", err=True)
            raise typer.Exit(2)
        try:
            rep = examine(run_dir)
        except (FileNotFoundError, ValueError) as err:
            typer.echo(f"tether: error: {err}", err=True)
            raise typer.Exit(1)
        typer.echo(json.dumps(rep, indent=2, default=str) if as_json else format_report(rep))

    @app.command()
    def faultbench(
        out: Path = typer.Option(Path("runs/faultbench"), "--out", help="output directory (cases.jsonl, results.json)"),
        fault: Optional[List[str]] = typer.Option(None, "--fault", help="fault types to run (default: all)"),
        severity: Optional[List[str]] = typer.Option(None, "--severity", help="subtle and/or obvious (default: both)"),
        seeds: str = typer.Option("0,1", help="seeds of the faulty runs, e.g. 0,1 or 0-2"),
        healthy_seeds: str = typer.Option("0-9", help="seeds of the healthy control runs"),
        steps: int = typer.Option(40, help="RL steps per run"),
        start: int = typer.Option(15, help="step at which faults start"),
        workers: int = typer.Option(2, help="runs in parallel (one thread each)"),
        smoke: bool = typer.Option(False, "--smoke", help="a 2-fault, 1-seed subset for tests (~1 minute)"),
        list_faults: bool = typer.Option(False, "--list", help="list the fault types and exit"),
        extra: Optional[List[str]] = typer.Option(None, "--set", help="config overrides of the base run (key=value)"),
    ) -> None:
        """Inject faults into small RL runs and score detection, diagnosis and repair."""
        from tether.health.bench import format_results, run_bench
        from tether.health.faults import load_fault_plugins

        registry = load_fault_plugins()
        if list_faults:
            for name, cls in sorted(registry.items(), key=lambda kv: (kv[1].family, kv[0])):
                typer.echo(f"{cls.family:18s} {name:22s} cause={cls.cause:22s} seam={cls.seam:11s} "
                           f"remediable={'yes' if cls.remediable else 'no '}  {(cls.__doc__ or '').split(chr(10))[0]}")
            return
        unknown = [f for f in fault or [] if f not in registry and ":" not in f]
        if unknown:
            typer.echo(f"tether: error: unknown fault(s) {unknown}; see `tether faultbench --list`", err=True)
            raise typer.Exit(2)
        kw = dict(faults=fault or None, severities=tuple(severity or ("subtle", "obvious")), seeds=_seeds(seeds),
                  healthy_seeds=_seeds(healthy_seeds), steps=steps, start=start)
        if smoke:
            kw.update(SMOKE)
        res = run_bench(out, workers=workers, extra=list(extra or []), progress=typer.echo, **kw)
        typer.echo("")
        typer.echo(format_results(res))
        typer.echo(f"\nwrote {out / 'results.json'}")
