"""OpenEnv environments: tether drives an OpenEnv server's `reset` / `step` (the protocol of
Meta's OpenEnv, `openenv-core`; used by TRL, SkyRL, Unsloth, ART).

    data.task=openenv data.task_kwargs={url: "http://127.0.0.1:8000", action_key: message}

Two transports (`data.task_kwargs.transport`), as openenv-core 0.3.0's `HTTPEnvServer` serves them:
- `ws` (default): one WebSocket session per episode at `<url>/ws` — the server keeps one
  environment instance per connection, so episodes are stateful and run concurrently:
      -> {"type": "reset", "data": {"seed": s, "episode_id": id}}   <- {"type": "observation", "data": {...}}
      -> {"type": "step", "data": {<action_key>: text}}              <- the same shape
  (an `{"type": "error", ...}` answer raises), then `{"type": "close"}`. Needs `websockets`
  (`tether[openenv]`).
- `http`: `POST /reset {"seed", "episode_id"}` and `POST /step {"action": {<action_key>: text},
  "episode_id"}`, standard library only. openenv-core's own REST endpoints build a fresh
  environment for every call (stateless), so this is for servers that keep a session per
  `episode_id` (or single-step environments).
Every answer's data is `{"observation": {...}, "reward": r, "done": d}`. The observation is shown
to the model as a user message: its `observation_key` field when given, else the observation
object as JSON (without `reward`, `done`, `metadata`). The action is the model's text (cut at
the stop token) in the `action_key` field. Rewards are the server's; an episode ends when the
server says `done` (or at env.max_turns) and counts as correct when its last reward is positive.
Transport errors and answers outside the protocol raise, which the episode runner turns into an
`env_error` outcome (counted, masked).
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
import uuid
from typing import Any, Mapping

from tether.errors import InputError
from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.types import Message

_HIDDEN = ("reward", "done", "metadata")


class OpenEnvError(RuntimeError):
    """The OpenEnv server could not be reached or answered something that is not the protocol."""


def call_openenv(url: str, path: str, body: Mapping[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """POST `body` as JSON to `url + path`; the decoded JSON object, or OpenEnvError naming the call."""
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out = json.loads(resp.read().decode() or "null")
    except urllib.error.HTTPError as err:
        raise OpenEnvError(f"OpenEnv {url}{path}: HTTP {err.code}: {err.read().decode(errors='replace')[:200]}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise OpenEnvError(f"OpenEnv {url}{path}: {type(err).__name__}: {err}") from None
    if not isinstance(out, dict) or "observation" not in out:
        raise OpenEnvError(f"OpenEnv {url}{path}: expected {{observation, reward, done}}, got {str(out)[:200]}")
    return out


class OpenEnvSession:
    """One WebSocket session at `<url>/ws` (one environment instance on the server)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        try:
            from websockets.sync.client import connect
        except ImportError:  # pragma: no cover - reported when an episode starts
            raise OpenEnvError("data.task_kwargs.transport=ws needs the websockets package: pip install "
                               "'tether[openenv]' (or transport: http)") from None
        self.ws_url = ("ws" + url.rstrip("/").removeprefix("http")) + "/ws"
        self.timeout_s = timeout_s
        try:
            self.conn = connect(self.ws_url, open_timeout=timeout_s, close_timeout=5)
        except (OSError, TimeoutError, ValueError) as err:
            raise OpenEnvError(f"OpenEnv {self.ws_url}: {type(err).__name__}: {err}") from None

    def call(self, kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
        try:
            self.conn.send(json.dumps({"type": kind, "data": dict(data)}))
            out = json.loads(self.conn.recv(timeout=self.timeout_s))
        except (OSError, TimeoutError, ValueError, RuntimeError) as err:
            raise OpenEnvError(f"OpenEnv {self.ws_url} {kind}: {type(err).__name__}: {err}") from None
        if isinstance(out, dict) and out.get("type") == "error":
            raise OpenEnvError(f"OpenEnv {self.ws_url} {kind}: {json.dumps(out.get('data'))[:300]}")
        data = out.get("data") if isinstance(out, dict) else None
        if not isinstance(data, dict) or "observation" not in data:
            raise OpenEnvError(f"OpenEnv {self.ws_url} {kind}: expected an observation, got {str(out)[:200]}")
        return data

    def close(self) -> None:
        try:
            self.conn.send(json.dumps({"type": "close"}))
        except Exception:  # the session is over either way
            pass
        self.conn.close()


class OpenEnvEnv:
    """One episode on an OpenEnv server (see module docstring)."""

    tools = ()

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.url = str(task["url"])
        self.episode_id = f"tether-{uuid.uuid4().hex[:12]}"
        self.timeout_s = float(task.get("timeout_s", 30.0))
        self.session: OpenEnvSession | None = None

    def _call(self, kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
        if self.task.get("transport", "ws") == "http":
            body = {"seed": data.get("seed"), "episode_id": self.episode_id} if kind == "reset" else \
                {"action": dict(data), "episode_id": self.episode_id}
            return call_openenv(self.url, f"/{kind}", body, self.timeout_s)
        if self.session is None:
            self.session = OpenEnvSession(self.url, self.timeout_s)
        return self.session.call(kind, data)

    def close(self) -> None:
        if self.session is not None:
            self.session, session = None, self.session
            session.close()

    def _message(self, observation: Any) -> Message:
        key = self.task.get("observation_key")
        if key and isinstance(observation, Mapping):
            if key not in observation:
                raise OpenEnvError(f"OpenEnv observation has no key {key!r} (keys: {sorted(observation)}); "
                                   "set data.task_kwargs.observation_key")
            return Message("user", str(observation[key]))
        if isinstance(observation, Mapping):
            observation = {k: v for k, v in observation.items() if k not in _HIDDEN}
        return Message("user", observation if isinstance(observation, str) else json.dumps(observation))

    def reset(self) -> Observation:
        out = self._call("reset", {"seed": self.task.get("seed"), "episode_id": self.episode_id})
        system = self.task.get("system")
        return Observation(((Message("system", system),) if system else ()) + (self._message(out["observation"]),))

    def step(self, action: Action) -> StepResult:
        out = self._call("step", {self.task.get("action_key", "message"): action.text})
        reward = float(out.get("reward") or 0.0)
        done = bool(out.get("done"))
        if done:
            self.close()
        info: dict[str, Any] = {"correct": reward > 0} if done else {}
        return StepResult(Observation(() if done else (self._message(out["observation"]),)), reward, done, info)


def make_openenv_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """One episode of the server at `kw["url"]`; the seed varies per episode (the prompt names it,
    so that held-out seeds differ from training seeds)."""
    if not kw.get("url"):
        raise InputError("data.task=openenv needs data.task_kwargs.url (the OpenEnv server, e.g. http://127.0.0.1:8000)")
    seed = rng.randrange(2**31)
    if kw.get("transport", "ws") not in ("ws", "http"):
        raise InputError(f"data.task_kwargs.transport={kw['transport']!r}: use ws (WebSocket sessions) or http")
    keys = ("url", "action_key", "observation_key", "system", "timeout_s", "transport")
    return {"id": f"openenv-{i}", "prompt": f"openenv episode, seed {seed}", "answer": "", "seed": seed,
            **{k: kw[k] for k in keys if k in kw}}


@register_env("openenv")
def openenv_env() -> EnvSpec:
    """An OpenEnv server (WebSocket sessions or HTTP); no scripted expert (train from model.path)."""
    return EnvSpec("openenv", make_openenv_task, OpenEnvEnv, None,
                   "an OpenEnv server driven over WebSocket sessions or HTTP (reset/step)")
