"""A multi-turn environment whose episodes always last `turns` turns, whatever the model says:
partial rollouts park and resume it deterministically. Rollout workers import this module
through `dist.worker_imports` (the registration must happen in their processes too)."""

from __future__ import annotations

from typing import Any, Mapping

from tether.envs import ENVS, EnvSpec, Observation, StepResult, register_env
from tether.policy.chat import Message

NAME = "_test_turns"


class TurnsEnv:
    """Says 'go on' until the episode has `turns` turns; reward 1 at the end."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task, self.t = task, 0

    def reset(self) -> Observation:
        return Observation((Message("user", self.task["prompt"]),))

    def step(self, action) -> StepResult:
        self.t += 1
        done = self.t >= int(self.task["turns"])
        return StepResult(Observation((Message("user", "go on"),)), 1.0 if done else 0.0, done, {"correct": done})


def _task(rng, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"turns-{i}", "prompt": f"count {rng.randint(0, 10**6)}", "answer": "", "turns": int(kw.get("turns", 3))}


if NAME not in ENVS:
    @register_env(NAME)
    def _spec() -> EnvSpec:
        return EnvSpec(NAME, _task, TurnsEnv, expert=lambda task, history: "ok", description="fixed-length episodes")


def hang(text, task, **kwargs):
    """A reward service that never answers inside a Ray actor (inline isolation: the whole rollout
    worker hangs); in the driver (evaluation) it answers 0."""
    import time

    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        time.sleep(10**6)
    return 0.0
