"""PNG plots of a run's metrics (training curves) and of pass@k vs k (evaluation).

Uses matplotlib's object API with the Agg canvas directly (no pyplot): no global backend state,
no display needed, safe from threads. Metric names are matched to groups by glob patterns, so the
plots follow whatever telemetry emits; keys that are absent are skipped, never an error.

    rows = read_metrics(run.metrics_path)
    plot_metrics(rows, run.plots_dir)                   # reward.png, kl.png, entropy.png, ...
    plot_eval_curve({"step 0": {1: .2, 4: .5}, "step 100": {1: .4, 4: .7}}, run.plots_dir / "pass_at_k.png")
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Group name -> glob patterns (matched case-insensitively). A key joins the FIRST group that
# matches, so e.g. "reward/accuracy" lands in accuracy, "kl_loss" in kl, "pg_loss" in loss.
DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "accuracy": ("*acc*", "*pass@*", "*correct*", "*maj@*", "*best@*"),
    "reward": ("*reward*", "*score*"),
    "kl": ("kl", "kl[_/]*", "*[_/]kl", "*[_/]kl[_/]*"),
    "entropy": ("*entropy*",),
    "response_length": ("*length*", "*len", "*len[_/]*", "*tokens*"),
    "loss": ("*loss*",),
    "grad_norm": ("*grad_norm*", "*grad/norm*"),
    "clip": ("*clip*",),
    "learning_rate": ("lr", "*[_/]lr", "*learning_rate*"),
}

KeySpec = Sequence[str] | Mapping[str, Sequence[str]] | None


def _finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def compute_groups(metrics_rows: Sequence[Mapping[str, Any]], keys: KeySpec = None) -> dict[str, list[str]]:
    """Group name -> metric keys present in `metrics_rows` (with at least one finite value).

    `keys=None`: `DEFAULT_GROUPS` patterns; a list of keys: one group per key; a mapping
    group -> keys: those groups. Missing keys are dropped, and so are groups left empty.
    """
    present: list[str] = []
    for row in metrics_rows:
        for k, v in row.items():
            if k != "step" and k not in present and _finite_number(v) is not None:
                present.append(k)
    if keys is None:
        groups: dict[str, list[str]] = {}
        for k in present:
            for group, patterns in DEFAULT_GROUPS.items():
                if any(fnmatch.fnmatchcase(k.lower(), p) for p in patterns):
                    groups.setdefault(group, []).append(k)
                    break
        return groups
    if isinstance(keys, Mapping):
        wanted = {g: [k for k in ks if k in present] for g, ks in keys.items()}
    else:
        wanted = {k: [k] for k in keys if k in present}
    return {g: ks for g, ks in wanted.items() if ks}


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", name).strip("_") or "plot"


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, skipping rows where it is missing, None or non-finite."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        y = _finite_number(row.get(key))
        if y is None:
            continue
        x = _finite_number(row.get("step"))
        xs.append(x if x is not None else float(i))
        ys.append(y)
    return xs, ys


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches the Agg canvas to the figure
    fig.savefig(path, format="png", dpi=100)
    return path


def plot_metrics(metrics_rows: Sequence[Mapping[str, Any]], out_dir: str | Path, keys: KeySpec = None) -> list[Path]:
    """Write one PNG line plot per group of metrics present (x: step); return the paths.

    Rows are metrics.jsonl rows (`read_metrics`). Missing keys and groups are skipped; nothing
    present -> no files, no error.
    """
    out = Path(out_dir)
    paths: list[Path] = []
    for group, group_keys in compute_groups(metrics_rows, keys).items():
        fig = Figure(figsize=(6.4, 4.0))
        ax = fig.add_subplot(1, 1, 1)
        for key in group_keys:
            xs, ys = _series(metrics_rows, key)
            ax.plot(xs, ys, label=key, marker="." if len(xs) < 30 else None)
        ax.set_title(group.replace("_", " "))
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if len(group_keys) > 1:
            ax.legend(fontsize="small")
        fig.tight_layout()
        paths.append(_save(fig, out / f"{_safe_filename(group)}.png"))
    return paths


def plot_eval_curve(curves: Mapping[Any, Any], out_path: str | Path, title: str = "pass@k",
                    ylabel: str | None = None) -> Path:
    """Plot metric@k vs k (log2 x axis) to `out_path` (PNG).

    `curves` is either one curve `{k: value}` or several `{label: {k: value}}` (e.g. one per
    checkpoint or per method). Non-finite values are skipped.
    """
    is_single = all(isinstance(k, numbers.Integral) for k in curves)
    named: Mapping[Any, Mapping[Any, Any]] = {title: curves} if is_single else curves
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    for label, curve in named.items():
        pts = sorted((int(k), y) for k, v in curve.items() if (y := _finite_number(v)) is not None)
        if pts:
            ax.plot([k for k, _ in pts], [y for _, y in pts], marker="o", label=str(label))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(ylabel or title)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if not is_single and named:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, Path(out_path))
