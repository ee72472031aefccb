"""The planner's pilot: a few rollouts per problem from the starting checkpoint.

The pilot samples training problems at the *training* sampling settings (what RL will see), so
its pass rates are the ones GRPO groups will have at step 0. It plays the problems through the
task's rollout (`tether.rollout.make_rollout`): real episodes for an environment task. It records
per-problem success counts and the sampled tokens per rollout (to convert a token budget into
rollouts).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from tether.policy.config import SamplingConfig
from tether.policy.hf import HFPolicy


@dataclass(frozen=True)
class PilotResult:
    """Per-problem (samples, successes), mean sampled tokens per rollout and provenance."""

    task_ids: tuple[str, ...]
    counts: tuple[tuple[int, int], ...]
    tokens_per_rollout: float
    prompt_tokens_per_rollout: float
    model: str = ""
    seconds: float = 0.0
    rollout: str = ""  # the rollout kind that produced the counts (tether.rollout)

    @property
    def pass_rates(self) -> dict[str, float]:
        return {t: c / n for t, (n, c) in zip(self.task_ids, self.counts)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PilotResult":
        return cls(task_ids=tuple(data["task_ids"]), counts=tuple((int(n), int(c)) for n, c in data["counts"]),
                   tokens_per_rollout=float(data["tokens_per_rollout"]),
                   prompt_tokens_per_rollout=float(data.get("prompt_tokens_per_rollout", 0.0)),
                   model=str(data.get("model", "")), seconds=float(data.get("seconds", 0.0)),
                   rollout=str(data.get("rollout", "")))

    @classmethod
    def load(cls, path: str | Path) -> "PilotResult":
        return cls.from_json(json.loads(Path(path).read_text()))


def run_pilot(policy: HFPolicy, problems: Sequence[Mapping[str, Any]], num_problems: int, samples: int,
              sampling: SamplingConfig, rollout: Any, seed: int = 0, model: str = "") -> PilotResult:
    """`samples` rollouts for each of `num_problems` training problems drawn at random (seeded)."""
    if samples < 2:
        raise ValueError("the pilot needs >= 2 samples per problem to see pass rates")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    chosen = list(problems) if num_problems >= len(problems) else rng.sample(list(problems), num_problems)
    gen = torch.Generator().manual_seed(seed)
    was_training = policy.model.training
    policy.model.eval()
    try:
        groups, _ = rollout.run(policy, chosen, samples, sampling, gen)
    finally:
        if was_training:
            policy.model.train()
    trajs = [t for g in groups for t in g.trajectories]
    tokens = sum(t.num_action_tokens for t in trajs) / max(len(trajs), 1)
    prompt = sum(len(t.turns[0].context_ids) for t in trajs if t.turns) / max(len(trajs), 1)
    return PilotResult(
        task_ids=tuple(g.task_id for g in groups),
        counts=tuple((len(g.trajectories), sum(bool(t.reward.correct) for t in g.trajectories)) for g in groups),
        tokens_per_rollout=tokens, prompt_tokens_per_rollout=prompt, model=model, seconds=time.perf_counter() - t0,
        rollout=rollout.kind)
