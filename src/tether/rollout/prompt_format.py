"""Prompt format consistency: does the model see prompts in the format it was trained on?

A model trained on raw text prompts (`data.chat=false`) scores about zero when it is asked
through its chat template (an agent calling `chat.completions`), and a model trained through the
chat template does as badly on raw text: nothing fails, the reward is just flat. So every run
records the format it trained on (`prompt_format` in summary.json: "chat" or "raw"), and the
places where a model meets prompts compare:

- the rollout endpoint (`tether.serve.endpoint`): a chat request against a raw-prompt model, or a
  raw completion request against a chat-trained one, is counted and warned about at its first
  occurrence (the agent harness reports it per step as `rollout/prompt_format_mismatch`);
- `tether train` / `tether eval` / the environment adapters: the format this run renders prompts
  in against the format the starting model was trained on (its run record), warned at start;
- `tether doctor`: a finding with the fix (`tether.health.first_steps`).

The format of a run: "chat" when `data.chat` is set or the problems are chat messages (verl's
layout), or when the rollout is multi-turn (environments and adapters always use the template);
"raw" otherwise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from tether.policy.prompt_format import CHAT, RAW, check_prompt_format, describe, mismatch_message, warn_once

log = logging.getLogger("tether.prompt_format")


def compute_prompt_format(chat: bool, problems: Iterable[Mapping[str, Any]] = (), multi_turn: bool = False) -> str:
    """The format prompts are rendered in: "chat" (the chat template) or "raw" (plain text)."""
    if chat or multi_turn or any(p.get("messages") for p in problems):
        return CHAT
    return RAW


def _may_carry_messages(task: str) -> bool:
    """A data source's rows may be chat messages (verl's layout), and an environment renders its own."""
    from tether.rollout import is_episode_task
    from tether.tasks.sources import is_file_task

    return is_file_task(task) or is_episode_task(task)


def read_trained_prompt_format(model_dir: str | Path | None) -> str | None:
    """The format the run that wrote `model_dir` trained on, from its run record (summary.json's
    `prompt_format`, else its config's `data.chat` when that says chat); None when `model_dir` is
    not inside a tether run (a model from elsewhere) or the record does not say."""
    if not model_dir:
        return None
    p = Path(model_dir)
    for run in [p, *list(p.parents)[:3]]:
        summary, config = run / "summary.json", run / "config.yaml"
        if summary.is_file():
            try:
                fmt = json.loads(summary.read_text()).get("prompt_format")
            except (OSError, ValueError, AttributeError):
                fmt = None
            if fmt in (CHAT, RAW):
                return fmt
        if config.is_file():
            try:
                data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
            except (OSError, yaml.YAMLError, AttributeError):
                return None
            if data.get("chat"):
                return CHAT
            # raw only when the task cannot carry chat messages (a file task may hold verl-style messages)
            return None if _may_carry_messages(str(data.get("task"))) else RAW
    return None


def run_format_check(cfg: Any, rollout: Any, problems: Iterable[Mapping[str, Any]], where: str,
                     model_dir: str | Path | None = None) -> dict[str, Any]:
    """At the start of a run or an evaluation: the format `rollout` renders prompts in against the
    format the run that wrote `model_dir` (default `model.path`) trained on, warned when they differ.
    Returns the run record's fields: `prompt_format`, `model_prompt_format`, and on a mismatch
    `prompt_format_warning`. An agent harness chooses its format per request: the endpoint checks it."""
    trained = read_trained_prompt_format(model_dir or cfg.model.path)
    if getattr(rollout, "checks_prompt_format", False):
        return {"model_prompt_format": trained}
    used = compute_prompt_format(cfg.data.chat, problems, rollout.multi_turn)
    record: dict[str, Any] = {"prompt_format": used, "model_prompt_format": trained}
    if (msg := check_prompt_format(trained, used, where)) is not None:
        record["prompt_format_warning"] = msg
    return record


def compute_harness_format(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The format an agent harness run trained on: the one most of the agent's requests used."""
    fracs = [r["harness/chat_requests_frac"] for r in rows if "harness/chat_requests_frac" in r]
    if not fracs:
        return None
    return CHAT if sum(fracs) / len(fracs) > 0.5 else RAW


__all__ = ["CHAT", "RAW", "check_prompt_format", "compute_harness_format", "compute_prompt_format", "describe",
           "mismatch_message", "read_trained_prompt_format", "run_format_check", "warn_once"]
