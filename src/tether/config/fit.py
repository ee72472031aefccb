"""Settings that follow the model and the data: `auto` values of a config, resolved when it is loaded.

    train: {lr: auto, steps: auto}                   # configs/byo.yaml
    rollout: {max_prompt_tokens: auto, sampling: {max_new_tokens: auto}}

A config meant for any model and any dataset (configs/byo.yaml) cannot hold one learning rate or
one token budget: 1e-6 and 512 new tokens suit a 0.5B instruct model on math, and leave a tiny
model flat on short answers. Each key below may be `auto`; `load_config` then reads the model
(`model.path`: its parameter count from the weight files' headers, its tokenizer and context)
and the data (the training rows: prompt and SFT-target lengths in that tokenizer's tokens) and
writes a number, printing it with its reason. The resolved values are what the run directory's
config.yaml records; an explicit value (in the file or as an override) is never changed.

| key | rule |
|---|---|
| `train.lr` | log-linear in the parameter count between 1e-4 at 3.3M (configs/reverse.yaml's tiny model) and 1e-6 at 500M (a common GRPO setting for 0.5B-7B models), within [5e-7, 3e-4] |
| `sft.lr` | the same between 2e-3 at 3.3M (configs/reverse.yaml) and 1e-5 at 500M (full fine-tuning of 0.5B-7B models), within [5e-6, 2e-3] |
| `rollout.sampling.max_new_tokens`, `eval.sampling.max_new_tokens` | twice the 99th percentile of the SFT targets' length (the `completion` column, else the answer) plus the stop token, at least 8; 512 for a model of 100M+ parameters whose rows hold only a final answer (it writes its reasoning first) |
| `rollout.max_prompt_tokens` | the longest prompt of the rows read, rendered as the run renders it, within the model's context minus max_new_tokens |
| `train.steps` | one pass over the training rows at `rollout.problems_per_step`, within [20, 200] (docs/byo.md's example at 100 steps: two of three seeds under +10 points, benchmarks/results/byo_lift_rl100.json) |
| `sft.steps` | three passes over the training rows at `sft.batch_size`, within [50, 1000] |

Every `auto` key needs `model.path`: without it the error says so (a forgotten `model.path`
would otherwise build a tiny model that fails later with an unrelated message).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

from tether.config_text import ConfigError
from tether.errors import UserError

AUTO = "auto"
FITTED = ("train.lr", "sft.lr", "rollout.sampling.max_new_tokens", "eval.sampling.max_new_tokens",
          "rollout.max_prompt_tokens", "train.steps", "sft.steps")
SAMPLE_ROWS = 2000  # rows read for the length statistics
REF_SMALL, REF_LARGE = 3.3e6, 5e8  # parameter counts of the two anchors of the learning-rate rules


def _get(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def find_auto_keys(data: Mapping[str, Any]) -> list[str]:
    """The FITTED keys whose value is `auto` in a raw config dict."""
    return [k for k in FITTED if _get(data, k) == AUTO]


def compute_param_count(model_dir: str | Path) -> int:
    """Parameters of a local Hugging Face model, from its safetensors headers (no weights loaded);
    a model without safetensors is built on the meta device from its config."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if files:
        total = 0
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
        return int(total)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir), local_files_only=True))
    return int(sum(p.numel() for p in model.parameters()))


def compute_loglinear(n_params: float, small: float, large: float, lo: float, hi: float) -> float:
    """`small` at REF_SMALL parameters, `large` at REF_LARGE, log-linear between (and beyond), in [lo, hi]."""
    t = (math.log(n_params) - math.log(REF_SMALL)) / (math.log(REF_LARGE) - math.log(REF_SMALL))
    value = math.exp(math.log(small) + t * (math.log(large) - math.log(small)))
    return float(f"{min(hi, max(lo, value)):.2g}")


def compute_percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _read_rows(d: Any) -> tuple[list[dict[str, Any]], list[str], bool]:
    """(up to SAMPLE_ROWS training problems, their SFT targets, whether each target is the answer alone):
    a data source's rows (the `completion` column, else the answer), or a built-in task's generated ones."""
    from tether.rollout import sample_task_demonstrations
    from tether.tasks.sources import sample_source_rows

    rows = sample_source_rows(d, SAMPLE_ROWS)
    if rows is None:
        return (*sample_task_demonstrations(d, SAMPLE_ROWS), False)
    targets = [str(r.get("completion") or r.get("answer") or "") for r in rows]
    return rows, targets, not any(r.get("completion") for r in rows)


