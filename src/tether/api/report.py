"""`tether report` and `tether compare` on every kind of run.

* report: one self-contained HTML page of a run (a pipeline: its stages side by side and its last
  stage's curves; a sweep: its table and plot). A context comparison or a fault benchmark is
  refused naming what works on it. The page goes into the run's own directory, which must be one
  that tether recognises (a run record, metrics.jsonl, summary.json or sweep.json — a folder that
  merely holds a config.yaml is not), or to `out`: a new file, an earlier tether report, or a
  run directory; an existing file of anything else is never overwritten.
* compare: a pipeline stands for its last stage with metrics; a sweep, a comparison or a benchmark
  is refused naming its member runs (compare those).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tether.api.run import NotARun, Run, open_run
from tether.errors import UserError

MARKERS = ("run.json", "metrics.jsonl", "summary.json", "sweep.json")
REPORT_MARK = "tether"  # every page tether writes starts with <!DOCTYPE html> and names tether in its title


def recognised_run(path: str | Path) -> Run:
    """The run at `path` when tether recognises it as one (see the module doc); else NotARun."""
    p = Path(path)
    if not p.is_dir():
        raise NotARun(f"{p}: not a directory (a run directory is expected)")
    run = open_run(p)
    if run.record.kind or any((p / m).is_file() for m in MARKERS) or run.kind in ("pipeline", "demo"):
        return run
    raise NotARun(f"{p}: not a run directory tether recognises (no {', '.join(MARKERS)}"
                  + (": a config.yaml alone is not a run" if (p / "config.yaml").is_file() else "") + ")")


def _check_out(out: Path) -> Path:
    """Where a report may go: a new file, an earlier tether report, or report.html inside a run directory."""
    if out.is_dir():
        return recognised_run(out).path / "report.html"
    if out.exists():
        head = out.read_text(encoding="utf-8", errors="replace")[:400]
        if not (head.lstrip().lower().startswith("<!doctype html>") and REPORT_MARK in head):
            raise UserError(f"--out {out} exists and is not a tether report: it is never overwritten; choose a new file")
    return out


def _refuse_multi(run: Run, command: str) -> None:
    members = [str(m.path) for m in run.members[:3]]
    raise UserError(f"{run.path} is a {run.kind} of {len(run.record.members) or 'several'} runs: `tether {command}` "
                    f"takes one of them ({', '.join(members) or f'the runs under {run.path}'}"
                    f"{', ...' if len(run.record.members) > 3 else ''}); `tether show {run.path}` summarises them all")


def report(target: str | Path | Run, out: str | Path | None = None) -> Path:
    """Write the HTML report of `target` (see the module doc); returns its path."""
    from tether.report.html import write_report
    from tether.report.sweep import write_sweep_report

    run = target if isinstance(target, Run) else recognised_run(target)
    if run.kind in ("compare_context", "faultbench"):
        _refuse_multi(run, "report")
    path = _check_out(Path(out)) if out is not None else None
    if run.kind == "sweep":
        if not (run.path / "sweep.json").is_file():
            raise UserError(f"{run.path}: the sweep has no sweep.json yet (no run finished); resume it with "
                            f"`tether sweep ... --out {run.path}`")
        return write_sweep_report(run.path, path)
    return write_report(run.path, path)


def compare_targets(targets: Sequence[str | Path]) -> list[Path]:
    """The run directory each target stands for in a comparison (a pipeline: its last stage with metrics)."""
    out = []
    for t in targets:
        run = recognised_run(t)
        if run.kind in ("sweep", "compare_context", "faultbench"):
            _refuse_multi(run, "compare")
        if run.kind in ("pipeline", "demo"):
            stages = [m.path for m in run.members if (m.path / "metrics.jsonl").is_file()]
            if not stages:
                raise UserError(f"{run.path}: no stage of this pipeline has logged metrics yet")
            out.append(stages[-1])
        else:
            out.append(run.path)
    return out


def compare(targets: Sequence[str | Path], out: str | Path | None = None, x: str = "step") -> tuple[list[dict[str, Any]], Path | None]:
    """The comparison table of the runs `targets` stand for, and its HTML page written to `out`."""
    from tether.report.compare import run_compare

    page = _check_out(Path(out)) if out is not None else None
    return run_compare(compare_targets(targets), page, x)


__all__ = ["compare", "compare_targets", "recognised_run", "report"]
