"""Learning curves of a `tether sweep`: one metrics.jsonl key by step, mean +- standard error over
seeds per arm (the same statistics as the sweep table, `tether.sweep.compute_arm_stats`).

    python -m tether.report.sweep_curves SWEEP_DIR --key eval/pass@1 [--stage rl]
    # -> SWEEP_DIR/curves.json and SWEEP_DIR/plots/curves.png

Reads the runs listed in SWEEP_DIR/sweep.json; a run's curve comes from `<run>/<stage>/metrics.jsonl`
(a pipeline stage), else `<run>/metrics.jsonl`, else `<run>/rl/metrics.jsonl`. A step enters an
arm's curve with the seeds that logged the key at that step (n is recorded per point).
Used by docs/findings.md (SFT warm start vs cold-start RL, DeepSWE / Cast-R1).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from tether.sweep import compute_arm_stats


def _metrics_path(run_dir: Path, stage: str | None) -> Path | None:
    cands = ([run_dir / stage / "metrics.jsonl"] if stage else []) + [run_dir / "metrics.jsonl",
                                                                     run_dir / "rl" / "metrics.jsonl"]
    return next((p for p in cands if p.exists()), None)


def read_curve(run_dir: Path, key: str, stage: str | None = None) -> dict[int, float]:
    """{step: value} of `key` in one run's metrics.jsonl (finite numbers only; the last row of a step wins)."""
    path = _metrics_path(Path(run_dir), stage)
    out: dict[int, float] = {}
    if path is None:
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and "step" in row:
            out[int(row["step"])] = float(v)
    return out


def compute_sweep_curves(runs: Sequence[Mapping[str, Any]], key: str, stage: str | None = None,
                         root: str | Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """{arm: [{step, n, mean, se}, ...]} from sweep.json's `runs` rows (arm, seed, run_dir); a
    relative run_dir is read under `root`, the sweep directory."""
    by_arm: dict[str, dict[int, list[float]]] = {}
    for r in runs:
        steps = by_arm.setdefault(r["arm"], {})
        run_dir = Path(r["run_dir"])
        if root is not None and not run_dir.is_absolute():
            run_dir = Path(root) / run_dir
        for step, v in read_curve(run_dir, key, stage).items():
            steps.setdefault(step, []).append(v)
    return {arm: [{"step": s, **compute_arm_stats(vals)} for s, vals in sorted(steps.items())]
            for arm, steps in by_arm.items()}


def plot_sweep_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], key: str, path: Path) -> Path:
    """One line per arm with a +-1 s.e. band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for i, (arm, pts) in enumerate(curves.items()):
        xs = [p["step"] for p in pts]
        ms = [p["mean"] for p in pts]
        ses = [p["se"] if math.isfinite(p["se"]) else 0.0 for p in pts]
        ax.plot(xs, ms, marker="o", markersize=3, color=f"C{i}", label=arm)
        ax.fill_between(xs, [m - s for m, s in zip(ms, ses)], [m + s for m, s in zip(ms, ses)], color=f"C{i}", alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title("mean ± standard error over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tether.report.sweep_curves", description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--key", default="eval/pass@1", help="metrics.jsonl key (default eval/pass@1)")
    ap.add_argument("--stage", default=None, help="pipeline stage folder whose metrics to read (e.g. rl)")
    args = ap.parse_args(argv)
    sweep_json = args.sweep_dir / "sweep.json"
    if not sweep_json.exists():
        print(f"error: {sweep_json} not found: run `tether sweep ... --out {args.sweep_dir}` first")
        return 2
    curves = compute_sweep_curves(json.loads(sweep_json.read_text())["runs"], args.key, args.stage, sweep_json.parent)
    (args.sweep_dir / "curves.json").write_text(json.dumps({"key": args.key, "stage": args.stage, "curves": curves},
                                                           indent=1, default=float))
    png = plot_sweep_curves(curves, args.key, args.sweep_dir / "plots" / "curves.png")
    for arm, pts in curves.items():
        print(f"{arm}: " + "  ".join(f"{p['step']}:{p['mean']:.3f}±{p['se']:.3f}" for p in pts))
    print(f"-> {args.sweep_dir / 'curves.json'}, {png}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
