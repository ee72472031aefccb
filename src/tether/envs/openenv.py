"""OpenEnv environments over HTTP: tether drives an OpenEnv server's `reset` / `step` (the
protocol of Meta's OpenEnv, `openenv-core`; used by TRL, SkyRL, Unsloth, ART).

    data.task=openenv data.task_kwargs={url: "http://127.0.0.1:8000", action_key: message}

Protocol (JSON over HTTP, as OpenEnv's `HTTPEnvServer`):
    POST /reset {"seed": s, "episode_id": id}            -> {"observation": {...}, "reward": r, "done": d}
    POST /step  {"action": {<action_key>: text}, "episode_id": id}  -> the same shape
The observation is shown to the model as a user message: its `observation_key` field when
given, else the observation object as JSON (without `reward`, `done`, `metadata`). The action is
the model's text (cut at the stop token) in the `action_key` field. Rewards are the server's;
an episode ends when the server says `done` (or at env.max_turns) and counts as correct when its
last reward is positive. tether sends an `episode_id` with every call so that a server keeping
one session per id serves all episodes of a step at once; a single-session server needs
`rollout.problems_per_step * rollout.n == 1` or one server per episode. Only the standard library
is used (no `openenv-core` import): the adapter speaks the wire protocol, so any server that
implements it works, in any language. Transport errors and non-JSON answers raise, which the
episode runner turns into an `env_error` outcome (counted, masked).
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
from tether.policy.chat import Message

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


class OpenEnvEnv:
    """One episode on an OpenEnv server (see module docstring)."""

    tools = ()

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.url = str(task["url"])
        self.episode_id = f"tether-{uuid.uuid4().hex[:12]}"
        self.timeout_s = float(task.get("timeout_s", 30.0))

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
        out = call_openenv(self.url, "/reset", {"seed": self.task.get("seed"), "episode_id": self.episode_id},
                           self.timeout_s)
        system = self.task.get("system")
        return Observation(((Message("system", system),) if system else ()) + (self._message(out["observation"]),))

    def step(self, action: Action) -> StepResult:
        body = {"action": {self.task.get("action_key", "message"): action.text}, "episode_id": self.episode_id}
        out = call_openenv(self.url, "/step", body, self.timeout_s)
        reward = float(out.get("reward") or 0.0)
        done = bool(out.get("done"))
        info: dict[str, Any] = {"correct": reward > 0} if done else {}
        return StepResult(Observation(() if done else (self._message(out["observation"]),)), reward, done, info)


def make_openenv_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """One episode of the server at `kw["url"]`; the seed varies per episode (the prompt names it,
    so that held-out seeds differ from training seeds)."""
    if not kw.get("url"):
        raise InputError("data.task=openenv needs data.task_kwargs.url (the OpenEnv server, e.g. http://127.0.0.1:8000)")
    seed = rng.randrange(2**31)
    keys = ("url", "action_key", "observation_key", "system", "timeout_s")
    return {"id": f"openenv-{i}", "prompt": f"openenv episode, seed {seed}", "answer": "", "seed": seed,
            **{k: kw[k] for k in keys if k in kw}}


@register_env("openenv")
def openenv_env() -> EnvSpec:
    """An OpenEnv server over HTTP; no scripted expert (train from model.path)."""
    return EnvSpec("openenv", make_openenv_task, OpenEnvEnv, None, "an OpenEnv server driven over HTTP (reset/step)")
