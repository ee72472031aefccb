"""Checks of the user's input that run before a model is built, each failing with one line.

`tether train|sft` call `check_run_inputs` right after the config is validated: the run
directory can be written, the run trains something, the data can be read (encoding, JSON,
duplicate ids: tether.tasks), and a `model.path` directory holds a config, a tokenizer that
fits the model's embedding and, when prompts are chat-templated, a chat template. Only the
tokenizer and config.json are read here, not the weights, so a bad input costs seconds.

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


def check_model_path(cfg: TetherConfig, needs_template: str | None) -> None:
    """config.json and the tokenizer of `model.path`, without loading the weights."""
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


def check_run_inputs(cfg: TetherConfig, run_dir: str | Path, kind: str) -> None:
    """Everything about the user's input that can be checked before a model is built (see module doc)."""
    check_run_dir(run_dir)
    if kind in ("rl", "sft"):
        check_steps(cfg, kind)
    env_task = check_data(cfg)
    if env_task and cfg.env.context.builder == "summary":
        from tether.envs.context import load_summarizer

        load_summarizer(cfg.env.context.summarizer)  # ConfigError: not importable / not a function
    elif not env_task:
        from tether.rewards.compose import build_reward_spec

        build_reward_spec(cfg.reward)  # ConfigError / UnknownNameError: names, modules, kwargs
    needs = "data.chat=true" if cfg.data.chat else (f"data.task={cfg.data.task}" if env_task else None)
    if cfg.model.path:
        check_model_path(cfg, needs)


def check_data(cfg: TetherConfig) -> bool:
    """Read or generate the problems as the recipe will (DataError names file:line for encoding,
    JSON, missing keys, duplicate ids); returns whether the task is a multi-turn environment."""
    from tether.tasks import make_splits
    from tether.tasks.sources import check_source

    d = cfg.data
    if check_source(d):  # a data source's rows (tether.tasks.sources): read as the recipe will
        return False
    make_splits(d.task, d.train_size, d.eval_size, d.seed, d.task_kwargs)  # UnknownNameError lists the tasks
    from tether.rollout import make_rollout

    return make_rollout(cfg).multi_turn  # a fact of the task's rollout (tether.rollout), not a name test


