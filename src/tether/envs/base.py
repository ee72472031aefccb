"""The environment protocol: a single-use, step-level MDP (Agent-R1, arXiv 2511.14460 v2, "step-level MDP").

An episode is a sequence of transitions z_t = (o_t, a_t, e_t, r_t, o_{t+1}): the agent sees
observation o_t (chat messages), emits action a_t (text sampled as token ids), and the
environment operator E(o_t, a_t) = (o_{t+1}, r_t, d_t, e_t) returns the next observation, a
reward, whether the episode is done and extra info. The environment owns its state; an Env
object serves exactly one episode (`reset` once, then `step` until done) — tinker-cookbook's
`rl/types.py` shape, which makes batching across episodes trivial and state leaks impossible.

Observations are chat messages (role `user` or `tool`) so they render through the tokenizer's
chat template; a context builder (`tether.envs.context`) turns the history into the next model
context. Environments are registered by name in `ENVS`; each is also registered as a task in
`tether.tasks.TASKS`, so `data.task=<env>` draws problems, held-out splits and the tokenizer
corpus through the same path as single-turn tasks. A problem dict carries `"env"`: the name of
the environment that plays it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from tether.envs.tools import ParsedAction, Tool, parse_tool_calls
from tether.types import Message
from tether.registry import Registry
from tether.tasks import SPEC_HANDLERS, TASKS, TaskSpec


@dataclass(frozen=True)
class Observation:
    """o_t: the messages the environment shows the agent (role `user`/`tool`, or `system` first)."""

    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Action:
    """a_t: the sampled ids, their decoded text (cut at the stop token) and the parsed tool calls."""

    text: str
    token_ids: tuple[int, ...] = ()
    parsed: ParsedAction = field(default_factory=ParsedAction)
    truncated: bool = False  # the sampler hit max_new_tokens before a stop token


@dataclass(frozen=True)
class StepResult:
    """E(o_t, a_t) = (o_{t+1}, r_t, d_t, e_t). `info` may hold `correct` (verified success) and
    tool counters (`tool_calls`, `tool_errors`, `tool_timeouts`, `parse_errors`)."""

    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Transition:
    """z_t = (o_t, a_t, e_t, r_t, o_{t+1}), kept per step in `Trajectory.info["transitions"]`."""

    observation: Observation
    action: Action
    info: Mapping[str, Any]
    reward: float
    next_observation: Observation
    done: bool


class Env(Protocol):
    """One episode. `tools` are rendered into the context through the chat template."""

    tools: Sequence[Tool]

    def reset(self) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...


Expert = Callable[[Mapping[str, Any], Sequence[Message]], str]  # (task, history) -> action text
# (task, history, the expert's action, rng) -> a weak teacher's wrong action, or None: no slip here
Mistake = Callable[[Mapping[str, Any], Sequence[Message], str, random.Random], "str | None"]


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: a seeded task generator, the single-use env factory, a
    scripted expert (the SFT demonstrations and the ceiling of the success metric) and,
    optionally, the mistakes a weak teacher makes (`sft.demo_noise`, see `run_expert_episode`)."""

    name: str
    make_task: Callable[[random.Random, int, dict[str, Any]], dict[str, Any]]
    make_env: Callable[[Mapping[str, Any]], Env]
    expert: Expert | None = None
    description: str = ""
    mistake: Mistake | None = None


ENVS: Registry[Callable[[], EnvSpec]] = Registry("environment")


def register_env(name: str) -> Callable[[Callable[[], EnvSpec]], Callable[[], EnvSpec]]:
    """Register an EnvSpec factory under `name` in ENVS and, as a task, in TASKS."""

    def deco(factory: Callable[[], EnvSpec]) -> Callable[[], EnvSpec]:
        ENVS.register(name)(factory)
        TASKS.register(name)(lambda: _task_spec(factory()))
        return factory

    return deco


def _register_user_env(name: str, spec: Any) -> bool:
    """`data.task=package.module:factory` whose factory returns an EnvSpec: registered under that
    name, and under its own `EnvSpec.name` (the name its problems carry in "env")."""
    if not isinstance(spec, EnvSpec):
        return False
    register_env(name)(lambda: spec)
    if spec.name not in ENVS:
        ENVS.register(spec.name)(lambda: spec)
    return True


