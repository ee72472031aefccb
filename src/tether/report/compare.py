"""`tether compare RUN_A RUN_B ...`: a table of headline numbers and overlaid curves.

The table has one row per run: allocation (n, B_p, steps), compute spent, starting and final
held-out pass@1, greedy accuracy, last-10-step means of reward, KL and entropy, wall time. The
HTML page overlays each metric's curve across runs, against step or against compute spent
(rollouts), so that runs with different allocations compare at equal compute.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any, Sequence

from tether.report.data import RunData, compute_cumulative_compute, load_run
from tether.report.html import CSS
from tether.report.svg import ChartStyle, fmt_num, render_line_chart

COMPARE_METRICS = ("reward/mean", "accuracy", "eval/pass@1", "eval/greedy_accuracy", "kl_loss", "entropy",
                   "response_length/mean", "clip_frac", "grad_norm", "train/tokens_per_s")


def _last_mean(data: RunData, key: str, window: int = 10) -> float | None:
    vals = [r[key] for r in data.metrics if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return sum(vals[-window:]) / len(vals[-window:]) if vals else None


def compute_comparison_row(data: RunData) -> dict[str, Any]:
    ro = data.config.get("rollout", {}) if isinstance(data.config.get("rollout"), dict) else {}
    evals = [r for r in data.metrics if isinstance(r.get("eval/pass@1"), (int, float))]
    compute = compute_cumulative_compute(data, "rollouts")
    steps = [r["step"] for r in data.metrics if isinstance(r.get("step"), int) and "reward/mean" in r]
    return {
        "run": data.name, "n": ro.get("n"), "B_p": ro.get("problems_per_step"), "steps": max(steps) if steps else 0,
        "rollouts": max(compute.values()) if compute else 0.0,
        "start pass@1": evals[0]["eval/pass@1"] if evals else None,
        "final pass@1": evals[-1]["eval/pass@1"] if evals else data.summary.get("final_accuracy"),
        "final greedy": evals[-1].get("eval/greedy_accuracy") if evals else None,
        "reward (last 10)": _last_mean(data, "reward/mean"), "kl (last 10)": _last_mean(data, "kl_loss"),
        "entropy (last 10)": _last_mean(data, "entropy"),
        "wall s": data.summary.get("wall_seconds"),
    }


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return fmt_num(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """Plain-text table (one row per run)."""
    if not rows:
        return "(no runs)"
    cols = list(rows[0])
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def render_compare_html(runs: Sequence[RunData], x: str = "step") -> str:
    esc = html.escape
    rows = [compute_comparison_row(d) for d in runs]
    cols = list(rows[0]) if rows else []
    table = ("<table id='compare-table'><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"
             + "".join("<tr>" + "".join(f"<td class='num'>{esc(_cell(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
             + "</table>")
    charts = []
    for key in COMPARE_METRICS:
        series = {}
        for d in runs:
            pts = d.series(key)
            if x == "rollouts":
                comp = compute_cumulative_compute(d, "rollouts")
                pts = [(comp[int(s)], v) for s, v in pts if int(s) in comp]
            if any(isinstance(v, (int, float)) for _, v in pts):
                series[d.name] = pts
        if series:
            charts.append(render_line_chart(series, key, metric=key, xlabel=x, style=ChartStyle(width=460)))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>tether compare</title>"
            f"<style>{CSS}</style></head><body><header><h1>tether compare: {len(runs)} runs</h1>"
            f"<div class='sub'>x axis: {esc(x)} · generated {time.strftime('%Y-%m-%d %H:%M:%S')}</div></header>"
            f"<section id='table'><h2>Runs</h2>{table}</section>"
            f"<section id='curves'><h2>Overlaid curves</h2><div class='grid'>{''.join(charts)}</div></section></body></html>")


def run_compare(run_dirs: Sequence[Path], out: Path | None = None, x: str = "step") -> tuple[list[dict[str, Any]], Path | None]:
    """Load the runs, return the table rows and write the HTML page to `out` (when given)."""
    if len(run_dirs) < 1:
        raise ValueError("compare needs at least one run directory")
    runs = [load_run(Path(p)) for p in run_dirs]
    names = [d.name for d in runs]
    for d in runs:  # same basename twice (runs/a/rl, runs/b/rl): use the parent too
        if names.count(d.name) > 1:
            d.name = f"{d.root.parent.name}/{d.root.name}"
    rows = [compute_comparison_row(d) for d in runs]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_compare_html(runs, x), encoding="utf-8")
    return rows, out
