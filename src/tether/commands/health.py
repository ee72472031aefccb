"""CLI: `tether doctor RUN_DIR` and `tether faultbench` (tether.health)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import fail


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


def doctor(
    run_dir: Path = typer.Argument(..., help="a run directory of any kind (a pipeline: per stage; a sweep: per run)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable report"),
) -> None:
    """Health of a run: findings, ranked root causes with evidence, and repairs taken (per stage / per run and a
    summary for pipelines and sweeps)."""
    from tether.api.doctor import doctor as examine_run, format_doctor
    from tether.commands.common import fail_on, known_errors

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a directory", 2)
    try:
        rep = examine_run(run_dir)
    except known_errors() as err:
        fail_on(err)
    typer.echo(json.dumps(rep, indent=2, default=str) if as_json else format_doctor(rep))

def faultbench(
    out: Path = typer.Option(Path("runs/faultbench"), "--out", help="output directory (cases.jsonl, results.json)"),
    fault: Optional[List[str]] = typer.Option(
        None, "--fault", help="fault types to run (default: all): a name, package.module:Class or path/file.py:Class"),
    split: Optional[str] = typer.Option(
        None, "--split", help="tuned | held_out: the faults of one half of the fixed split (tether.health.faults.split)"),
    replay: bool = typer.Option(
        False, "--replay", help="with --rescore: re-run the current detectors and diagnosis over the advise runs' metrics"),
    mode: Optional[List[str]] = typer.Option(None, "--mode", help="advise and/or auto (default: both)"),
    auto_remediable_only: bool = typer.Option(
        False, "--auto-remediable-only", help="auto mode only for remediable faults and the healthy controls"),
    healthy_only: bool = typer.Option(False, "--healthy-only", help="run the healthy controls only"),
    variant: Optional[List[str]] = typer.Option(
        None, "--variant", help="repeat the healthy controls under NAME=key=value[;key=value] (e.g. threads=run.threads=2)"),
    severity: Optional[List[str]] = typer.Option(None, "--severity", help="subtle and/or obvious (default: both)"),
    seeds: str = typer.Option("0,1", help="seeds of the faulty runs, e.g. 0,1 or 0-2"),
    healthy_seeds: str = typer.Option("0-9", help="seeds of the healthy control runs"),
    steps: int = typer.Option(40, help="RL steps per run"),
    start: int = typer.Option(15, help="step at which faults start"),
    workers: int = typer.Option(2, help="runs in parallel (one thread each)"),
    smoke: bool = typer.Option(False, "--smoke", help="a 2-fault, 1-seed subset for tests (~1 minute)"),
    list_faults: bool = typer.Option(False, "--list", help="list the fault types and exit"),
    score_only: bool = typer.Option(False, "--rescore", help="score the runs in OUT/cases.jsonl so far; run nothing"),
    planned: Optional[int] = typer.Option(None, "--planned", help="with --rescore: runs planned (marks a partial result)"),
    extra: Optional[List[str]] = typer.Option(None, "--set", help="config overrides of the base run (key=value)"),
) -> None:
    """Inject faults into small RL runs and score detection, diagnosis and repair."""
    from tether.recipes.faultbench import BenchPlan, format_results, run_bench
    from tether.health.faults import load_fault_plugins

    registry = load_fault_plugins()
    if list_faults:
        for name, cls in sorted(registry.items(), key=lambda kv: (kv[1].family, kv[0])):
            typer.echo(f"{cls.family:18s} {name:22s} cause={cls.cause:22s} seam={cls.seam:11s} "
                       f"remediable={'yes' if cls.remediable else 'no '}  {(cls.__doc__ or '').split(chr(10))[0]}")
        return
    unknown = [f for f in fault or [] if f not in registry and ":" not in f]
    if unknown:
        fail(f"unknown fault(s) {unknown}; see `tether faultbench --list`", 2)
    if score_only:
        from tether.recipes.faultbench import rescore

        if not (out / "cases.jsonl").is_file():
            fail(f"{out / 'cases.jsonl'}: no such file (run the benchmark first)", 2)
        typer.echo(format_results(rescore(out, start, planned, replay)))
        return
    if split is not None:
        from tether.health.faults import split as halves

        if split not in ("tuned", "held_out"):
            fail(f"--split {split!r}: expected tuned or held_out", 2)
        fault = list(fault or []) + [f for f in (halves.TUNED if split == "tuned" else halves.HELD_OUT) if f not in (fault or [])]
    variants = _variants(variant or [])
    kw = dict(faults=[] if healthy_only else (fault or None), severities=tuple(severity or ("subtle", "obvious")),
              seeds=_seeds(seeds), healthy_seeds=_seeds(healthy_seeds), steps=steps, start=start, variants=variants,
              modes=tuple(mode or ("advise", "auto")), auto_remediable_only=auto_remediable_only)
    if smoke:
        kw.update(SMOKE)
    _check_faults(kw["faults"] or [])
    res = run_bench(out, BenchPlan(**kw), workers=workers, extra=list(extra or []), progress=typer.echo)
    typer.echo("")
    typer.echo(format_results(res))
    typer.echo(f"\nwrote {out / 'results.json'}")


def _variants(specs: list[str]) -> dict[str, list[str]]:
    """--variant NAME=key=value[;key=value] -> {NAME: [overrides]} (exit 2 on a malformed one)."""
    out = {}
    for v in specs:
        name, _, ov = v.partition("=")
        if not name or "=" not in ov:
            fail(f"--variant {v!r}: expected NAME=key=value[;key=value]", 2)
        out[name] = [x.strip() for x in ov.split(";") if x.strip()]
    return out


def _check_faults(names: list[str]) -> None:
    """Import every fault (user modules included) before any run: a bad spec is a one-line error."""
    from tether.health.faults import get_fault_class

    try:
        for f in names:
            get_fault_class(f)
    except (ValueError, ImportError, SyntaxError) as err:
        fail(f"--fault: {err}", 2)


def register(app: typer.Typer) -> None:
    app.command()(doctor)
    app.command()(faultbench)