def compute_fitted_values(keys: list[str], data: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """{key: (value, reason)} for the `auto` keys of `data` (module docstring's rules)."""
    from transformers import AutoConfig, AutoTokenizer

    from tether.config.stages import SFTConfig
    from tether.rollout.config import RolloutConfig
    from tether.tasks.config import DataConfig
    from tether.policy.chat import encode_prompt

    model_dir = str(_get(data, "model.path"))
    n = compute_param_count(model_dir)
    d = DataConfig.model_validate(data.get("data") or {})
    out: dict[str, tuple[Any, str]] = {}
    size = f"a {n / 1e6:.3g}M-parameter model"
    rules: dict[str, Callable[[], tuple[Any, str]]] = {
        "train.lr": lambda: (compute_loglinear(n, 1e-4, 1e-6, 5e-7, 3e-4),
                             f"{size}; log-linear between 1e-4 at 3.3M and 1e-6 at 500M parameters"),
        "sft.lr": lambda: (compute_loglinear(n, 2e-3, 1e-5, 5e-6, 2e-3),
                           f"{size}; log-linear between 2e-3 at 3.3M and 1e-5 at 500M parameters"),
    }
    for key in keys:
        if key in rules:
            out[key] = rules[key]()
    rest = [k for k in keys if k not in rules]
    if not rest:
        return out
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    positions = int(getattr(AutoConfig.from_pretrained(model_dir, local_files_only=True), "max_position_embeddings",
                            1 << 30))
    rows, targets, answer_only = _read_rows(d)
    if not rows:
        raise ConfigError(f"data.path={d.path}: no rows to fit the auto settings to")
    lengths = [len(tok.encode(t, add_special_tokens=False)) + 1 for t in targets]
    p99 = compute_percentile(lengths, 0.99)
    if answer_only and n >= 1e8:
        new, why = 512, (f"{size} writes its reasoning before the answer, and the rows hold only the final answer "
                         f"(99% of answers <= {p99} tokens)")
    else:
        new, why = max(8, 2 * p99), f"twice the 99th percentile of the SFT targets' length ({p99} tokens with the stop)"
    new = min(new, max(8, positions // 2))
    for key in ("rollout.sampling.max_new_tokens", "eval.sampling.max_new_tokens"):
        if key in rest:
            out[key] = (new, why)
    new_used = max(v for v in (new, _get(data, "rollout.sampling.max_new_tokens"), _get(data, "eval.sampling.max_new_tokens"),
                               32) if isinstance(v, int))
    if "rollout.max_prompt_tokens" in rest:
        longest = max(len(encode_prompt(tok, r, d.chat)) for r in rows)
        value = min(8 * math.ceil(longest / 8), positions - new_used)
        out["rollout.max_prompt_tokens"] = (value, f"the longest of {len(rows)} prompts is {longest} tokens (model "
                                                   f"context {positions})")
    if "train.steps" in rest:
        per = _get(data, "rollout.problems_per_step")
        per = per if isinstance(per, int) else RolloutConfig().problems_per_step
        out["train.steps"] = (min(200, max(20, math.ceil(len(rows) / per))),
                              f"one pass over {len(rows)} rows at {per} problems per step, within [20, 200]")
    if "sft.steps" in rest:
        batch = _get(data, "sft.batch_size")
        batch = batch if isinstance(batch, int) else SFTConfig().batch_size
        out["sft.steps"] = (min(1000, max(50, math.ceil(3 * len(rows) / batch))),
                            f"three passes over {len(rows)} rows at batch {batch}, within [50, 1000]")
    return out


def do_fit_auto(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Resolve the `auto` values of a raw config dict in place (module docstring); prints each with its reason."""
    keys = find_auto_keys(data)
    if not keys:
        return data
    model_path = _get(data, "model.path")
    if not model_path:
        raise ConfigError(f"{source}: model.path is not set: this config trains your own model ({', '.join(keys)}: "
                          "auto, fitted to it); set model.path=<a local Hugging Face model directory> (docs/byo.md)")
    if not (Path(str(model_path)) / "config.json").is_file():
        raise ConfigError(f"model.path={model_path}: not a model directory (no config.json); it must hold "
                          "config.json, the weights and the tokenizer")
    try:
        fitted = compute_fitted_values(keys, data)
    except UserError:  # a data error names its file and row already
        raise
    except (OSError, ValueError) as err:
        raise ConfigError(f"{source}: cannot fit {', '.join(keys)} to model.path={model_path} "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); give numbers instead of auto") from None
    for key, (value, why) in fitted.items():
        _set(data, key, value)
        print(f"[tether] {key}={value} (auto: {why})", flush=True)
    return data