SPEC_HANDLERS.append(_register_user_env)


def get_spec(task: Mapping[str, Any]) -> EnvSpec:
    if "env" not in task:
        raise KeyError(f"problem {task.get('id')!r} names no environment (key 'env')")
    return ENVS[task["env"]]()


def make_env(task: Mapping[str, Any]) -> Env:
    """A fresh single-use environment for `task` (dispatch on `task["env"]`)."""
    return get_spec(task).make_env(task)


def run_expert_episode(task: Mapping[str, Any], max_turns: int = 16, noise: float = 0.0,
                       rng: random.Random | None = None) -> tuple[list[Message], list[dict], StepResult | None]:
    """Play one episode with the task's scripted expert. Returns the conversation (initial
    observation, expert actions as text, observations), the tool schemas and the last step.

    A weak teacher: with probability `noise` (drawn from `rng`) the episode contains one
    mistake — the expert's action at the first turn where the env's `mistake` function offers
    one is replaced by it (a wrong answer, a wrong item, a wrong edit); the expert plays on
    from whatever state that leaves."""
    spec = get_spec(task)
    if spec.expert is None:
        raise ValueError(f"environment {spec.name!r} has no scripted expert")
    env = spec.make_env(task)
    history = list(env.reset().messages)
    schemas = [t.schema for t in getattr(env, "tools", ())]
    last = None
    slip = bool(noise) and rng is not None and spec.mistake is not None and rng.random() < noise
    for _ in range(max_turns):
        text = spec.expert(task, history)
        if slip and (wrong := spec.mistake(task, history, text, rng)) is not None:
            text, slip = wrong, False
        history.append(Message("assistant", text))
        last = env.step(Action(text=text, parsed=parse_tool_calls(text)))
        history.extend(last.observation.messages)
        if last.done:
            break
    return history, schemas, last


def compute_corpus_text(task: Mapping[str, Any]) -> str:
    """Text of the expert's conversation (roles, contents, tool schemas): the tiny tokenizer's
    training corpus, so the BPE learns the environment's vocabulary."""
    history, schemas, _ = run_expert_episode(task)
    lines = [json.dumps(s) for s in schemas] + [f"{m.role}\n{m.content}" for m in history]
    return "\n".join(lines)


def _task_spec(spec: EnvSpec) -> TaskSpec:
    def make_problem(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
        problem = spec.make_task(rng, i, kw)
        return {"env": spec.name, **problem} if "env" not in problem else problem

    return TaskSpec(spec.name, make_problem, compute_corpus_text, "exact_match", spec.description)


# ----------------------------------------------------------------------------- multi-task mixing


def _mix_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """One problem from an environment drawn by weight from `kw["envs"]`:
    [{"name": "calc", "weight": 0.7, "kwargs": {...}}, ...] (Nemotron 3 / MiniMax-M2 mixing)."""
    entries = kw.get("envs")
    if not entries:
        raise ValueError('data.task=env_mix needs data.task_kwargs.envs=[{"name": ..., "weight": ...}, ...]')
    names = [e["name"] for e in entries]
    weights = [float(e.get("weight", 1.0)) for e in entries]
    if any(w < 0 for w in weights) or sum(weights) <= 0 or "env_mix" in names:
        raise ValueError(f"env_mix: weights must be >= 0 with a positive sum, and mixes cannot nest: {entries}")
    k = rng.choices(range(len(entries)), weights=weights)[0]
    spec = ENVS[names[k]]()
    return {**spec.make_task(rng, i, dict(entries[k].get("kwargs", {}))), "env": spec.name}


def _mix_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    expert = get_spec(task).expert
    if expert is None:
        raise ValueError(f"environment {task['env']!r} has no scripted expert")
    return expert(task, history)


def _mix_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str, rng: random.Random) -> str | None:
    mistake = get_spec(task).mistake
    return None if mistake is None else mistake(task, history, action, rng)


@register_env("env_mix")
def env_mix() -> EnvSpec:
    """Several environments in one run, mixed by weight; each problem is played by its own env."""
    return EnvSpec("env_mix", _mix_task, make_env, _mix_expert, "weighted mixture of environments", _mix_mistake)
