"""Multi-turn environment rollouts behind the `tether.rollout.Rollout` interface.

The episode engine itself is `tether.rollout.runner.run_env_rollouts` (every turn of every live
episode in one sampling call); the expert demonstrations are `tether.rollout.demos`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from tether.train.batching import SeqRecord
from tether.envs.config import EnvConfig
from tether.policy.config import SamplingConfig
from tether.rollout.runner import run_env_rollouts
from tether.rollout.demos import build_env_demo_records
from tether.policy.hf import HFPolicy, run_generate
from tether.types import Sample, TrajectoryGroup


@dataclass(frozen=True)
class EpisodeRollout:
    """A task played by single-use environments (`tether.envs`), one or more turns per episode."""

    env: EnvConfig
    batch_size: int = 256
    on_drift: str = "count"
    kind: str = "multi-turn environment"
    multi_turn: bool = True  # contexts are chat histories (a template is needed; env.context applies)

    def run(self, policy: HFPolicy, problems: Sequence[Mapping[str, Any]], n: int, sampling: SamplingConfig,
            generator: torch.Generator | None = None, greedy: bool = False,
            generate: Callable[..., list[Sample]] = run_generate) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        return run_env_rollouts(policy, problems, n, sampling, self, generator, greedy, generate)

    def fit_problems(self, problems: Sequence[Mapping[str, Any]], policy: HFPolicy, cfg: Any, what: str) -> list:
        """All of them: a context past env.max_context_tokens ends its episode (context_overflow)."""
        return list(problems)

    def build_demo_records(self, policy: HFPolicy, problems: Sequence[Mapping[str, Any]], cfg: Any) -> list[SeqRecord]:
        return build_env_demo_records(policy, problems, self.env.max_turns, cfg.sft.demo_noise,
                                      random.Random(cfg.run.seed), self.env.context)
