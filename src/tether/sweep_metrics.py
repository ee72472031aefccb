"""What a sweep compares (`tether sweep --metric`): reading a metric of a finished run (summary.json
keys and dotted paths, aggregates over metrics.jsonl, a pipeline stage's, the difference of two) and
checking a metric before any run is spent (the summary keys each command's runs write) or against
the first finished run (a metrics.jsonl key). `SweepError` is the sweep's one-line refusal.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from tether.errors import InputError


class SweepError(InputError):
    """Invalid sweep input (grid, seeds, metric, spec mismatch on resume); the CLI prints it in one line
    (a UserError: exit 2; a ValueError too)."""


def _metrics_rows(run_dir: Path, stage: str | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl of a run (or of its RL stage: <run>/rl/metrics.jsonl for a pipeline), or of a
    named pipeline stage (<run>/<stage>/metrics.jsonl)."""
    paths = [run_dir / stage / "metrics.jsonl"] if stage else [run_dir / "metrics.jsonl", run_dir / "rl" / "metrics.jsonl"]
    for path in paths:
        if path.exists():
            return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return []


def metric_of(summary: Mapping[str, Any], metric: str, run_dir: Path | None = None) -> float | None:
    """A value of summary.json by key, or a dotted path into it ("final_eval.eval/pass@1"); a list of
    named entries is indexed by name (a pipeline's "stages.rl_alone.heldout.eval/pass@1").
    `mean:<key>` / `last:<key>` / `max:<key>` / `sum:<key>`: over the training steps (step >= 1) of
    metrics.jsonl; `firstK:<key>` / `lastK:<key>` (e.g. first5, last5): the mean of the first / last K
    of those steps; `<agg>:<key>@<stage>` reads a pipeline stage's (`sum:rollout/gen_tokens@distilled`).
    `A - B` (spaces around the minus): the per-run difference of two metrics, so that a comparison
    of two stages inside one pipeline run gets a mean and standard error over seeds."""
    left, minus, right = metric.partition(" - ")
    if minus:
        a, b = metric_of(summary, left.strip(), run_dir), metric_of(summary, right.strip(), run_dir)
        return None if a is None or b is None else a - b
    agg, sep, key = metric.partition(":")
    window = re.fullmatch(r"(first|last)([1-9][0-9]*)", agg)
    if sep and (agg in ("mean", "last", "max", "sum") or window):
        key, at, stage = key.partition("@")
        vals = [float(r[key]) for r in _metrics_rows(run_dir, stage if at else None) if r.get("step", 0) >= 1
                and isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))] if run_dir else []
        if not vals:
            return None
        if window:  # first5 / last5: the mean of the first / last 5 training steps
            part = vals[:int(window.group(2))] if window.group(1) == "first" else vals[-int(window.group(2)):]
            return sum(part) / len(part)
        return {"mean": sum(vals) / len(vals), "last": vals[-1], "max": max(vals), "sum": sum(vals)}[agg]
    if metric in summary:
        v: Any = summary[metric]
    else:
        v = summary
        for part in metric.split("."):
            if isinstance(v, list):
                v = next((e for e in v if isinstance(e, Mapping) and e.get("name") == part), None)
            elif isinstance(v, Mapping) and part in v:
                v = v[part]
            else:
                return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# The summary.json keys each command's runs write (tests/unit/runs/test_matrix.py checks them against real runs).
_RL_KEYS = ("steps", "interrupted", "wall_seconds", "cpu_seconds", "baseline_accuracy", "final_accuracy",
            "baseline_greedy_accuracy", "final_greedy_accuracy", "final_eval", "nonfinite_steps", "health", "reward_caps",
            "precision", "compile", "kind", "prompt_format", "model_prompt_format", "prompt_format_warning",
            "prompts_skipped")
SUMMARY_KEYS = {
    "train": _RL_KEYS,
    "sft": ("kind", "steps", "final_loss", "final_model", "wall_seconds", "cpu_seconds", "interrupted", "precision",
            "nonfinite_steps", "prompt_format", "sft_empty_targets"),
    "pipeline": ("kind", "task", "context_builder", "seed", "stages", "interrupted_in", "complete", "baseline_accuracy",
                 "final_accuracy", "accuracy_lift", "baseline_greedy_accuracy", "final_greedy_accuracy", "final_turns_mean",
                 "final_answer_tokens", "rl_steps", "precision", "sft_run", "rl_run", "wall_seconds", "cpu_seconds",
                 "members"),
}
AGGREGATES = "mean:KEY, last:KEY, max:KEY, sum:KEY, first5:KEY, last5:KEY (metrics.jsonl keys, e.g. reward/mean; KEY@STAGE for a pipeline stage)"


def check_metric(metric: str, command: str, stages: Sequence[str] = (), what: str = "--metric") -> None:
    """Refuse a metric no run of `command` can have, before any run is spent; the message lists the
    valid ones. A metrics.jsonl key after `mean:` etc. is checked against the first finished run."""
    left, minus, right = metric.partition(" - ")
    if minus:
        check_metric(left.strip(), command, stages, what)
        check_metric(right.strip(), command, stages, what)
        return
    agg, sep, key = metric.partition(":")
    if sep and (agg in ("mean", "last", "max", "sum") or re.fullmatch(r"(first|last)[1-9][0-9]*", agg)):
        key, at, stage = key.partition("@")
        if not key:
            raise SweepError(f"{what} {metric!r}: no metrics.jsonl key after {agg}:; expected {AGGREGATES}")
        if at and stage not in stages:
            raise SweepError(f"{what} {metric!r}: {stage!r} is not a stage of this "
                             f"{'pipeline' if command == 'pipeline' else command + ' run (only a pipeline has stages)'}"
                             + (f" (stages: {', '.join(stages)})" if stages else ""))
        return
    keys = [*SUMMARY_KEYS.get(command, ()), *(f"{s}_seconds" for s in stages)]
    head, _, rest = metric.partition(".")
    if head in keys and (not rest or head not in ("stages",) or rest.partition(".")[0] in stages):
        return
    if head == "stages" and rest:
        raise SweepError(f"{what} {metric!r}: {rest.partition('.')[0]!r} is not a stage (stages: {', '.join(stages) or 'none'})")
    close = difflib.get_close_matches(head, keys, n=1)
    raise SweepError(f"{what} {metric!r} is not a summary key of a `tether {command}` run"
                     + (f" - did you mean {close[0]!r}?" if close else "")
                     + f" (valid: {', '.join(k for k in keys if k != 'kind')}; or {AGGREGATES})")


def check_logged(metric: str, run_dir: Path, what: str = "--metric") -> str | None:
    """For an aggregate over metrics.jsonl (`mean:KEY`, ...): None when the finished run at `run_dir`
    logged KEY, else the reason to stop, naming the keys it has."""
    for part in (p.strip() for p in metric.split(" - ")):
        agg, sep, key = part.partition(":")
        if not sep or agg.startswith(("stages", "final")):
            continue
        key, at, stage = key.partition("@")
        rows = _metrics_rows(run_dir, stage if at else None)
        have = sorted({k for r in rows for k in r if k not in ("step", "nonfinite")})
        if rows and key not in have:
            close = difflib.get_close_matches(key, have, n=1)
            return (f"{what} {part!r}: {run_dir} logged no {key!r}" + (f" - did you mean {close[0]!r}?" if close else "")
                    + f" (its metrics.jsonl keys: {', '.join(have[:40])}{', ...' if len(have) > 40 else ''})")
    return None


__all__ = ["AGGREGATES", "SUMMARY_KEYS", "SweepError", "check_logged", "check_metric", "metric_of"]
