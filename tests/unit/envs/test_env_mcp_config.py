"""MCP servers declared in the config (data.task=mcp): the tools of a stdio server reach the
episode through the chat template, calls run on the server, and the answer is checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from tether.config import EnvConfig, SamplingConfig, load_config  # noqa: E402
from tether.envs import make_env, parse_tool_calls  # noqa: E402
from tether.envs.base import Action  # noqa: E402
from tether.rollout.episodes import EpisodeRollout  # noqa: E402
from tether.train.setup import setup_problems  # noqa: E402

STUB = str(Path(__file__).with_name("mcp_server_stub.py"))
PROBLEMS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(2, 8) for b in range(3, 9)]


def _config(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    kwargs = {"servers": [{"command": sys.executable, "args": [STUB]}], "problems": str(path)}
    return load_config(None, ["data.task=mcp", f"data.task_kwargs={json.dumps(kwargs)}", "data.train_size=6",
                              "data.eval_size=2"])


def _act(text):
    return Action(text=text, parsed=parse_tool_calls(text))


def test_mcp_servers_from_the_config_play_an_episode(tmp_path):
    train, held = setup_problems(_config(tmp_path).data)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}
    task = train[0]
    env = make_env(task)
    assert [t.name for t in env.tools] == ["add", "explode", "nap"]
    a, b = [int(w.rstrip("?")) for w in task["prompt"].split() if w.rstrip("?").isdigit()]
    r = env.step(_act('<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>' % (a, b)))
    assert not r.done and r.observation.messages[0].content == task["answer"] and r.info["tool_calls"] == 1
    bad = env.step(_act('<tool_call>{"name": "explode", "arguments": {"reason": "no"}}</tool_call>'))
    assert bad.info["tool_errors"] == 1 and bad.observation.messages[0].content.startswith("error:")
    end = env.step(_act(f"Answer: {task['answer']}"))
    assert end.done and end.reward == 1.0 and end.info["correct"]
    assert make_env(task).tools[0] is env.tools[0]  # one server process per declared server, reused


def test_mcp_episode_through_the_runner(tmp_path, env_policy, scripted):
    from env_stubs import encode_action

    train, _ = setup_problems(_config(tmp_path).data)
    task = train[1]
    tok = env_policy.tokenizer
    a, b = [int(w.rstrip("?")) for w in task["prompt"].split() if w.rstrip("?").isdigit()]
    actions = [encode_action(tok, '<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>' % (a, b)),
               encode_action(tok, f"Answer: {task['answer']}")]
    gen = scripted(lambda call, row, prompt: actions[call], env_policy.stop_ids)
    groups, m = EpisodeRollout(EnvConfig(max_turns=4), on_drift="fail").run(
        env_policy, [task], 1, SamplingConfig(max_new_tokens=64), generate=gen)
    traj = groups[0].trajectories[0]
    assert traj.reward.correct and m["env/tool_calls"] == 1 and m["rollout/tokenization_drift_count"] == 0
    assert '"name": "add"' in tok.decode(list(traj.turns[0].context_ids))  # the server's schema was rendered


def test_bad_server_declaration_is_a_clear_error():
    with pytest.raises(ValueError, match="each server needs a 'command'"):
        setup_problems(load_config(None, ["data.task=mcp", 'data.task_kwargs={"servers": [{"args": ["x"]}], '
                                          '"problems": [{"prompt": "q", "answer": 1}]}']).data)


TOOLS_MODULE = '''
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def undocumented(a, b):
    return a
'''


def test_function_tools_from_the_config_by_module_name(tmp_path, monkeypatch):
    """Issue 13: tools named `package.module:function` in the config, next to or instead of MCP servers."""
    (tmp_path / "my_tools_mod.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    kwargs = {"tools": ["my_tools_mod:multiply"],
              "problems": [{"prompt": f"What is {a} times 7?", "answer": a * 7} for a in (6, 8, 9)]}
    train, _ = setup_problems(load_config(None, ["data.task=mcp", f"data.task_kwargs={json.dumps(kwargs)}",
                                                 "data.train_size=1", "data.eval_size=1"]).data)
    env = make_env(train[0])
    assert [t.name for t in env.tools] == ["multiply"]
    assert env.tools[0].schema["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    a = int(train[0]["prompt"].split()[2])
    r = env.step(_act('<tool_call>{"name": "multiply", "arguments": {"a": %d, "b": 7}}</tool_call>' % a))
    assert r.observation.messages[0].content == str(a * 7) and r.info["tool_calls"] == 1
    assert env.step(_act(f"Answer: {a * 7}")).reward == 1.0
    for ref, msg in (("my_tools_mod:nope", "has no attribute 'nope'"), ("no_such_mod_xyz:f", "cannot import module"),
                     ("my_tools_mod:undocumented", "type hints and a docstring")):
        bad = {**kwargs, "tools": [ref]}
        with pytest.raises(ValueError, match=msg):
            setup_problems(load_config(None, ["data.task=mcp", f"data.task_kwargs={json.dumps(bad)}",
                                              "data.train_size=1", "data.eval_size=1"]).data)
