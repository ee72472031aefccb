"""Bad output of a black-box agent program (tether.rollout.agent_io): output that is not UTF-8, a
non-finite or non-numeric reward, garbage that looks like JSON - each makes that episode INVALID,
counted and shown with the agent's stderr tail; the run goes on, and a high invalid rate stops it
with a message (docs/errors.md, "Agent programs")."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

pytest.importorskip("fastapi")

from tether.config import RewardConfig, SamplingConfig  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.policy.hf import load_policy  # noqa: E402
from tether.rollout.agent_io import AgentOutputError, parse_agent_output, run_agent  # noqa: E402
from tether.rollout.harness import HarnessRollout  # noqa: E402
from tether.rollout.runner import EnvFailure  # noqa: E402
from tether.types import Outcome  # noqa: E402

TASK = {"prompt": "1+1=", "answer": "2"}


def agent(tmp_path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


@pytest.mark.parametrize("stdout,phrase", [
    (b'{"reward": NaN}', "must be finite"),
    (b'{"reward": Infinity}', "must be finite"),
    (b'{"reward": "1.0"}', "must be a number"),
    (b'{"reward": true}', "must be a number"),
    (b'{"answer": [1, 2]}', "must be a string or a finite number"),
    (b'{"score": 1}', 'needs "reward" or "answer"'),
    (b'{"reward": 1', "looks like JSON but is not"),
    (b"[1, 2]", "must be a JSON object"),
    (b"log line\n\xff\xfe answer\n", "not UTF-8"),
    (b"\n\n", "printed nothing"),
])
def test_output_that_breaks_the_protocol_is_refused_with_the_reason(bad_input, stdout, phrase):
    with pytest.raises(AgentOutputError, match=re.escape(phrase)) as info:
        parse_agent_output(stdout)
    bad_input.check(str(info.value), "the agent", phrase)


@pytest.mark.parametrize("body,outcome,phrase", [
    ('import sys; sys.stderr.write("loaded the model\\n"); sys.stdout.buffer.write(b"\\xff\\xfeok\\n")',
     Outcome.INVALID, "not UTF-8"),  # aborted the whole run blaming "a file" before
    ('print("thinking"); print(\'{"reward": NaN}\')', Outcome.INVALID, "must be finite"),  # poisoned the step before
    ('import sys; print("oops", file=sys.stderr); print("{bad json")', Outcome.INVALID, "looks like JSON"),
    ('import sys; print("ValueError: boom", file=sys.stderr); sys.exit(3)', Outcome.ERROR, "exited with 3"),
    ('print(\'{"error": "no tool server"}\')', Outcome.ERROR, "reported an error: no tool server"),
])
def test_a_bad_agent_run_is_an_episode_outcome_with_its_stderr_tail(bad_input, tmp_path, body, outcome, phrase):
    cmd = agent(tmp_path, "a", body)
    res = run_agent(cmd, TASK, "http://127.0.0.1:9/v1", "k", "ep", timeout_s=60)
    assert res.outcome is outcome, res
    bad_input.check(res.error, phrase)
    if "stderr" in body:
        assert "stderr: " in res.error and res.error.rsplit("stderr: ", 1)[1].strip()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(build_family_model("qwen2", tmp_path_factory.mktemp("q"), shape=family_shape(hidden_size=32, intermediate_size=64)))


CALLS_THEN = '''
import json, os, sys
from urllib.request import Request, urlopen
task = json.loads(os.environ["TETHER_TASK"])
req = Request(os.environ["OPENAI_BASE_URL"] + "/completions", data=json.dumps({"prompt": task["prompt"],
              "max_tokens": 2}).encode(), headers={"Content-Type": "application/json"})
urlopen(req).read()
print("agent %s says hi" % task["id"], file=sys.stderr)
'''


def test_invalid_episodes_are_masked_counted_and_the_run_goes_on(bad_input, tmp_path, policy, capsys):
    cmd = agent(tmp_path, "mixed", CALLS_THEN + textwrap.dedent('''
        if task["id"] == "bad":
            sys.stdout.buffer.write(b"\\xff\\n")
        elif task["id"] == "nan":
            print('{"reward": NaN}')
        else:
            print('{"reward": 1.0}')
    '''))
    rollout = HarnessRollout(cmd, RewardConfig(isolation="inline"), timeout_s=60, concurrency=2, max_error_rate=0.9)
    problems = [{"id": "ok", "prompt": "1+1=", "answer": "2"}, {"id": "bad", "prompt": "2+2=", "answer": "4"},
                {"id": "nan", "prompt": "3+3=", "answer": "6"}]
    groups, metrics = rollout.run(policy, problems, 2, SamplingConfig(max_new_tokens=2))
    ok, bad, nan = groups
    assert all(t.reward.outcome is Outcome.OK and t.reward.total == 1.0 for t in ok.trajectories)
    for g, phrase in ((bad, "not UTF-8"), (nan, "must be finite")):
        for t in g.trajectories:  # masked out of the update (an invalid outcome), its reward finite
            assert t.reward.outcome is Outcome.INVALID and t.reward.total == 0.0
            bad_input.check(t.reward.error, phrase, "says hi")  # with the stderr tail
    assert metrics["harness/invalid"] == 4 and metrics["harness/error_rate"] == pytest.approx(4 / 6)
    assert "4 of 6 agent runs failed" in capsys.readouterr().out


def test_a_high_invalid_rate_stops_the_run_naming_the_cause(bad_input, tmp_path, policy):
    cmd = agent(tmp_path, "nan", CALLS_THEN + "print('{\"reward\": NaN}')\n")
    rollout = HarnessRollout(cmd, RewardConfig(isolation="inline"), timeout_s=60, concurrency=2, max_error_rate=0.5)
    with pytest.raises(EnvFailure, match=r"harness: 100% of the agent runs failed .*must be finite") as info:
        rollout.run(policy, [{"id": "p", "prompt": "1+1=", "answer": "2"}], 2, SamplingConfig(max_new_tokens=2))
    bad_input.check(str(info.value), "env.max_error_rate", "must be finite")
