"""The OpenEnv adapter (a server started here on loopback that speaks openenv-core 0.3.0's
protocol: WebSocket sessions at /ws, one environment per connection as HTTPEnvServer keeps them,
and the REST reset/step with a session per episode_id) and the classic verifiers adapter (a
verifiers-style object defined in vf_env_stub.py, its rubric as the reward), each driven
directly and trained end to end."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

fastapi = pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from tether.config import load_config  # noqa: E402
from tether.envs import make_env  # noqa: E402
from tether.envs.base import Action  # noqa: E402
from tether.envs.openenv import OpenEnvError, call_openenv  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.tasks import make_problems  # noqa: E402


def _openenv_app(log: list):
    """An OpenEnv-style server: one session per episode_id; reward 1 when the action contains
    the letter the observation asks for; done after two steps."""
    app = fastapi.FastAPI()
    sessions: dict[str, dict] = {}

    @app.post("/reset")
    async def reset(body: dict):
        letter = "aeiou"[int(body.get("seed") or 0) % 5]
        sessions[body["episode_id"]] = {"letter": letter, "steps": 0}
        log.append(("reset", body["episode_id"]))
        return {"observation": {"prompt": f"Write a word with the letter {letter}.", "metadata": {}}, "reward": None,
                "done": False}

    @app.post("/step")
    async def step(body: dict):
        s = sessions[body["episode_id"]]
        s["steps"] += 1
        log.append(("step", body["episode_id"], body["action"]["message"]))
        reward = 1.0 if s["letter"] in body["action"]["message"] else 0.0
        return {"observation": {"prompt": "Another one."}, "reward": reward, "done": s["steps"] >= 2}

    @app.get("/health")
    async def health():
        return {"status": "healthy"}

    @app.websocket("/ws")
    async def ws(websocket: fastapi.WebSocket):
        """openenv-core's session protocol: the environment lives as long as the connection."""
        await websocket.accept()
        env: dict = {}
        session = f"ws-{len(log)}-{id(env)}"
        try:
            while True:
                msg = json.loads(await websocket.receive_text())
                if msg["type"] == "close":
                    break
                if msg["type"] == "reset":
                    env.update(letter="aeiou"[int(msg["data"].get("seed") or 0) % 5], steps=0)
                    log.append(("ws-reset", session))
                    data = {"observation": {"prompt": f"Write a word with the letter {env['letter']}."}, "reward": None,
                            "done": False}
                elif msg["type"] == "step" and "letter" in env:
                    env["steps"] += 1
                    log.append(("ws-step", session, msg["data"]["message"]))
                    data = {"observation": {"prompt": "Another one."}, "done": env["steps"] >= 2,
                            "reward": 1.0 if env["letter"] in msg["data"]["message"] else 0.0}
                else:
                    await websocket.send_text(json.dumps({"type": "error", "data": {"message": "step before reset",
                                                                                    "code": "SESSION_ERROR"}}))
                    continue
                await websocket.send_text(json.dumps({"type": "observation", "data": data}))
        except fastapi.WebSocketDisconnect:
            pass
        log.append(("ws-closed", session))

    return app


@pytest.fixture(scope="module")
def openenv_server():
    log: list = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_openenv_app(log), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", log
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = ["Write a word with the letter a e i o u. Another one. Name a fruit like apple banana cherry. "
              "Are you sure? Answer with one word."] * 20
    return build_family_model("qwen2", tmp_path_factory.mktemp("m"), corpus, family_shape(hidden_size=32, intermediate_size=64))


def test_openenv_episode_over_a_websocket_session(openenv_server):
    url, log = openenv_server
    task = make_problems("openenv", 1, 0, {"url": url, "observation_key": "prompt"})[0]  # transport: ws (default)
    env = make_env(task)
    first = env.reset()
    letter = first.messages[-1].content.split()[-1].rstrip(".")
    assert first.messages[-1].content.startswith("Write a word with the letter ")
    r1 = env.step(Action(text=f"x{letter}x"))
    assert r1.reward == 1.0 and not r1.done and r1.observation.messages[0].content == "Another one."
    r2 = env.step(Action(text="zzz"))
    assert r2.done and r2.reward == 0.0 and r2.info == {"correct": False}
    mine = [e for e in log if e[0].startswith("ws-")][-4:]
    assert [e[0] for e in mine] == ["ws-reset", "ws-step", "ws-step", "ws-closed"] and len({e[1] for e in mine}) == 1
    with pytest.raises(OpenEnvError, match="step before reset"):  # an error answer names the call
        make_env(task).step(Action(text="a"))


