"""Context builders: the rule C(z_0..z_t) that turns an episode's history into the next context.

Agent-R1 (arXiv 2511.14460 v2, "flexible context management") makes the context rule a
switch; its multi-hop QA runs found sliding window > append-only > LLM summary, and
Kimi-Researcher needed context management to run past ten iterations. Builders here pick the
*messages* the model sees; `tether.policy.chat.compute_segments` turns them into ids with every
sampled action spliced in verbatim, so a training sample is always exactly what the model saw:

- `append`: everything. Each context extends the previous one (batching merges the turns of an
  episode into one sequence).
- `sliding_window`: the task messages (the initial observation: system + task) and the last
  `window` turns. Once turns are dropped, a context no longer extends the previous one and
  batching starts a new sequence for that turn.
- `summary`: like `sliding_window`, plus one user message summarising the dropped turns,
  written by a configured function (`package.module:function`, called with the dropped
  messages) or by the policy itself (`summarizer=policy`; the rollout generates it, batched,
  and never trains on it).
"""

from __future__ import annotations

import importlib
from typing import Callable, Sequence

from tether.config_text import ConfigError
from tether.envs.tools import parse_tool_calls
from tether.types import Message

Turns = Sequence[Sequence[Message]]  # per completed turn: the assistant message, then its observation
SUMMARY_PREFIX = "Summary of earlier steps: "
SUMMARY_REQUEST = "Summarize the progress so far in one short paragraph: what was tried and what was learned."


def _append(head: Sequence[Message], turns: Turns, window: int, summary: str | None) -> list[Message]:
    return [*head, *(m for t in turns for m in t)]


def _sliding_window(head: Sequence[Message], turns: Turns, window: int, summary: str | None) -> list[Message]:
    return [*head, *(m for t in turns[max(0, len(turns) - window):] for m in t)]


def _summary(head: Sequence[Message], turns: Turns, window: int, summary: str | None) -> list[Message]:
    if len(turns) <= window:
        return _append(head, turns, window, summary)
    note = [Message("user", SUMMARY_PREFIX + (summary or ""))]
    return [*head, *note, *(m for t in turns[len(turns) - window:] for m in t)]


CONTEXT_BUILDERS: dict[str, Callable[[Sequence[Message], Turns, int, str | None], list[Message]]] = {
    "append": _append,
    "sliding_window": _sliding_window,
    "summary": _summary,
}


def select_context_messages(builder: str, head: Sequence[Message], turns: Turns, window: int,
                            summary: str | None = None) -> list[Message]:
    """The messages of the next context under `builder` (env.context.builder)."""
    if builder not in CONTEXT_BUILDERS:
        raise ConfigError(f"unknown env.context.builder {builder!r}; valid: {', '.join(CONTEXT_BUILDERS)}")
    return CONTEXT_BUILDERS[builder](head, turns, window, summary)


def compute_dropped_messages(builder: str, turns: Turns, window: int) -> list[Message]:
    """The messages a summary must cover: the turns outside the window (none for append)."""
    if builder != "summary" or len(turns) <= window:
        return []
    return [m for t in turns[: len(turns) - window] for m in t]


def summarize_tool_results(messages: Sequence[Message]) -> str:
    """A deterministic summary: each dropped turn's tool calls and results, or its text.

    e.g. `calculator(expression='7*4') -> 28; calculator(expression='12+28') -> 40`.
    """
    parts: list[str] = []
    for m in messages:
        if m.role == "assistant":
            calls = parse_tool_calls(m.content).calls
            if calls:
                parts += [f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls]
            elif m.content.strip():
                parts.append(f"said {m.content.strip()[:80]!r}")
        elif m.role == "tool" and parts:
            parts[-1] += f" -> {m.content.strip()[:80]}"
    return "; ".join(parts) or "nothing yet"


def load_summarizer(name: str) -> Callable[[Sequence[Message]], str] | None:
    """None for `policy` (the rollout generates summaries), else the imported function."""
    if name == "policy":
        return None
    module_name, sep, fn_name = name.partition(":")
    if not sep or not module_name or not fn_name:
        raise ConfigError(f"env.context.summarizer={name!r}: expected 'policy' or 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"env.context.summarizer={name!r}: {type(err).__name__}: {err}") from err
    return fn
