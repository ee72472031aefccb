"""The real OpenEnv package (openenv 0.10.0) against tether's OpenEnv adapter, over loopback.

The server is OpenEnv's own example environment: `openenv init echo_env` (the package's CLI
renders its bundled template: an environment that echoes the `message` action, reward
min(0.1 * len(message), 1.0), never done), started with uvicorn from its own virtualenv
(`.venv-openenv`, built by `make test`: openenv's server cannot share tether's environment, see
the Makefile). The only edit to the generated app is the one its comment invites: more than one
concurrent WebSocket session (tether plays several episodes at once).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tether.envs.base import Action, make_env
from tether.tasks import make_problems

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("TETHER_OPENENV_VENV", ROOT / ".venv-openenv"))

pytestmark = pytest.mark.slow  # needs the second virtualenv that `make test` builds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    if not (VENV / "bin" / "openenv").exists():
        pytest.fail(f"{VENV} has no openenv: build it with `make test` (or `make {VENV.name}`)", pytrace=False)
    work = tmp_path_factory.mktemp("openenv")
    subprocess.run([str(VENV / "bin" / "openenv"), "init", "echo_env"], cwd=work, check=True, capture_output=True,
                   timeout=120)
    app = work / "echo_env" / "server" / "app.py"
    text = app.read_text()
    assert "max_concurrent_envs=1" in text  # the template's own setting, which its comment says to raise
    app.write_text(text.replace("max_concurrent_envs=1", "max_concurrent_envs=16"))
    port = _free_port()
    proc = subprocess.Popen([str(VENV / "bin" / "python"), "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=work / "echo_env",
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"the echo_env server exited: {proc.stdout.read().decode()[-2000:]}", pytrace=False)
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the echo_env server did not answer /health within 120 s", pytrace=False)
    yield url
    proc.terminate()
    proc.wait(30)


def test_an_episode_on_openenvs_echo_environment(echo_server):
    task = make_problems("openenv", 1, 0, {"url": echo_server, "observation_key": "echoed_message"})[0]
    env = make_env(task)
    first = env.reset()
    assert first.messages[-1].content == "Echo Env environment ready!"  # the template's reset observation
    step = env.step(Action(text="hello"))
    assert step.reward == pytest.approx(0.5) and not step.done  # min(0.1 * len, 1.0), never done
    assert step.observation.messages[-1].content == "hello"
    long = env.step(Action(text="a longer message"))
    assert long.reward == pytest.approx(1.0)
    env.close()


def test_tether_trains_on_openenvs_echo_environment(echo_server, tmp_path):
    from tether.config import load_config
    from tether.policy.families import build_family_model, family_shape
    from tether.recipes.rl import run_rl

    model = build_family_model("qwen2", tmp_path / "m", ["echo this message back please"] * 20,
                               shape=family_shape(hidden_size=32, intermediate_size=64))
    kwargs = {"url": echo_server, "observation_key": "echoed_message", "action_key": "message"}
    cfg = load_config(None, [
        f"model.path={model}", "data.task=openenv", f"data.task_kwargs={json.dumps(kwargs)}", "data.train_size=8",
        "data.eval_size=2", "train.steps=2", "rollout.n=2", "rollout.problems_per_step=2",
        "rollout.sampling.max_new_tokens=6", "eval.sampling.max_new_tokens=6", "eval.samples=1", "env.max_turns=2",
        "logging.progress=false", "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "train.lr=1e-3"])
    summary = run_rl(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "pg_loss" in r]
    assert summary["steps"] == 2 and [r["step"] for r in trained] == [1, 2]
    assert all(r["env/turns_mean"] == 2.0 and r["env/stop/max_turns"] == 1.0 for r in trained)  # the echo never ends
    assert all(r["env/stop/env_error"] == 0.0 for r in trained)
    assert all(r["env/return_mean"] > 0 and r["reward/mean"] > 0 for r in trained)  # the server's rewards, trained on
