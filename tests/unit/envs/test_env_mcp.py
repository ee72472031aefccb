"""Tools from an MCP server over stdio: listing, schemas through the chat template, calls,
failures and timeouts contained, and a rollout whose environment uses the MCP tools."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from env_stubs import encode_action

from tether.config import EnvConfig, SamplingConfig
from tether.envs import ENVS, Action, EnvSpec, Observation, StepResult, parse_tool_calls, register_env, run_tool_calls
from tether.envs.mcp import MCPToolServer
from tether.rollout.episodes import EpisodeRollout
from tether.envs.tools import compute_tool_info, compute_tool_messages
from tether.policy.chat import Message, render_chat
from tether.types import Outcome

STUB = str(Path(__file__).with_name("mcp_server_stub.py"))
_SERVER: list[MCPToolServer] = []


@pytest.fixture(scope="module")
def server():
    with MCPToolServer(sys.executable, [STUB], call_timeout_s=10.0) as s:
        _SERVER.append(s)
        yield s
        _SERVER.clear()


def test_tools_listed_with_schemas_and_rendered(server, env_tokenizer):
    assert [t.name for t in server.tools] == ["add", "explode", "nap"]
    add = server.tools[0].schema["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"]["type"] == "integer" and add["parameters"]["required"] == ["a", "b"]
    text = render_chat(env_tokenizer, [{"role": "user", "content": "q"}], [t.schema for t in server.tools])
    assert '"name": "add"' in text and '"name": "nap"' in text


def test_round_trip_failure_and_timeout(server):
    tools = {t.name: t for t in server.tools}
    parsed = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
                              '<tool_call>{"name": "explode", "arguments": {"reason": "no"}}</tool_call>')
    res = run_tool_calls(tools, parsed.calls, timeout_s=10.0)
    assert [(r.outcome, r.content) for r in res][0] == (Outcome.OK, "42")
    assert res[1].outcome is Outcome.ERROR and "MCPToolError" in res[1].content
    slow = run_tool_calls(tools, parse_tool_calls('{"name": "nap", "arguments": {"seconds": 3}}').calls, timeout_s=0.3)
    assert slow[0].outcome is Outcome.TIMEOUT
    assert run_tool_calls(tools, parsed.calls[:1], timeout_s=10.0)[0].content == "42"  # the session still works


class MCPEnv:
    """Answers tool calls with the MCP server's tools; a reply without calls ends the episode."""

    def __init__(self, task):
        self.tools = _SERVER[0].tools

    def reset(self):
        return Observation((Message("user", "add 2 and 40"),))

    def step(self, action: Action) -> StepResult:
        p = action.parsed
        if p.calls or p.errors:
            res = run_tool_calls({t.name: t for t in self.tools}, p.calls, timeout_s=10.0)
            return StepResult(Observation(tuple(compute_tool_messages(res, p.errors))), 0.0, False, compute_tool_info(res))
        ok = "42" in action.text
        return StepResult(Observation(()), float(ok), True, {"correct": ok})


if "_test_mcp" not in ENVS:
    register_env("_test_mcp")(lambda: EnvSpec("_test_mcp", lambda rng, i, kw: {"id": "m", "prompt": "p"}, MCPEnv))


def test_rollout_with_mcp_tools(server, env_policy, scripted):
    tok = env_policy.tokenizer
    acts = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>', "42"]
    gen = scripted(lambda c, r, p: encode_action(tok, acts[c]), env_policy.stop_ids)
    groups, m = EpisodeRollout(EnvConfig(max_turns=3)).run(
        env_policy, [{"env": "_test_mcp", "id": "m"}], 1, SamplingConfig(max_new_tokens=64), generate=gen)
    traj = groups[0].trajectories[0]
    assert traj.stop.value == "done" and traj.reward.total == 1.0 and m["env/tool_calls"] == 1
    assert "<|im_start|>tool\n42<|im_end|>" in tok.decode(list(traj.turns[1].context_ids))
