"""Tool calling: plain Python functions as tools, call parsing, and contained execution.

    calc = make_tool(calculator)                # JSON schema from type hints + docstring
    parsed = parse_tool_calls(action_text)      # Hermes <tool_call>{...}</tool_call> or bare JSON
    results = run_tool_calls({calc.name: calc}, parsed.calls, timeout_s=5.0)
    messages = compute_tool_messages(results, parsed.errors)

Schemas come from `transformers.utils.get_json_schema` (the same converter `apply_chat_template
(tools=[fn])` uses), so what the model is shown is what the tokenizer's template renders.
Failures are values: a malformed call is a parse error observation, an unknown tool, bad
arguments, a raising tool or a tool past its deadline is an error observation — each counted,
none fatal (docs/design.md, correctness rule 6). Tools run on daemon threads with a per-tool wall clock
(`tether.envs.calls`); use the sandbox for code that must be killable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tether.envs.calls import run_calls
from tether.types import Message
from tether.types import Outcome

MAX_RESULT_CHARS = 2000  # a tool's output enters the context: keep it bounded
_CALL_PREFIXES = ("[TOOL_CALLS]", "<|python_tag|>")
_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A callable tool: `fn(**arguments)` and its function schema ({"type": "function", ...})."""

    name: str
    fn: Callable[..., Any]
    schema: Mapping[str, Any]
    timeout_s: float | None = None  # None: the caller's default


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedAction:
    """The tool calls found in an action's text, the parse errors, and the text around them."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class ToolResult:
    name: str
    outcome: Outcome
    content: str
    seconds: float = 0.0


def make_tool(fn: Callable[..., Any], name: str | None = None, timeout_s: float | None = None) -> Tool:
    """A Tool from a function with type hints and a Google-style docstring (Args: section)."""
    from transformers.utils import get_json_schema

    schema = get_json_schema(fn)
    if name is not None:
        schema = {**schema, "function": {**schema["function"], "name": name}}
    return Tool(schema["function"]["name"], fn, schema, timeout_s)


def _as_call(obj: Any) -> ToolCall:
    """A ToolCall from {"name", "arguments"} (OpenAI's {"function": {...}} and string-encoded
    arguments accepted); ValueError says what is wrong."""
    if isinstance(obj, Mapping) and isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError('a tool call must be a JSON object with a string "name"')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, Mapping):
        raise ValueError(f'"arguments" of {obj["name"]!r} must be a JSON object, got {type(args).__name__}')
    return ToolCall(obj["name"], dict(args))


def _parse_payload(payload: str) -> tuple[list[ToolCall], list[str]]:
    try:
        obj = json.loads(payload)
        items = obj if isinstance(obj, list) else [obj]
        return [_as_call(o) for o in items], []
    except (ValueError, TypeError) as err:
        return [], [f"malformed tool call {payload.strip()[:80]!r}: {err}"]


def parse_tool_calls(text: str) -> ParsedAction:
    """Hermes-style `<tool_call>{json}</tool_call>` blocks (any number), else a bare JSON
    function call (`{"name": ..., "arguments": {...}}` — Llama 3's `"parameters"` too — or a list
    of them, optionally in a ```json fence or after Mistral's `[TOOL_CALLS]`). Text that is neither is a plain answer (no calls, no errors). An unclosed
    `<tool_call>` or JSON that fails to parse is a parse error, never an exception."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    blocks = list(_HERMES_RE.finditer(text))
    rest = _HERMES_RE.sub("", text)
    for b in blocks:
        c, e = _parse_payload(b.group(1))
        calls += c
        errors += e
    unbalanced = "<tool_call>" in rest or "</tool_call>" in rest
    if unbalanced:  # a cut-off call is malformed, not a bare JSON call
        errors.append("unbalanced <tool_call> tag: every call must be closed with </tool_call>")
        rest = rest.replace("<tool_call>", "").replace("</tool_call>", "")
    if not blocks and not unbalanced:
        bare = rest.strip()
        fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", bare, re.DOTALL)
        bare = fenced.group(1) if fenced else bare
        for prefix in _CALL_PREFIXES:  # Mistral's `[TOOL_CALLS] [...]`, Llama 3's `<|python_tag|>{...}`
            bare = bare.removeprefix(prefix).lstrip()
        if bare.startswith(("{", "[")) and '"name"' in bare:
            c, e = _parse_payload(bare)
            calls += c
            errors += e
            rest = "" if c else rest
    return ParsedAction(tuple(calls), tuple(errors), rest.strip())


def _invoke(tool: Tool, call: ToolCall) -> Callable[[], Any]:
    return lambda: tool.fn(**call.arguments)


def run_tool_calls(tools: Mapping[str, Tool], calls: Sequence[ToolCall], timeout_s: float | None) -> list[ToolResult]:
    """Execute `calls` (concurrently, each with its tool's timeout or `timeout_s`); one result
    per call, in order. Unknown names and argument errors are ERROR results."""
    results: list[ToolResult | None] = [None] * len(calls)
    runnable: dict[float | None, list[int]] = {}
    for i, c in enumerate(calls):
        if c.name not in tools:
            known = ", ".join(sorted(tools)) or "none"
            results[i] = ToolResult(c.name, Outcome.ERROR, f"unknown tool {c.name!r}; available: {known}")
        else:
            runnable.setdefault(tools[c.name].timeout_s or timeout_s, []).append(i)
    for limit, idx in runnable.items():
        outs = run_calls([_invoke(tools[calls[i].name], calls[i]) for i in idx], limit)
        for i, o in zip(idx, outs):
            content = _format_value(o.value) if o.outcome is Outcome.OK else o.error
            results[i] = ToolResult(calls[i].name, o.outcome, content[:MAX_RESULT_CHARS], o.seconds)
    return [r for r in results if r is not None]


def _format_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def compute_tool_messages(results: Sequence[ToolResult], parse_errors: Sequence[str] = ()) -> list[Message]:
    """One `tool` message per result (errors prefixed `error:`) and per parse error."""
    out = [Message("tool", r.content if r.outcome is Outcome.OK else f"error: {r.outcome.value}: {r.content}")
           for r in results]
    out += [Message("tool", f"error: {e}") for e in parse_errors]
    return out


def run_tool_turn(tools: Sequence[Tool], parsed: ParsedAction, timeout_s: float | None = None,
                  ) -> tuple[list[Message], dict[str, int]]:
    """An action's tool calls executed: the `tool` observation messages and the counters for
    StepResult.info (`compute_tool_info`)."""
    results = run_tool_calls({t.name: t for t in tools}, parsed.calls, timeout_s=timeout_s)
    return compute_tool_messages(results, parsed.errors), compute_tool_info(results, parsed.errors)


def compute_tool_info(results: Sequence[ToolResult], parse_errors: Sequence[str] = ()) -> dict[str, int]:
    """Counts for StepResult.info: tool_calls, tool_errors, tool_timeouts, parse_errors."""
    return {
        "tool_calls": len(results),
        "tool_errors": sum(r.outcome is Outcome.ERROR for r in results),
        "tool_timeouts": sum(r.outcome is Outcome.TIMEOUT for r in results),
        "parse_errors": len(parse_errors),
    }
