"""`verifiers` environments trained by tether (the environment format of prime-rl, SkyRL,
tinker-cookbook and slime), with the environment's rubric as the reward.

    data.task=verifiers data.task_kwargs={env: my_env_module, args: {difficulty: 2}}

`env` names a module that exports `load_environment(**args)` — verifiers' own convention
(`vf.load_environment("my-env")` imports the module `my_env`) — or `package.module:function`.
The environment's `dataset` rows (or `eval_dataset`, `split: eval_dataset`) are the problems.
Two ways to play an episode, chosen by what the object is:

- **a verifiers `Environment`** (verifiers 0.2-0.3, `vf.SingleTurnEnv`, `vf.MultiTurnEnv`,
  `vf.ToolEnv`, ...; anything with `run_rollout`): the environment runs its OWN rollout loop
  (its stop conditions, `env_response`, tools, parser) against tether's OpenAI-compatible
  endpoint (`tether.serve.endpoint`), through verifiers' `OpenAIChatCompletionsClient`, one episode id per
  rollout, and its rubric scores the episode (`state["reward"]`). tether trains on the tokens
  its endpoint sampled (exact capture: the agent harness, `tether.rollout.harness`, with the
  environment as an in-process agent; `harness.concurrency` episodes at once). That rollout
  half lives in `tether.rollout.verifiers`. Tested against verifiers 0.3.1.
- **a verifiers 0.4 taskset** (`verifiers.v1`: tasksets and harnesses, no `Environment` /
  `Rubric`; `data.task_kwargs.python` names the interpreter of the virtualenv that has verifiers
  0.4, `pythonpath` where the taskset's module is): verifiers 0.4 pins openai < 3 and mcp 2.0, so it
  never runs in tether's process. `vf1_driver.py`, run by that interpreter, lists the taskset's
  tasks here and plays each episode with verifiers' own environment, harness and interception
  proxy against tether's endpoint (`tether.rollout.verifiers.play_verifiers_v1_episode`).
- **any other object with the classic interface** (duck-typed; no verifiers import): tether
  samples the turns itself (token in / token out, `tether.rollout.runner`): `dataset` rows with
  `prompt` (chat messages) or `question` (`system_prompt` is prepended), `answer`, `info`, `task`;
  `max_turns` (<= 0: until the environment stops or env.max_turns) and `env_response(messages,
  state)` returning the next messages (or `(messages, state)`), an optional
  `is_completed(messages, state)`; `rubric.funcs` / `rubric.weights` (or `reward_funcs` /
  `reward_weights`), each taking any of `prompt`, `completion`, `answer`, `state`, `info`, `task`,
  `parser` by name (or `**kwargs`), sync or async: the reward is the weighted sum when the episode
  ends, correct when positive. Tool environments are not mapped in this mode.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any, Mapping

from tether.errors import InputError
from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.types import Message

_REWARD_ARGS = ("prompt", "completion", "answer", "state", "info", "task", "parser")


def _resolve(value: Any) -> Any:
    return asyncio.run(value) if inspect.isawaitable(value) else value


@functools.lru_cache(maxsize=8)
def _load(ref: str, args_json: str) -> Any:
    module_name, _, fn_name = ref.partition(":")
    try:
        module = importlib.import_module(module_name.replace("-", "_"))
    except ImportError as err:
        raise InputError(f"data.task_kwargs.env={ref!r}: cannot import {module_name!r} ({err})") from None
    fn = getattr(module, fn_name or "load_environment", None)
    if not callable(fn):
        raise InputError(f"data.task_kwargs.env={ref!r}: {module_name} has no function {fn_name or 'load_environment'!r}")
    return fn(**json.loads(args_json))


def load_verifiers_env(ref: str | None, args: Mapping[str, Any] | None = None) -> Any:
    """The environment `ref` names, loaded once per process per (ref, args)."""
    if not ref:
        raise InputError("data.task=verifiers needs data.task_kwargs.env (a module with load_environment, "
                         "or package.module:function)")
    return _load(str(ref), json.dumps(dict(args or {}), sort_keys=True))


def _prompt_messages(env: Any, row: Mapping[str, Any]) -> list[dict[str, str]]:
    if isinstance(row.get("prompt"), list):
        return [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
    system = getattr(env, "system_prompt", None)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": str(row["question"])}]


def _rubric(env: Any) -> list[tuple[Any, float]]:
    rubric = getattr(env, "rubric", None)
    funcs = list(getattr(rubric, "funcs", None) or getattr(rubric, "reward_funcs", None) or [])
    weights = list(getattr(rubric, "weights", None) or getattr(rubric, "reward_weights", None) or [1.0] * len(funcs))
    if not funcs:
        raise InputError(f"{type(env).__name__}: the environment's rubric has no reward functions")
    return list(zip(funcs, weights))


class VerifiersEnv:
    """One episode of a verifiers environment's dataset row (see module docstring)."""

    tools = ()

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.env = load_verifiers_env(task["vf_env"], task.get("vf_args"))
        rows = getattr(self.env, task.get("split", "dataset"))
        row = dict(rows[int(task["row"])])
        self.prompt = _prompt_messages(self.env, row)
        self.completion: list[dict[str, str]] = []
        self.state: dict[str, Any] = {"answer": row.get("answer", ""), "info": row.get("info") or {},
                                      "task": row.get("task", "default"), "turn": 0, "prompt": self.prompt}
        self.max_turns = int(getattr(self.env, "max_turns", 1) or 0)  # <= 0: no limit of its own (env.max_turns)

    def reset(self) -> Observation:
        return Observation(tuple(Message(m["role"], m["content"]) for m in self.prompt))

    def step(self, action: Action) -> StepResult:
        self.completion.append({"role": "assistant", "content": action.text})
        self.state["turn"] += 1
        messages = self.prompt + self.completion
        done = 0 < self.max_turns <= self.state["turn"] or not hasattr(self.env, "env_response")
        if not done and hasattr(self.env, "is_completed"):
            done = bool(_resolve(self.env.is_completed(messages, self.state)))
        new: list[dict[str, str]] = []
        if not done:
            out = _resolve(self.env.env_response(messages, self.state))
            if isinstance(out, tuple):
                out, self.state = out[0], out[1]
            new = [{"role": m["role"], "content": m["content"]} for m in out or []]
            done = not new
        if not done:
            self.completion.extend(new)
            return StepResult(Observation(tuple(Message(m["role"], m["content"]) for m in new)))
        reward = self.score()
        return StepResult(Observation(()), reward, True, {"correct": reward > 0})

    def score(self) -> float:
        """The rubric's weighted sum for this episode."""
        values = {"prompt": self.prompt, "completion": self.completion, "answer": self.state["answer"],
                  "state": self.state, "info": self.state["info"], "task": self.state["task"],
                  "parser": getattr(self.env, "parser", None)}
        total = 0.0
        for fn, weight in _rubric(self.env):
            params = inspect.signature(fn).parameters
            takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            kwargs = {k: v for k, v in values.items() if takes_all or k in params}
            total += float(weight) * float(_resolve(fn(**kwargs)))
        return total