def test_openenv_episode_over_http(openenv_server):
    url, log = openenv_server
    task = make_problems("openenv", 1, 0, {"url": url, "observation_key": "prompt", "transport": "http"})[0]
    env = make_env(task)
    first = env.reset()
    assert first.messages[-1].content.startswith("Write a word with the letter ")
    letter = first.messages[-1].content.split()[-1].rstrip(".")
    r1 = env.step(Action(text=f"x{letter}x"))
    assert r1.reward == 1.0 and not r1.done and r1.observation.messages[0].content == "Another one."
    r2 = env.step(Action(text="zzz"))
    assert r2.done and r2.reward == 0.0 and r2.info == {"correct": False}
    assert [e[0] for e in log[-3:]] == ["reset", "step", "step"] and len({e[1] for e in log[-3:]}) == 1
    plain = make_env(make_problems("openenv", 1, 0, {"url": url, "transport": "http"})[0]).reset()  # JSON, no metadata
    assert json.loads(plain.messages[-1].content) == {"prompt": f"Write a word with the letter {letter}."}


def test_openenv_unreachable_names_the_call():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(OpenEnvError, match=rf"OpenEnv http://127.0.0.1:{port}/reset: URLError"):
        call_openenv(f"http://127.0.0.1:{port}", "/reset", {}, timeout_s=5)
    with pytest.raises(ValueError, match="needs data.task_kwargs.url"):
        make_problems("openenv", 1, 0, {})
    with pytest.raises(ValueError, match="transport='grpc': use ws"):
        make_problems("openenv", 1, 0, {"url": "http://127.0.0.1:1", "transport": "grpc"})
    with pytest.raises(OpenEnvError, match=rf"OpenEnv ws://127.0.0.1:{port}/ws: "):
        make_env(make_problems("openenv", 1, 0, {"url": f"http://127.0.0.1:{port}", "timeout_s": 5})[0]).reset()


def test_verifiers_env_multi_turn_and_rubric():
    task = make_problems("verifiers", 1, 0, {"env": "vf_env_stub"})[0]
    env = make_env(task)
    obs = env.reset()
    assert [m.role for m in obs.messages] == ["system", "user"] and obs.messages[1].content.startswith("Name a fruit")
    mid = env.step(Action(text="pear"))
    assert not mid.done and mid.observation.messages[0].content == "Are you sure?"
    end = env.step(Action(text=task["answer"]))  # the answer's first letter, short: 1.0 + 0.5 * 1.0
    assert end.done and end.reward == pytest.approx(1.5) and end.info["correct"]
    with pytest.raises(ValueError, match="cannot import 'no_such_env'"):
        make_problems("verifiers", 1, 0, {"env": "no_such_env"})


def _train(model_dir, tmp_path, task, kwargs):
    from tether.recipes.rl import run_rl

    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.task={task}", f"data.task_kwargs={json.dumps(kwargs)}",
        "data.train_size=8", "data.eval_size=2", "train.steps=2", "rollout.n=2", "rollout.problems_per_step=2",
        "rollout.sampling.max_new_tokens=6", "eval.sampling.max_new_tokens=6", "eval.samples=1", "env.max_turns=3",
        "logging.progress=false", "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0",
        "train.lr=1e-3"])
    summary = run_rl(cfg, tmp_path / task)
    rows = [json.loads(line) for line in (tmp_path / task / "metrics.jsonl").read_text().splitlines()]
    return summary, [r for r in rows if "pg_loss" in r]


@pytest.mark.slow
def test_openenv_trains_end_to_end(openenv_server, model_dir, tmp_path):
    url, log = openenv_server
    before = len(log)
    summary, trained = _train(model_dir, tmp_path, "openenv", {"url": url, "observation_key": "prompt"})
    assert summary["steps"] == 2 and [r["step"] for r in trained] == [1, 2]
    assert all(r["env/turns_mean"] == 2.0 and r["env/stop/done"] == 1.0 for r in trained)
    events = log[before:]  # a session is logged closed before the server's close frame ends the client's close()
    assert sum(e[0] == "ws-reset" for e in events) >= 8  # 2 steps x 2 problems x 2 rollouts (+ eval), one session each
    assert sum(e[0] == "ws-closed" for e in events) == sum(e[0] == "ws-reset" for e in events)  # every session closed


@pytest.mark.slow
def test_verifiers_env_trains_end_to_end(model_dir, tmp_path):
    summary, trained = _train(model_dir, tmp_path, "verifiers", {"env": "vf_env_stub", "args": {"n": 40}})
    assert summary["steps"] == 2 and [r["step"] for r in trained] == [1, 2]
    assert all(r["env/turns_mean"] == 2.0 and r["env/stop/done"] == 1.0 for r in trained)


def test_tiny_tokenizer_corpus_of_an_environment_without_expert():
    from tether.train.setup import setup_problems
    from tether.rollout import compute_tokenizer_corpus

    cfg = load_config(None, ["data.task=verifiers", 'data.task_kwargs={"env": "vf_env_stub"}', "data.train_size=4",
                             "data.eval_size=2"])
    train, _ = setup_problems(cfg.data)
    assert compute_tokenizer_corpus(cfg.data.task, train) == [p["prompt"] + p["answer"] for p in train]  # no scripted expert to run
