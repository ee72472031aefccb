"""A tool-use environment whose tools come from MCP servers (stdio) declared in the config.

    data:
      task: mcp
      task_kwargs:
        servers: [{command: python, args: [my_server.py]}]     # each: command, args, env, cwd
        tools: [my_pkg.tools:lookup]      # and/or Python functions (type hints + Args: docstring)
        problems: problems.jsonl          # or an inline list of {prompt, answer}
        system: "Use the tools, then end with: Answer: <answer>"

Each episode shows the system message, the problem's prompt and every tool of every server
(rendered by the chat template's tools block); an action with tool calls is executed on the
servers (`tether.envs.mcp.MCPToolServer`, per-call timeouts, failures as error observations);
an action without tool calls is the final answer, correct when its stated answer (`Answer: x`,
`\\boxed{x}`, ... — `tether.rewards.extract_answer`) equals the problem's. The servers are
started once per process, on first use, and closed at exit.
"""

from __future__ import annotations

import atexit
import json
import random
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from tether.errors import InputError
from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.envs.tools import Tool, run_tool_turn
from tether.types import Message

SYSTEM = "Use the tools when they help. End with: Answer: <answer>"
_SERVERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _server_key(spec: Mapping[str, Any]) -> str:
    if not isinstance(spec, Mapping) or not spec.get("command"):
        raise InputError(f"data.task_kwargs.servers: each server needs a 'command' (and optional args, env, cwd), "
                         f"got {spec!r}")
    return json.dumps({k: spec.get(k) for k in ("command", "args", "env", "cwd")}, sort_keys=True)


def get_function_tools(refs: Sequence[str]) -> list[Tool]:
    """Tools from `package.module:function` names (the function's type hints and docstring give
    the schema, `tether.envs.tools.make_tool`)."""
    from tether.envs.tools import make_tool
    from tether.registry import import_object

    tools = []
    for ref in refs:
        fn = import_object(str(ref), "data.task_kwargs.tools entry", InputError)
        try:
            tools.append(make_tool(fn))
        except Exception as err:  # transformers' schema builder: missing type hints / docstring
            raise InputError(f"data.task_kwargs.tools entry {ref!r}: cannot describe it as a tool ({err}); give the "
                             "function type hints and a docstring with an Args: section") from err
    return tools


def get_mcp_tools(servers: Sequence[Mapping[str, Any]], functions: Sequence[str] = ()) -> tuple[Tool, ...]:
    """The tools of the declared servers (each started once per process) and Python functions."""
    from tether.envs.mcp import MCPToolServer

    tools: list[Tool] = get_function_tools(functions)
    for spec in servers:
        key = _server_key(spec)
        with _LOCK:
            if key not in _SERVERS:
                _SERVERS[key] = MCPToolServer(str(spec["command"]), [str(a) for a in spec.get("args") or []],
                                              env=spec.get("env"), cwd=spec.get("cwd"),
                                              call_timeout_s=float(spec.get("call_timeout_s", 30.0)))
            tools.extend(_SERVERS[key].tools)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InputError(f"MCP servers expose the same tool name twice: {sorted(names)}")
    return tuple(tools)


@atexit.register
def close_mcp_servers() -> None:
    with _LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


class MCPEnv:
    """One episode: answer the problem, calling the servers' tools as needed (module docstring)."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.tools = get_mcp_tools(task.get("servers") or (), task.get("tools") or ())

    def reset(self) -> Observation:
        return Observation((Message("system", self.task.get("system") or SYSTEM), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        from tether.rewards import extract_answer

        if action.parsed.calls or action.parsed.errors:
            messages, info = run_tool_turn(self.tools, action.parsed)
            return StepResult(Observation(tuple(messages)), 0.0, False, info)
        stated = extract_answer(action.text)
        correct = stated is not None and stated.strip() == str(self.task["answer"]).strip()
        return StepResult(Observation(()), float(correct), True, {"correct": correct})


def _rows(kw: Mapping[str, Any]) -> list[dict[str, Any]]:
    problems = kw.get("problems")
    if isinstance(problems, (str, Path)):
        from tether.tasks import load_jsonl

        return load_jsonl(problems)
    if not problems:
        raise InputError("data.task=mcp needs data.task_kwargs.problems (a JSONL path or a list of {prompt, answer})")
    return [dict(p) for p in problems]


def make_mcp_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    if not kw.get("servers") and not kw.get("tools"):
        raise InputError("data.task=mcp needs data.task_kwargs.servers=[{command: ..., args: [...]}] "
                         "and/or data.task_kwargs.tools=[package.module:function, ...]")
    for spec in kw.get("servers") or ():
        _server_key(spec)
    if i == 0:
        get_function_tools(kw.get("tools") or ())  # a bad reference fails here, before the model is built
    rows = _rows(kw)
    row = rows[rng.randrange(len(rows))]
    return {**row, "id": f"mcp-{i}", "answer": str(row["answer"]), "servers": list(kw.get("servers") or ()),
            "tools": [str(t) for t in kw.get("tools") or ()], "system": kw.get("system")}


@register_env("mcp")
def mcp_env() -> EnvSpec:
    """Problems answered with the tools of MCP servers and Python functions declared in the config."""
    return EnvSpec("mcp", make_mcp_task, MCPEnv, None, "tool use with MCP servers / module:function tools from the config")