V1_DRIVER = Path(__file__).with_name("vf1_driver.py")


def driver_env(kw: Mapping[str, Any]) -> dict[str, str]:
    """The environment of a vf1_driver process: PYTHONPATH gains `data.task_kwargs.pythonpath`
    (where the taskset's module lives)."""
    env = dict(os.environ)
    extra = kw.get("pythonpath")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([str(extra), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


@functools.lru_cache(maxsize=8)
def _list_v1(python: str, ref: str, args_json: str, pythonpath: str | None) -> tuple[dict[str, Any], ...]:
    if not Path(python).is_file():
        raise InputError(f"data.task_kwargs.python={python!r}: no such interpreter (the virtualenv with verifiers 0.4; "
                         "`make test` builds .venv-verifiers)")
    proc = subprocess.run([python, str(V1_DRIVER), "list", ref, args_json], capture_output=True, text=True,
                          env=driver_env({"pythonpath": pythonpath}), timeout=600)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"data.task_kwargs.env={ref!r}: verifiers 0.4 cannot load the taskset ({last[:300]})")
    return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))


def _make_v1_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """A task of a verifiers 0.4 taskset, listed by vf1_driver.py in the other virtualenv."""
    if not kw.get("env"):
        raise InputError("data.task=verifiers needs data.task_kwargs.env (a verifiers 0.4 taskset id)")
    args = dict(kw.get("args") or {})
    tasks = _list_v1(str(kw["python"]), str(kw["env"]), json.dumps(args, sort_keys=True), kw.get("pythonpath"))
    if not tasks:
        raise InputError(f"verifiers taskset {kw['env']!r} has no tasks")
    k = rng.randrange(len(tasks))
    return {"id": f"vf-{i}", "prompt": tasks[k]["prompt"], "answer": "", "row": k, "env": "verifiers",
            "vf_env": kw["env"], "vf_args": args, "vf_python": str(kw["python"]), "vf_pythonpath": kw.get("pythonpath")}


def make_verifiers_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """A row of the environment's dataset, drawn with `rng` (train and held-out draws differ); a
    task of a verifiers 0.4 taskset when `data.task_kwargs.python` names the virtualenv that has it."""
    if kw.get("python"):
        return _make_v1_task(rng, i, kw)
    env = load_verifiers_env(kw.get("env"), kw.get("args"))
    split = kw.get("split", "dataset")
    rows = getattr(env, split, None)
    if rows is None or len(rows) == 0:
        raise InputError(f"verifiers environment {kw['env']!r} has no rows in {split!r}")
    k = rng.randrange(len(rows))
    msgs = _prompt_messages(env, rows[k])
    return {"id": f"vf-{i}", "prompt": msgs[-1]["content"], "answer": str(rows[k].get("answer", "")), "row": k,
            "split": split, "env": "verifiers", "vf_env": kw["env"], "vf_args": dict(kw.get("args") or {})}


@register_env("verifiers")
def verifiers_env() -> EnvSpec:
    """A verifiers environment (load_environment + rubric); no scripted expert (train from model.path)."""
    return EnvSpec("verifiers", make_verifiers_task, VerifiersEnv, None, "a verifiers environment with its rubric")
