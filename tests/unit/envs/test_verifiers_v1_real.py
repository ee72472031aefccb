"""The real verifiers 0.4 (`verifiers.v1`) against tether, over loopback.

verifiers 0.4 lives in its own virtualenv (`.venv-verifiers`, built by `make test`: it pins openai < 3
and mcp 2.0, older than tether's). tether lists a taskset's tasks and plays each episode with
`tether/envs/vf1_driver.py` run by that virtualenv's interpreter: verifiers' own `SingleAgentEnv`,
its `null` harness (the chat program it ships, synced by uv from the wheels `make` downloaded, run as a local subprocess) and its
interception proxy, calling tether's OpenAI-compatible endpoint (streamed, as that program asks), then
the taskset's `@reward`. The taskset is tests/unit/envs/vf1/tether_vf1_reverse.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("TETHER_VERIFIERS_VENV", ROOT / ".venv-verifiers"))
TASKSETS = Path(__file__).with_name("vf1")
KW = {"env": "tether_vf1_reverse", "python": str(VENV / "bin" / "python"), "pythonpath": str(TASKSETS)}

pytestmark = pytest.mark.slow  # needs the second virtualenv that `make test` builds; each episode starts a process


@pytest.fixture(scope="module", autouse=True)
def _venv():
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} does not exist: build it with `make test` (or `make extra-venvs`)", pytrace=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tether.policy.families import build_family_model, family_shape

    corpus = ["reverse abc: cba", "reverse hello: olleh", "reverse cat: tac"] * 20
    # verifiers' null harness offers its agent tools (bash, edit): a prompt of ~1.3k tokens with this template
    return build_family_model("qwen2", tmp_path_factory.mktemp("m"), corpus,
                              shape=family_shape(hidden_size=32, intermediate_size=64, max_position_embeddings=4096))


def test_tasks_are_listed_from_the_taskset():
    from tether.tasks import make_problems

    tasks = make_problems("verifiers", 4, 0, {**KW, "args": {"num_tasks": 3}})
    assert {t["prompt"] for t in tasks} <= {"reverse abc:", "reverse hello:", "reverse cat:"}
    assert all(t["vf_python"] == KW["python"] for t in tasks)


def test_an_episode_runs_verifiers_own_harness_against_tethers_endpoint(model_dir):
    from tether.config import SamplingConfig
    from tether.policy.hf import load_policy
    from tether.rollout.verifiers import play_verifiers_v1_episode
    from tether.serve.endpoint import RolloutServer
    from tether.tasks import make_problems

    task = make_problems("verifiers", 1, 0, KW)[0]
    with RolloutServer(load_policy(model_dir), SamplingConfig(max_new_tokens=6)) as server:
        result = play_verifiers_v1_episode(task, server.episode_url("e1"), server.api_key, "e1", 120.0)
        turns = server.pop_episode("e1")
    assert result.error == "" and result.reward in (0.0, 1.0), result
    assert len(turns) >= 1 and turns[0].action_ids  # tether sampled the episode's tokens and captured them
    prompt_text = load_policy(model_dir).tokenizer.decode(list(turns[0].context_ids))
    assert task["prompt"] in prompt_text  # the taskset's prompt reached the model through verifiers' harness


@pytest.mark.timeout(1500)  # six episodes, each a process start (~8 CPU s); generous for a busy machine
def test_tether_trains_on_a_verifiers_04_taskset(model_dir, tmp_path):
    from tether.config import load_config
    from tether.recipes.rl import run_rl

    cfg = load_config(None, [
        f"model.path={model_dir}", "data.task=verifiers", f"data.task_kwargs={json.dumps(KW)}", "data.train_size=8",
        "data.eval_size=1", "train.steps=1", "rollout.n=2", "rollout.problems_per_step=1",
        "rollout.sampling.max_new_tokens=6", "eval.sampling.max_new_tokens=6", "eval.samples=1",
        "harness.timeout_s=180", "harness.concurrency=4", "logging.progress=false", "logging.tensorboard=false",
        "run.threads=1", "checkpoint.every=0", "train.lr=1e-3"])
    summary = run_rl(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "pg_loss" in r]
    assert summary["steps"] == 1 and [r["step"] for r in trained] == [1]
    assert all(r["harness/error_rate"] == 0.0 and r["harness/calls_mean"] >= 1.0 for r in trained)


def test_episodes_read_the_chat_programs_packages_from_the_wheelhouse(monkeypatch):
    """verifiers syncs its chat program with uv (UV_OFFLINE=false): the driver points uv at the wheels `make`
    downloaded, so that a test episode sends nothing beyond loopback (checked by hand in a network namespace
    with only loopback: the three tests above pass)."""
    from tether.envs import vf1_driver

    wheels = VENV / "wheels"
    assert any(p.name.startswith("mcp-2.0.0-") for p in wheels.glob("*.whl")), f"{wheels}: run `make extra-venvs`"
    monkeypatch.setattr(vf1_driver.sys, "executable", str(VENV / "bin" / "python"))
    env = {"PATH": "/usr/bin"}
    monkeypatch.setattr(vf1_driver.os, "environ", env)
    vf1_driver.use_local_packages()
    assert env["UV_DEFAULT_INDEX"] == f"file://{wheels}" and env["UV_FIND_LINKS"] == str(wheels)
    assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["PATH"].startswith(str(VENV / "bin"))
