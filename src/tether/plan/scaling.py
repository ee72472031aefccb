"""`tether fit RUN_DIR...`: compute-scaling fits over runs, with an extrapolation plot.

Points are (compute spent, metric) read from each run's metrics.jsonl: held-out `eval/pass@1`
by default (the in-distribution validation pass rate ScaleRL fits), or any key (`reward/mean`
uses every step). Compute is cumulative rollouts (n x B_p per step, dynamic-sampling rounds
included), sampled tokens, steps or seconds. Each run with enough points gets its own fit;
several runs also get a pooled fit (e.g. one recipe run at several budgets: `--final-only` keeps
each run's last point, the iso-compute view).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tether.plan.fit import LAWS, ScalingFit, fit_scaling
from tether.report.data import compute_cumulative_compute, load_run


@dataclass(frozen=True)
class RunPoints:
    name: str
    compute: tuple[float, ...]
    values: tuple[float, ...]


def collect_points(run_dirs: Sequence[Path], metric: str = "eval/pass@1", unit: str = "rollouts",
                   final_only: bool = False, smooth: int = 1) -> list[RunPoints]:
    """(compute, value) per run; rows without the metric, or at steps without compute, are skipped."""
    out = []
    for rd in run_dirs:
        data = load_run(Path(rd))
        comp = compute_cumulative_compute(data, unit)
        pts = [(comp[r["step"]], float(r[metric])) for r in data.metrics
               if isinstance(r.get("step"), int) and r["step"] in comp and isinstance(r.get(metric), (int, float))
               and not isinstance(r.get(metric), bool) and math.isfinite(float(r[metric]))]
        if smooth > 1 and len(pts) > smooth:
            ys = np.convolve([y for _, y in pts], np.ones(smooth) / smooth, mode="valid")
            pts = [(x, float(y)) for (x, _), y in zip(pts[smooth - 1:], ys)]
        if final_only and pts:
            pts = pts[-1:]
        name = data.name
        out.append(RunPoints(name, tuple(x for x, _ in pts), tuple(y for _, y in pts)))
    return out


RATE_MARKERS = ("pass@", "maj@", "best@", "acc", "correct")


def _fit_or_reason(x: Sequence[float], y: Sequence[float], law: str, bootstrap: int, free_r0: bool,
                   cap: float | None) -> ScalingFit | str:
    r0 = None
    if law == "sigmoid" and not free_r0:
        zero = [v for c, v in zip(x, y) if c == 0]
        r0 = float(np.mean(zero)) if zero else None
    try:
        return fit_scaling(x, y, law, r0=r0, bootstrap=bootstrap, cap=cap)
    except (ValueError, RuntimeError) as err:
        return str(err)


@dataclass(frozen=True)
class FitOptions:
    """What `tether fit` fits: the metric against a compute axis (`unit`), the laws, one point per run
    (`final_only`) or the curves, how far to extrapolate, the bootstrap refits, a free R0, smoothing."""

    metric: str = "eval/pass@1"
    unit: str = "rollouts"
    laws: Sequence[str] = ("sigmoid", "power")
    final_only: bool = False
    extrapolate: float = 10.0
    bootstrap: int = 200
    free_r0: bool = False
    smooth: int = 1


def run_fit(run_dirs: Sequence[Path], opts: FitOptions = FitOptions(), plot_path: Path | None = None) -> dict[str, Any]:
    """Fit every law per run and pooled; returns a JSON-able report (and writes the plot)."""
    metric, unit, laws, final_only, extrapolate = opts.metric, opts.unit, opts.laws, opts.final_only, opts.extrapolate
    bootstrap, free_r0, smooth = opts.bootstrap, opts.free_r0, opts.smooth
    for law in laws:
        if law not in LAWS:
            raise ValueError(f"unknown law {law!r}; valid: {sorted(LAWS)}")
    runs = collect_points(run_dirs, metric, unit, final_only, smooth)
    if not any(r.compute for r in runs):
        raise ValueError(f"no points: none of the runs logged {metric!r} at a step with known compute")
    groups: list[tuple[str, list[float], list[float]]] = []
    if not final_only:
        groups += [(r.name, list(r.compute), list(r.values)) for r in runs]
    if len(runs) > 1 or final_only:
        groups.append(("pooled", [c for r in runs for c in r.compute], [v for r in runs for v in r.values]))
    cap = 1.0 if any(m in metric.lower() for m in RATE_MARKERS) else None  # a pass rate cannot exceed 1
    fits: dict[str, dict[str, ScalingFit | str]] = {
        name: {law: _fit_or_reason(x, y, law, bootstrap, free_r0, cap) for law in laws} for name, x, y in groups}
    c_max = max((max(r.compute) for r in runs if r.compute), default=0.0)
    targets = [c_max * f for f in (1.0, 2.0, extrapolate)] if c_max > 0 else []
    report: dict[str, Any] = {"metric": metric, "unit": unit, "runs": [r.__dict__ for r in runs], "fits": {}}
    for name, by_law in fits.items():
        report["fits"][name] = {}
        for law, f in by_law.items():
            if isinstance(f, str):
                report["fits"][name][law] = {"error": f}
                continue
            lo, hi = f.band(targets)
            report["fits"][name][law] = {**f.to_json(), "predictions": [
                {"compute": c, "value": float(v), "band_5": float(a), "band_95": float(b),
                 "extrapolation_factor": f.extrapolation_factor(c)}
                for c, v, a, b in zip(targets, f.predict(targets), lo, hi)]}
    if plot_path is not None:
        report["plot"] = str(plot_fits(runs, fits, metric, unit, extrapolate, plot_path))
    return report


def plot_fits(runs: Sequence[RunPoints], fits: dict[str, dict[str, ScalingFit | str]], metric: str, unit: str,
              extrapolate: float, path: Path) -> Path:
    """Data points, fitted curves over the data (solid) and beyond it (dashed), bootstrap bands."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    pos = [c for r in runs for c in r.compute if c > 0]
    if not pos:
        raise ValueError("nothing to plot: no point with compute > 0")
    c_lo, c_hi = min(pos), max(pos)
    grid_in = np.geomspace(c_lo, c_hi, 100)
    grid_out = np.geomspace(c_hi, c_hi * extrapolate, 60)
    for i, r in enumerate(runs):
        xs = [c for c in r.compute if c > 0]
        ys = [v for c, v in zip(r.compute, r.values) if c > 0]
        ax.plot(xs, ys, "o", color=colors[i % len(colors)], label=f"{r.name} (data)", ms=4)
    styles = {"sigmoid": "-", "power": "-."}
    for j, (name, by_law) in enumerate(fits.items()):
        color = "k" if name == "pooled" else colors[j % len(colors)]
        for law, f in by_law.items():
            if isinstance(f, str):
                continue
            label = f"{name} {law}" + (f": A={f.params['a']:.3f}±{f.stderr['a']:.3f}" if law == "sigmoid" else
                                        f": E={f.params['e']:.3f}±{f.stderr['e']:.3f}")
            ax.plot(grid_in, f.predict(grid_in), styles.get(law, "-"), color=color, lw=1.4, label=label)
            ax.plot(grid_out, f.predict(grid_out), ":", color=color, lw=1.4)
            lo, hi = f.band(np.concatenate([grid_in, grid_out]))
            ax.fill_between(np.concatenate([grid_in, grid_out]), lo, hi, color=color, alpha=0.08, lw=0)
    ax.axvline(c_hi, color="#999", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(f"compute ({unit})")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs compute: fits (solid), extrapolation (dotted), 5-95% bootstrap band")
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def format_fit_report(report: dict[str, Any]) -> str:
    lines = [f"{report['metric']} vs compute ({report['unit']})"]
    for r in report["runs"]:
        lines.append(f"  {r['name']}: {len(r['compute'])} points")
    for name, by_law in report["fits"].items():
        for law, f in by_law.items():
            if "error" in f:
                lines.append(f"{name} {law}: not fitted ({f['error']})")
                continue
            ps = ", ".join(f"{k}={v:.4g}±{f['stderr'][k]:.2g}" for k, v in f["params"].items())
            lines.append(f"{name} {law}: {ps}  (R²={f['r2']:.3f}, {f['n_points']} points)")
            for p in f["predictions"]:
                lines.append(f"    C={p['compute']:.4g}: {p['value']:.4f} [{p['band_5']:.4f}, {p['band_95']:.4f}]"
                             + (f"  (extrapolated {p['extrapolation_factor']:.0f}x)" if p["extrapolation_factor"] > 1 else ""))
    if "plot" in report:
        lines.append(f"plot: {report['plot']}")
    return "\n".join(lines)
