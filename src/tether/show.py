"""`tether show RUN_DIR`: a plain-text summary of a run (config highlights, progress, results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tether.io.run_dir import read_metrics

HEADLINE_KEYS = ["reward/mean", "accuracy", "eval/pass@1", "eval/greedy_accuracy", "kl_loss", "entropy",
                 "response_length/mean", "clip_frac", "grad_norm", "frac_zero_variance_groups", "logp_gap_mean",
                 "reward/error_rate", "time/step"]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def render_run_summary(run_dir: Path) -> str:
    run_dir = Path(run_dir)
    lines = [f"run: {run_dir}"]
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
        algo = cfg.get("algo", {})
        lines.append(
            f"config: task={cfg.get('data', {}).get('task')} model={cfg.get('model', {}).get('path') or 'tiny (built locally)'} "
            f"advantage={algo.get('advantage', {}).get('name')} loss={algo.get('policy_loss', {}).get('name')} "
            f"agg={algo.get('agg', {}).get('mode')} kl={algo.get('kl', {}).get('coef')} "
            f"n={cfg.get('rollout', {}).get('n')} B_p={cfg.get('rollout', {}).get('problems_per_step')} "
            f"steps={cfg.get('train', {}).get('steps')} lr={cfg.get('train', {}).get('lr')}"
        )
    elif summary is None:
        subs = [d.name for d in sorted(run_dir.iterdir()) if (d / "config.yaml").is_file()]
        if not subs:
            raise FileNotFoundError(f"{run_dir}: no config.yaml or summary.json: not a tether run directory")
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.is_file():
        rows = read_metrics(metrics_path)
        train_rows = [r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r]
        lines.append(f"steps logged: {len(train_rows)}")
        if train_rows:
            first, last = train_rows[0], train_rows[-1]
            lines.append(f"{'metric':28s} {'first':>10s} {'last':>10s}")
            for k in HEADLINE_KEYS:
                if k in last or k in first:
                    lines.append(f"{k:28s} {_fmt(first.get(k, '-')):>10s} {_fmt(last.get(k, '-')):>10s}")
    if summary:
        lines.append("summary:")
        for k, v in summary.items():
            if not isinstance(v, (dict, list)):
                lines.append(f"  {k:28s} {_fmt(v)}")
    ckpts = sorted((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() else []
    if ckpts:
        lines.append(f"checkpoints: {', '.join(c.name for c in ckpts)}")
    subs = [d.name for d in sorted(run_dir.iterdir()) if d.is_dir() and (d / "config.yaml").is_file()]
    if subs:
        lines.append(f"sub-runs: {', '.join(subs)} (tether show {run_dir}/<sub>)")
    health = run_dir / "health.jsonl"
    if health.is_file() and health.stat().st_size:
        n = sum(1 for _ in health.open())
        lines.append(f"health events: {n} (tether doctor {run_dir})")
    return "\n".join(lines)
