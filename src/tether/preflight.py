"""Checks of the user's input that run before a model is built, each failing with one line.

`tether train|sft` call `check_run_inputs` right after the config is validated: the run
directory can be written, the run trains something, the data can be read (encoding, JSON,
duplicate ids: tether.tasks; every row of a `datasets` source, tether.tasks.fields), the reward
components' model references hold (tether.rewards), a `model.path` directory holds a config, a
tokenizer that fits the model's embedding and, when prompts are chat-templated (data.chat, or
rows of chat messages), a chat template that renders them, and `model.lora.target_modules` name
modules the model has (tether.policy.checks). Only tokenizers, config.json and safetensors
headers are read here, not the weights, so a bad input costs seconds. Pipelines run the same
checks for every stage before the first one (tether.preflight_stages).

Prompts longer than the context are found once the tokenizer exists (`fit_prompts`, called by
the RL recipe): skipped with a counted warning or refused (`data.on_overlong`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tether.config import TetherConfig
from tether.errors import InputError
from tether.policy.pretrained import check_model_dir, check_tokenizer


def check_run_dir(run_dir: str | Path) -> None:
    """The run directory is a directory (or can become one) on a writable file system."""
    rd = Path(run_dir)
    for q in (rd, *rd.parents):
        if not q.exists():
            continue
        if not q.is_dir():
            where = "is a file" if q == rd else f"is under {q}, which is a file"
            raise InputError(f"--run-dir {rd} {where}, not a directory: choose another --run-dir")
        if not os.access(q, os.W_OK | os.X_OK):
            read_only = bool(os.statvfs(q).f_flag & os.ST_RDONLY)
            why = "is on a read-only file system" if read_only else "is not writable (permission denied)"
            raise InputError(f"--run-dir {rd}: {q} {why}: choose a writable --run-dir")
        return


def check_steps(cfg: TetherConfig, kind: str) -> None:
    """`train.steps=0` (or `sft.steps=0`) would write a run that trained nothing."""
    key, steps = ("sft.steps", cfg.sft.steps) if kind == "sft" else ("train.steps", cfg.train.steps)
    if steps == 0:
        raise InputError(f"{key}=0: nothing to train; set {key} >= 1 "
                         "(to evaluate a model without training, use `tether eval CONFIG`)")


def _read_model_config(p: Path) -> dict[str, Any]:
    check_model_dir(p)
    cfg_file = p / "config.json"
    try:
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{cfg_file}: not valid JSON ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise InputError(f"{cfg_file}: no \"model_type\" key; transformers cannot tell which architecture to build")
    return data


def check_model_path(cfg: TetherConfig, needs_template: str | None, problems: Sequence[dict[str, Any]] = ()) -> None:
    """config.json and the tokenizer of `model.path`, without loading the weights; with a template
    needed, the first `problems` are rendered through it (a template may refuse their roles)."""
    p = Path(cfg.model.path)
    if p.is_dir() and (p / "adapter_config.json").is_file():  # a LoRA adapter: checked when its base is loaded
        return
    data = _read_model_config(p)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"model.path={str(p)!r}: cannot load its tokenizer ({first})") from None
    rows = data.get("vocab_size", data.get("text_config", {}).get("vocab_size"))
    check_tokenizer(tokenizer, rows if isinstance(rows, int) else None, needs_template, f"model.path={str(p)!r}")
    if needs_template:
        from tether.policy.chat import encode_prompt

        for problem in problems[:8]:  # TemplateError: the template's own raise_exception, named
            encode_prompt(tokenizer, problem, cfg.data.chat)


def check_run_inputs(cfg: TetherConfig, run_dir: str | Path, kind: str) -> None:
    """Everything about the user's input that can be checked before a model is built (see module doc)."""
    check_run_dir(run_dir)
    if kind in ("rl", "sft"):
        check_steps(cfg, kind)
    check_config_inputs(cfg)


def check_config_inputs(cfg: TetherConfig) -> None:
    """The inputs one config names (data, rewards, model directory, chat template, LoRA targets); run for
    `tether train|sft` and for every stage of a pipeline before its first stage (tether.preflight_stages)."""
    env_task, problems = check_data(cfg)
    if env_task and cfg.env.context.builder == "summary":
        from tether.envs.context import load_summarizer

        load_summarizer(cfg.env.context.summarizer)  # ConfigError: not importable / not a function
    elif not env_task:
        from tether.rewards.compose import build_reward_spec

        build_reward_spec(cfg.reward)  # ConfigError / UnknownNameError: names, modules, kwargs, model references
    needs = _template_reason(cfg, env_task, problems)
    if cfg.model.path:
        check_model_path(cfg, needs, [p for p in problems if cfg.data.chat or p.get("messages")])
    if cfg.model.lora is not None:
        from tether.policy.checks import build_skeleton, check_lora_targets

        check_lora_targets(build_skeleton(cfg.model.path, cfg.model.tiny), cfg.model.lora)


def _template_reason(cfg: TetherConfig, env_task: bool, problems: Sequence[dict[str, Any]]) -> str | None:
    """Why prompts go through the chat template (the setting to name), or None when they do not."""
    if cfg.data.chat:
        return "data.chat=true"
    if env_task:
        return f"data.task={cfg.data.task}"
    first = next((p for p in problems if p.get("messages")), None)
    if first is not None:
        return f"data.prompt_key={cfg.data.prompt_key} (the rows are chat messages, e.g. id {first.get('id')!r})"
    return None


def check_data(cfg: TetherConfig) -> tuple[bool, list[dict[str, Any]]]:
    """Read or generate the problems as the recipe will (DataError names file:line for encoding,
    JSON, missing keys, duplicate ids; file, row and field for `datasets` sources); returns whether the
    task is a multi-turn environment, and the rows of a data source (none for generated tasks)."""
    from tether.tasks import make_splits
    from tether.tasks.sources import check_source

    d = cfg.data
    rows = check_source(d)  # a data source's rows (tether.tasks.sources): read as the recipe will
    if rows is not None:
        return False, rows
    make_splits(d.task, d.train_size, d.eval_size, d.seed, d.task_kwargs)  # UnknownNameError lists the tasks
    from tether.rollout import make_rollout

    return make_rollout(cfg).multi_turn, []  # a fact of the task's rollout (tether.rollout), not a name test


