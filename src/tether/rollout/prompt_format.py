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

log = logging.getLogger("tether.prompt_format")

CHAT, RAW = "chat", "raw"


def compute_prompt_format(chat: bool, problems: Iterable[Mapping[str, Any]] = (), multi_turn: bool = False) -> str:
    """The format prompts are rendered in: "chat" (the chat template) or "raw" (plain text)."""
    if chat or multi_turn or any(p.get("messages") for p in problems):
        return CHAT
    return RAW


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
            return None if data.get("task") in ("hf", "jsonl", "verifiers", "openenv", "mcp") else RAW
    return None


def describe(fmt: str) -> str:
    return "the chat template (data.chat=true or chat-message prompts)" if fmt == CHAT else "raw text prompts (data.chat=false)"


def mismatch_message(trained: str, used: str, where: str) -> str:
    """One line: what differs and the fix."""
    if used == CHAT:
        fix = ("send raw prompts (the agent: client.completions.create(prompt=task['prompt']); a run: data.chat=false), "
               "or train the model with data.chat=true")
    else:
        fix = ("send chat messages (the agent: client.chat.completions.create(messages=[{'role': 'user', 'content': "
               "task['prompt']}]); a run: data.chat=true), or train the model with data.chat=false")
    return (f"prompt format mismatch: {where} uses {describe(used)}, but the model was trained on {describe(trained)}; "
            f"its reward will stay near zero. Fix: {fix}")


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Print a mismatch warning once per process (every step's endpoint would repeat it)."""
    if message not in _warned:
        _warned.add(message)
        print(f"[tether] WARNING: {message}", flush=True)


def check_prompt_format(trained: str | None, used: str, where: str) -> str | None:
    """The mismatch message (also printed as a warning) when `used` differs from `trained`; None
    when they agree or the trained format is unknown."""
    if trained is None or trained == used:
        return None
    msg = mismatch_message(trained, used, where)
    warn_once(msg)
    return msg


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
