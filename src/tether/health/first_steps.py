"""First-steps findings: why a run's reward is flat, read from its files, each with its fix.

A new model on new data often "trains" without learning, and nothing fails: the reward stays
flat. The causes seen most are visible in the first steps of the run directory, so `tether doctor`
checks them (`find_first_step_findings`) beside the health detectors:

| finding | what the first steps show (the first FIRST_STEPS steps) |
|---|---|
| `all_rewards_zero` | every sampled reward is 0 |
| `zero_variance_groups` | most groups (>= 80%) have one reward for every sample: no advantage to learn from |
| `completions_truncated` | most completions (>= 50%) end at max_new_tokens: answers are cut off |
| `prompts_skipped` | prompts longer than the limit were left out of training or evaluation |
| `answers_unparsed` | the reward finds no answer in almost any (>= 90%) stored completion (the reward function's `finds_answer`) |
| `prompt_format_mismatch` | chat requests to a raw-prompt model, or the reverse (tether.rollout.prompt_format) |
| `sft_target_empty` | an SFT run whose demonstrations are (mostly) empty: only the stop token is trained |

Inputs: metrics.jsonl (`reward/mean`, `reward/std`, `frac_zero_variance_groups`, `truncation_rate`,
`rollout/prompt_format_mismatch`), summary.json (`prompts_skipped`, `sft_empty_targets`,
`model_prompt_format`), config.yaml (the reward, the token budget) and samples/step_*.jsonl.gz.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

FIRST_STEPS = 10
SAMPLE_FILES = 5


@dataclass(frozen=True)
class StepFinding:
    """One first-steps finding: its name, what the run shows, and the fix."""

    name: str
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_config(run: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_samples(run: Path) -> list[dict[str, Any]]:
    """The stored completions of the first training steps (samples/step_*.jsonl.gz)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((run / "samples").glob("step_*.jsonl.gz"))[:SAMPLE_FILES]:
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                rows.extend(json.loads(line) for line in f if line.strip())
        except (OSError, ValueError, EOFError):
            continue
    return rows


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _reward_findings(rows: list[dict[str, Any]], cfg: dict[str, Any], samples: list[dict[str, Any]]) -> list[StepFinding]:
    out = []
    means = [r["reward/mean"] for r in rows if isinstance(r.get("reward/mean"), (int, float))]
    stds = [r.get("reward/std") or 0.0 for r in rows]
    if means and all(m == 0 for m in means) and all(s == 0 for s in stds):
        exact = next((s for s in samples if str(s.get("completion", "")).strip() == str(s.get("answer", "")).strip()
                      and s.get("answer") not in (None, "")), None)
        if exact is not None:
            fix = (f"the reward scored a completion equal to the gold answer ({str(exact['answer'])[:40]!r}) 0: the "
                   "reward function does not fit these answers. Use one that does, e.g. "
                   "reward.components=[{name: exact_match}] for text answers")
        else:
            fix = ("the model never produces a rewarded answer: start from a model that sometimes does (an SFT cold "
                   "start, `tether pipeline`, on the data's answers or `completion` column), use easier rows, or check "
                   "the reward on a few samples by hand (samples/step_*.jsonl.gz)")
        out.append(StepFinding("all_rewards_zero", f"every sampled reward of the first {len(means)} steps is 0", fix))
    zero_var = _mean(rows, "frac_zero_variance_groups")
    if zero_var is not None and zero_var >= 0.8 and not (means and all(m == 0 for m in means)):
        solved = means and sum(means) / len(means) >= 0.95
        fix = ("nearly every problem is already solved: train on harder rows" if solved else
               "raise rollout.n (more samples per problem), mix in problems of middle difficulty, or set "
               "algo.dynamic_sampling.enable=true to refill the batch with groups that differ")
        out.append(StepFinding("zero_variance_groups", f"{zero_var:.0%} of the groups of the first {len(rows)} steps "
                                                       "gave every sample the same reward: no advantage to learn from",
                               fix))
    return out


