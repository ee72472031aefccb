"""The agent harness without friction (tether.rollout.harness, agent_io): `python` is tether's own
interpreter, persistent agent processes serve many episodes, progress lines while a call runs,
and a chat agent against a raw-prompt model is warned about at its first request."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from tether.config import RewardConfig, SamplingConfig  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.policy.hf import load_policy  # noqa: E402
from tether.rollout.agent_io import AgentPool, parse_agent_output, run_agent  # noqa: E402
from tether.rollout.harness import HarnessRollout  # noqa: E402
from tether.types import Outcome  # noqa: E402

AGENTS = Path(__file__).resolve().parents[3] / "configs" / "agents"
SAMPLING = SamplingConfig(max_new_tokens=2)
PROBLEMS = [{"id": f"p{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(build_family_model("qwen2", tmp_path_factory.mktemp("q"), shape=family_shape(hidden_size=32, intermediate_size=64)))


def test_the_output_protocol_reads_what_it_promised():
    """The strict parser (tests/unit/bad_input/test_byo_agent_output.py) still reads every documented form."""
    assert parse_agent_output(b'log\n{"reward": 0.5}\n') == (0.5, None)
    assert parse_agent_output('{"answer": 42}') == (None, "42")
    assert parse_agent_output("a\nAnswer: 7\n\n") == (None, "Answer: 7")
    assert parse_agent_output('{"reward": 1, "answer": "x"}') == (1.0, None)


def test_python_in_the_command_is_the_interpreter_tether_runs_in(tmp_path, monkeypatch):
    """Another `python` first on PATH (a system one, another venv) is not the one that runs the agent."""
    decoy = tmp_path / "bin"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\necho wrong-python\n")
    (decoy / "python").chmod(0o755)
    monkeypatch.setenv("PATH", f"{decoy}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "who.py"
    script.write_text("import json, sys\nprint(json.dumps({'answer': sys.executable}))\n")
    res = run_agent(["python", str(script)], {"prompt": "x"}, "http://127.0.0.1:9/v1", "k", "e", 60)
    assert res.outcome is Outcome.OK and res.answer == sys.executable


PID_AGENT = '''
import json, os, sys
from urllib.request import Request, urlopen

def play(task, base_url):
    req = Request(base_url + "/completions", data=json.dumps({"prompt": task["prompt"], "max_tokens": 2}).encode(),
                  headers={"Content-Type": "application/json"})
    urlopen(req).read()
    if task["id"] == "p1" and not os.path.exists(os.environ["CRASH_MARK"]):
        open(os.environ["CRASH_MARK"], "w").close()
        sys.exit(5)  # dies once, mid-episode: that episode fails, a new process serves the next
    return {"answer": str(os.getpid())}

for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"episode_id": req["episode_id"], **play(req["task"], req["base_url"])}), flush=True)
'''


def test_persistent_agents_serve_many_episodes_and_are_restarted(policy, tmp_path, monkeypatch):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(PID_AGENT))
    monkeypatch.setenv("CRASH_MARK", str(tmp_path / "crashed"))
    rollout = HarnessRollout([sys.executable, str(script)], RewardConfig(isolation="inline"), timeout_s=60,
                             concurrency=2, persistent=True, max_error_rate=0.9)
    try:
        groups, m = rollout.run(policy, PROBLEMS, 4, SAMPLING)
        trajs = [t for g in groups for t in g.trajectories]
        failed = [t for t in trajs if t.reward.outcome is not Outcome.OK]
        assert len(failed) == 1 and "exited with 5" in failed[0].reward.error and "persistent mode" in failed[0].reward.error
        pids = {t.info["text"] for t in trajs if t.reward.outcome is Outcome.OK}
        assert 1 <= len(pids) <= 3 and len(trajs) == 12  # 11 episodes by at most two processes and one replacement
        again, _ = rollout.run(policy, PROBLEMS[:1], 2, SAMPLING)  # the next step reuses the same processes
        assert {t.info["text"] for t in again[0].trajectories} <= pids
    finally:
        AgentPool.close_all()


def test_a_persistent_agent_past_its_timeout_is_replaced(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import sys, time\nfor line in sys.stdin:\n    time.sleep(30)\n")
    pool = AgentPool.get([sys.executable, str(script)], "k")
    try:
        res = pool.play({"prompt": "x"}, "http://127.0.0.1:9/v1", "k", "e1", 1.0)
        assert res.outcome is Outcome.TIMEOUT and "harness.timeout_s=1" in res.error
        assert all(a.proc is None for a in pool.all)  # killed, started again for the next episode
    finally:
        AgentPool.close_all()


def test_progress_lines_while_a_harness_call_runs(policy, capsys):
    rollout = HarnessRollout([sys.executable, str(AGENTS / "complete_agent.py")], RewardConfig(isolation="inline"),
                             timeout_s=60, concurrency=2, progress_s=1e-9)
    rollout.run(policy, PROBLEMS, 2, SAMPLING)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[tether harness]")]
    assert lines and all("/6 episodes" in ln and "/s" in ln for ln in lines)


@pytest.mark.slow
def test_a_chat_agent_against_a_raw_prompt_model_is_warned_and_counted(policy, capsys):
    """The shipped openai-client chat agent against a model recorded as trained on raw prompts."""
    import tether.policy.prompt_format as pf

    pf._warned.clear()
    rollout = HarnessRollout([sys.executable, str(AGENTS / "chat_agent.py")], RewardConfig(isolation="inline"),
                             timeout_s=120, concurrency=2, persistent=True, prompt_format="raw")
    try:
        _, m = rollout.run(policy, PROBLEMS[:2], 2, SAMPLING)
        _, m2 = rollout.run(policy, PROBLEMS[:2], 1, SAMPLING)
    finally:
        AgentPool.close_all()
    out = capsys.readouterr().out
    assert m["rollout/prompt_format_mismatch"] == 1.0 and m["harness/chat_requests_frac"] == 1.0
    assert m["harness/error_rate"] == 0.0
    assert out.count("prompt format mismatch: the agent (POST /v1/chat/completions) uses the chat template") == 1
    assert "Fix: send raw prompts" in out and m2["rollout/prompt_format_mismatch"] == 1.0
