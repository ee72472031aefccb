"""`tether show RUN_DIR`: a plain-text summary of a run of any kind.

Every run: its kind, status and result model (tether.runs.result, with its note), the runs it
started from, the config settings that matter for its kind (RL settings only for RL-style runs),
first and last values of its headline metrics, its summary and checkpoints. A pipeline lists its
stages, a sweep its table (mean +- s.e. per arm) and runs, a context comparison its ordering, a
fault benchmark its scores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tether.api.run import Run, open_run
from tether.io.run_dir import read_metrics
from tether.runs.record import KINDS
from tether.runs.result import NoResult, NoSingleResult

HEADLINE_KEYS = {
    "rl": ["reward/mean", "accuracy", "eval/pass@1", "eval/greedy_accuracy", "kl_loss", "entropy", "response_length/mean",
           "clip_frac", "grad_norm", "frac_zero_variance_groups", "logp_gap_mean", "reward/error_rate", "time/step"],
    "sft": ["sft/loss", "lr", "time/step"],
    "dpo": ["dpo/loss", "dpo/accuracy", "dpo/margin", "time/step"],
    "rm": ["rm/loss", "rm/train_batch_accuracy", "rm/eval_pair_accuracy", "rm/grad_norm"],
}
HEADLINE_KEYS.update({"distill": HEADLINE_KEYS["rl"] + ["distill/reverse_kl"], "rl_async": HEADLINE_KEYS["rl"],
                      "rs_sft": HEADLINE_KEYS["sft"]})


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


CONFIG_LINES = {  # the settings `show` prints per kind: label -> dotted config key
    "rl": {"advantage": "algo.advantage.name", "loss": "algo.policy_loss.name", "agg": "algo.agg.mode", "kl": "algo.kl.coef",
           "n": "rollout.n", "B_p": "rollout.problems_per_step", "steps": "train.steps", "lr": "train.lr"},
    "sft": {"steps": "sft.steps", "lr": "sft.lr", "batch": "sft.batch_size", "demo_noise": "sft.demo_noise"},
    "rs_sft": {"k": "rs_sft.k", "keep": "rs_sft.keep", "steps": "sft.steps", "lr": "sft.lr"},
    "dpo": {"loss": "dpo.loss", "beta": "dpo.beta", "pairs": "dpo.pairs", "steps": "dpo.steps", "lr": "dpo.lr"},
    "rm": {"pairs": "rm.pairs", "steps": "rm.steps", "lr": "rm.lr", "batch": "rm.batch_size"},
    "merge": {"method": "merge.method", "models": "merge.models", "weights": "merge.weights"},
    "distill": {"teacher": "distill.teacher", "kl_coef": "distill.kl_coef", "steps": "train.steps", "lr": "train.lr"},
    "eval": {},
}
CONFIG_LINES["rl_async"] = CONFIG_LINES["rl"]  # pipelines, demos and comparisons: their RL stage's settings


def _header(run: Run) -> list[str]:
    rec = run.record
    lines = [f"run: {run.path}", f"kind: {run.kind or 'unknown'} ({KINDS.get(run.kind or '', 'an older run directory')})"
             f"  status: {run.status}"]
    try:
        res = run.result()
        lines.append(f"result: {res.path}" + (f" (step {res.step})" if res.step is not None else "")
                     + (" - LoRA adapter (tether export merges it)" if (res.path / "adapter_config.json").is_file() else ""))
        if res.note:
            lines.append(f"note: {res.note}")
    except NoSingleResult:
        pass
    except NoResult as err:
        lines.append(f"result: none yet ({str(err).split(': ', 1)[-1]})")
    if rec.parents:
        lines.append(f"started from: {', '.join(rec.parents)}")
    return lines


def _config_line(run: Run) -> list[str]:
    cfg = run.config
    if cfg is None:
        return []
    model = cfg.model.path or "tiny (built locally)"
    parts = [f"task={cfg.data.task}", f"model={model}", f"lora={'yes' if cfg.model.lora else 'no'}",
             f"chat_template={'yes' if cfg.data.chat else 'no'}"]
    parts += [f"{label}={_fmt(_get(cfg, key))}" for label, key in CONFIG_LINES.get(run.kind or "rl", CONFIG_LINES["rl"]).items()]
    return ["config: " + " ".join(parts)]


def _metric_lines(run: Run) -> list[str]:
    path = run.path / "metrics.jsonl"
    if not path.is_file():
        return []
    keys = HEADLINE_KEYS.get(run.kind or "rl", HEADLINE_KEYS["rl"])
    rows = [r for r in read_metrics(path) if r.get("step", 0) > 0 and any(k in r for k in keys)]
    lines = [f"steps logged: {len(rows)}"]
    if rows:
        first, last = rows[0], rows[-1]
        lines.append(f"{'metric':28s} {'first':>10s} {'last':>10s}")
        lines += [f"{k:28s} {_fmt(first.get(k, '-')):>10s} {_fmt(last.get(k, '-')):>10s}" for k in keys if k in last or k in first]
    return lines


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    scalars = [(k, v) for k, v in summary.items() if not isinstance(v, (dict, list)) and k != "kind"]
    return ["summary:", *(f"  {k:28s} {_fmt(v)}" for k, v in scalars)] if scalars else []


def _members_lines(run: Run) -> list[str]:
    members = run.members
    if not members:
        return []
    what = "stages" if run.kind in ("pipeline", "demo") else "runs"
    lines = [f"{what} ({len(members)}):"]
    for m in members:
        try:
            res = m.result()  # an eval stage's result is the model it evaluated, outside its folder
            result = f"result {os.path.relpath(res.path, m.path)}" + (" (did not finish)" if res.note else "")
        except (NoResult, NoSingleResult):
            result = "no result yet"
        value = next((m.summary[k] for k in ("final_accuracy", "final_pair_accuracy", "final_loss") if
                      isinstance(m.summary.get(k), (int, float))), None)
        lines.append(f"  {m.path.relative_to(run.path).as_posix():32s} {m.kind or '?':8s} {m.status:11s} {result}"
                     + (f"  {_fmt(float(value))}" if value is not None else ""))
    return lines + [f"(tether show {run.path}/<{what[:-1]}>)"]


def _sweep_lines(run: Run) -> list[str]:
    from tether.sweep import format_table

    path = run.path / "sweep.json"
    if not path.is_file():
        return ["sweep: no sweep.json yet (runs in progress or not started)"]
    payload = json.loads(path.read_text())
    lines = [format_table(payload["table"])]
    if payload.get("failures"):
        lines.append(f"failed runs: {'; '.join(payload['failures'])}")
    return lines


def _special_lines(run: Run) -> list[str]:
    s = run.summary
    if run.kind == "sweep":
        return _sweep_lines(run)
    if run.kind == "compare_context" and s:
        return [f"ordering by final held-out pass@1: {s.get('ordering_text')}"]
    if run.kind == "faultbench":
        res = run.path / "results.json"
        if res.is_file():
            from tether.recipes.faultbench import format_results

            return [format_results(json.loads(res.read_text()))]
    return []


def render_run_summary(run_dir: str | Path) -> str:
    """The `tether show` text of the run at `run_dir` (any kind)."""
    run = open_run(run_dir)
    lines = _header(run) + _config_line(run) + _metric_lines(run) + _special_lines(run)
    if run.kind not in ("sweep", "faultbench"):
        lines += _summary_lines(run.summary)
    ckpts = sorted((run.path / "checkpoints").glob("step_*")) if (run.path / "checkpoints").is_dir() else []
    if ckpts:
        lines.append(f"checkpoints: {', '.join(c.name for c in ckpts)}")
    lines += _members_lines(run)
    health = run.path / "health.jsonl"
    if health.is_file() and health.stat().st_size:
        n = sum(1 for _ in health.open())
        lines.append(f"health events: {n} (tether doctor {run.path})")
    return "\n".join(lines)


def show(run: Any) -> str:
    """The `tether show` text of a run (a path or a Run): `tether.show(run)`."""
    return render_run_summary(getattr(run, "path", run))