def _length_findings(rows: list[dict[str, Any]], cfg: dict[str, Any], summary: dict[str, Any]) -> list[StepFinding]:
    out = []
    trunc = _mean(rows, "truncation_rate")
    if trunc is not None and trunc >= 0.5:
        budget = ((cfg.get("rollout") or {}).get("sampling") or {}).get("max_new_tokens")
        out.append(StepFinding("completions_truncated", f"{trunc:.0%} of the completions of the first {len(rows)} steps "
                               f"stop at rollout.sampling.max_new_tokens={budget}: answers are cut off before they end",
                               "raise rollout.sampling.max_new_tokens and eval.sampling.max_new_tokens (configs/byo.yaml: "
                               "auto fits them to the data), or train on shorter answers"))
    skipped = summary.get("prompts_skipped") or {}
    during = sum(float(r.get("rollout/prompts_skipped") or 0) for r in rows)
    total = sum(int(v) for v in skipped.values() if isinstance(v, (int, float))) + during
    if total:
        limit = (cfg.get("rollout") or {}).get("max_prompt_tokens")
        where = ", ".join(f"{k}: {v}" for k, v in skipped.items() if v) or f"{during:.0f} during the first steps"
        out.append(StepFinding("prompts_skipped", f"{total:.0f} prompts were longer than the prompt limit "
                               f"(rollout.max_prompt_tokens={limit} or the model's context) and left out ({where})",
                               "raise rollout.max_prompt_tokens (configs/byo.yaml: auto fits it to the data) within the "
                               "model's context, or shorten the prompts"))
    return out


def _answers_unparsed(cfg: dict[str, Any], samples: list[dict[str, Any]]) -> list[StepFinding]:
    """The first reward component's `finds_answer` fact over the stored completions."""
    from tether.rewards import REWARD_FUNCTIONS

    comps = (cfg.get("reward") or {}).get("components") or [{"name": "exact_match"}]
    name = str(comps[0].get("name", "")) if isinstance(comps[0], Mapping) else ""
    try:
        fn = REWARD_FUNCTIONS[name]
    except (KeyError, ValueError):
        return []  # a user's function (package.module:fn) states no such fact
    finds = getattr(fn, "finds_answer", None)
    texts = [str(s.get("completion") or "") for s in samples if "completion" in s]
    if finds is None or len(texts) < 4:
        return []
    missed = [t for t in texts if not finds(t)]
    if len(missed) < 0.9 * len(texts):
        return []
    return [StepFinding("answers_unparsed", f"the reward ({name}) finds no answer in {len(missed)} of {len(texts)} "
                        f"stored completions of the first steps (e.g. {missed[0][:60]!r})",
                        f"make the model write its answer in a form {name} reads (an SFT cold start on answers in that "
                        "form, or an instruction in the prompt), or score with a reward that reads the model's form "
                        "(reward.components=[{name: exact_match}] for plain text answers)")]


def _format_and_sft(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[StepFinding]:
    from tether.policy.prompt_format import CHAT, RAW, mismatch_message

    out = []
    mismatch = _mean(rows, "rollout/prompt_format_mismatch")
    if mismatch:
        trained = summary.get("model_prompt_format")
        message = (mismatch_message(trained, RAW if trained == CHAT else CHAT, "the run") if trained in (CHAT, RAW)
                   else "prompt format mismatch: chat requests against a raw-prompt model, or the reverse")
        head, _, fix = message.partition(" Fix: ")
        out.append(StepFinding("prompt_format_mismatch", f"{head} ({mismatch:.0%} of the requests of the first "
                                                         f"{len(rows)} steps)", fix or "use the model's training format"))
    empty = summary.get("sft_empty_targets")
    if isinstance(empty, (int, float)) and empty > 0:
        out.append(StepFinding("sft_target_empty", f"{empty:.0%} of the SFT demonstrations have an empty target: the "
                               "model only learns to stop at once",
                               "SFT trains on the `completion` column when the rows have one, else on the gold answer "
                               "(data.answer_key): fill that column, or point data.answer_key at the right one"))
    return out


def find_first_step_findings(run_dir: str | Path) -> list[StepFinding]:
    """The first-steps findings of a run directory (module docstring); [] when none applies."""
    from tether.io.run_dir import read_metrics

    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    all_rows = read_metrics(metrics) if metrics.is_file() else []
    rows = [r for r in all_rows if isinstance(r.get("step"), int) and r["step"] > 0 and "reward/mean" in r][:FIRST_STEPS]
    cfg, summary = _read_config(run), _read_json(run / "summary.json")
    samples = _read_samples(run) if rows else []
    out = _reward_findings(rows, cfg, samples) + _length_findings(rows, cfg, summary)
    if rows and samples:
        out += _answers_unparsed(cfg, samples)
    return out + _format_and_sft(rows, summary)
