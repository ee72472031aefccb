"""Coding tasks graded by unit tests in the sandbox (SWE-like): tasks, host vs sandbox grading,
edits, hostile programs, infrastructure failures masked (not scored 0), expert and weak teacher."""

from __future__ import annotations

import json
import random

import pytest

from builtin_helpers import expert_actions, run_expert_rollouts

from tether.config import EnvConfig
from tether.envs import Action, make_env, parse_tool_calls, run_expert_episode
from tether.envs.builtin import codefix
from tether.envs.builtin.codefix import FAMILIES, run_tests_cached
from tether.envs import sandbox
from tether.envs.sandbox import SandboxResult
from tether.envs.sandbox_backends import ENV_VAR
from tether.tasks import make_problems, make_splits
from tether.types import Outcome, StopReason

# One at a time across xdist workers, with the hostile sandbox tests: a non-root trainer's NPROC is one budget
pytestmark = pytest.mark.exclusive("sandbox")
BWRAP_WHY = sandbox._probe("bwrap")


@pytest.fixture(autouse=True)
def _sandbox_backend(monkeypatch):
    """These tests grade programs (the isolation is test_sandbox*.py's): without bubblewrap the
    environment would refuse to start, so they opt in to the rlimits backend, as a user could."""
    if BWRAP_WHY is not None:
        monkeypatch.setenv(ENV_VAR, "rlimits")


def _call(name, **args):
    text = "<tool_call>%s</tool_call>" % json.dumps({"name": name, "arguments": args})
    return Action(text=text, parsed=parse_tool_calls(text))


def _env(task):
    env = make_env(task)
    env.reset()
    return env


def test_tasks_are_deterministic_held_out_and_cover_every_family():
    a = make_problems("codefix", 200, 0)
    assert a == make_problems("codefix", 200, 0)
    assert len({p["fix"].split("(")[0] for p in a}) > 5 and len(FAMILIES) == 10
    for p in a:
        assert p["code"] in p["prompt"] and p["bug"] in p["code"] and len(p["cases"]) == 3
        assert p["known"][p["code"]][0] < 3 and p["known"][p["code"].replace(p["bug"], p["fix"])][0] == 3
    train, held = make_splits("codefix", 500, 50, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_host_grading_of_the_generators_programs_agrees_with_the_sandbox():
    for p in make_problems("codefix", 3, 1):
        for code, outcome in p["known"].items():
            assert list(run_tests_cached(code, p["tests"])) == outcome


def test_edits_run_the_tests_in_the_sandbox_and_finish_on_green():
    task = dict(make_problems("codefix", 1, 2)[0], known={})  # every program through the sandbox
    env = _env(task)
    first = env.step(_call("run_tests"))
    report = first.observation.messages[0].content
    assert not first.done and first.info["tool_calls"] == 1
    assert report.endswith(f"failed: {task['cases'][0]}") and report[0] in "012"  # the first test catches the bug
    miss = env.step(_call("edit", old="no such text", new="x"))
    assert not miss.done and miss.info["tool_errors"] == 1 and "not found" in miss.observation.messages[0].content
    bad = env.step(_call("delete", path="solution.py"))
    assert not bad.done and bad.info["tool_errors"] == 1
    fixed = env.step(_call("edit", old=task["bug"], new=f"({task['fix']})"))  # a program no template wrote
    assert fixed.done and fixed.reward == 1.0 and fixed.info["correct"]


def test_hostile_edit_is_contained_and_scored_as_failing_code():
    task = dict(make_problems("codefix", 1, 3)[0], known={})
    env = _env(task)
    res = env.step(_call("edit", old=task["bug"], new="__import__('os').system('echo pwned > /tmp/x') or open('/etc/shadow').read()"))
    assert not res.done and res.reward == 0.0 and res.observation.messages[0].content.startswith("0/3 passed")
    submit = env.step(Action(text="submit"))
    assert submit.done and submit.reward == 0.0 and not submit.info["correct"]


def test_sandbox_infrastructure_failure_is_masked_not_scored_zero(env_policy, scripted, monkeypatch):
    def broken(code, tests, limits=None, files=None, backend=None):
        return 0, 3, SandboxResult("error", None, "", "", 0.0, "bwrap", infra_error="bwrap: cannot create namespace")

    problems = [dict(p, known={}) for p in make_problems("codefix", 2, 9)]  # no host grading: the sandbox must run
    actions = expert_actions(problems)
    monkeypatch.setattr(codefix, "run_python_tests", broken)
    monkeypatch.setattr(codefix, "_CACHE", type(codefix._CACHE)())
    groups, m = run_expert_rollouts(env_policy, scripted, problems, EnvConfig(max_turns=3, max_error_rate=1.0), actions)
    for g in groups:
        t = g.trajectories[0]
        assert t.stop is StopReason.ENV_ERROR and t.reward.outcome is Outcome.ERROR and t.reward.correct is None
        assert "sandbox infrastructure failure" in t.info["error"]
    assert m["env/env_errors"] == 2 and m["env/stop/env_error"] == 1.0


def test_expert_and_weak_teacher():
    problems = make_problems("codefix", 60, 4)
    assert all(run_expert_episode(p)[2].info["correct"] for p in problems)
    rng = random.Random(0)
    for p in problems[:20]:
        history, _, last = run_expert_episode(p, noise=1.0, rng=rng)
        assert last.done and not last.info["correct"] and history[-2].content == "submit"


def test_expert_through_the_batched_rollout(env_policy, scripted):
    problems = make_problems("codefix", 3, 5)
    groups, m = run_expert_rollouts(env_policy, scripted, problems, EnvConfig(max_turns=3))
    assert m["env/success_rate"] == 1.0 and m["env/turns_mean"] == 2 and m["env/tool_calls"] == 6
