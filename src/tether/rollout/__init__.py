"""The rollout seam: the ONE place that turns problems into TrajectoryGroups.

    rollout = make_rollout(cfg)                      # the only place that asks what kind the task is
    groups, metrics = rollout.run(policy, problems, n, sampling, generator)

Every consumer — the RL recipes (`collect_groups`, the held-out eval, ReMax's greedy baseline),
the Ray rollout workers, `tether eval`, the planner's pilot, SFT demonstrations, faultbench and
the benchmarks — holds a `Rollout` and never branches on the task kind:

    problems ─► make_rollout(cfg) ─┬─ SingleTurnRollout (rollout/single.py):  one turn, B_p x n in ONE sampling call
                                   ├─ EpisodeRollout    (rollout/episodes.py): rollout/runner.py, one call per turn
                                   └─ HarnessRollout    (rollout/harness.py):     an agent program (harness.command)
                                             │
                                             ▼
                              list[TrajectoryGroup] + metrics   (types.py)

A single-turn task is an episode of one turn: both implementations return the same
`TrajectoryGroup`s (turns of context ids, action ids, action log-probs), so batching,
advantages and the update cannot tell them apart.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from tether.train.batching import SeqRecord
from tether.policy.config import SamplingConfig
from tether.rollout.collect import RolloutState, WorkerState, collect_groups, compute_greedy_baseline
from tether.rollout.stats import compute_rollout_stats
from tether.types import Sample, TrajectoryGroup


class Rollout(Protocol):
    """Plays problems with a policy: `run` -> (groups, metrics); `kind` names it for reports."""

    kind: str
    multi_turn: bool  # contexts are chat histories (input checks ask this fact, never the task's name)

    def run(self, policy: Any, problems: Sequence[Mapping[str, Any]], n: int, sampling: SamplingConfig,
            generator: torch.Generator | None = None, greedy: bool = False,
            generate: Callable[..., list[Sample]] = ...) -> tuple[list[TrajectoryGroup], dict[str, float]]: ...

    def build_demo_records(self, policy: Any, problems: Sequence[Mapping[str, Any]], cfg: Any) -> list[SeqRecord]: ...

    def fit_problems(self, problems: Sequence[Mapping[str, Any]], policy: Any, cfg: Any, what: str) -> list: ...


def is_episode_task(task: str) -> bool:
    """True when `data.task` names an environment (`tether.envs.ENVS`) rather than a single-turn task."""
    from tether.envs import ENVS
    from tether.tasks import load_user_task

    load_user_task(task)  # package.module:factory, in this process too (a Ray worker)
    return task in ENVS


def compute_tokenizer_corpus(task: str, problems: Sequence[Mapping[str, Any]]) -> list[str]:
    """Text for a tiny model's BPE: each prompt with its demonstration — the answer for data sources
    and for environments without a scripted expert (OpenEnv, verifiers, MCP adapters)."""
    from tether.envs import ENVS
    from tether.tasks import demonstration
    from tether.tasks.sources import is_file_task

    plain = is_file_task(task) or (task in ENVS and ENVS[task]().expert is None)
    return [p["prompt"] + (p.get("completion") or (str(p.get("answer", "")) if plain else demonstration(task, p)))
            for p in problems]


def sample_task_demonstrations(d: Any, limit: int) -> tuple[list[dict[str, Any]], list[str]]:
    """At most `limit` generated problems of a built-in task (`d`: the data section) and the text SFT
    trains on for each (tether.config.fit's statistics); an environment has no single-turn rows."""
    from tether.config_text import ConfigError
    from tether.tasks import demonstration, make_problems

    if is_episode_task(d.task):
        raise ConfigError(f"data.task={d.task!r} is an environment: `auto` settings read single-turn rows; "
                          "give numbers instead of auto")
    rows = make_problems(d.task, min(d.train_size, limit), d.seed, d.task_kwargs)
    return rows, [demonstration(d.task, r) for r in rows]


def make_rollout(cfg: Any) -> Rollout:
    """The rollout for `cfg.data.task` with the config's rewards / environment settings."""
    r = cfg.rollout
    h = getattr(cfg, "harness", None)
    if h is not None and h.command:  # a black-box agent program against the rollout endpoint
        from tether.rollout.harness import HarnessRollout
        from tether.rollout.prompt_format import read_trained_prompt_format

        return HarnessRollout(h.command, cfg.reward, h.timeout_s, h.concurrency, h.host, h.token, cfg.run.seed,
                              max_error_rate=cfg.env.max_error_rate, persistent=h.persistent,
                              prompt_format=read_trained_prompt_format(cfg.model.path))
    if cfg.data.task == "verifiers":  # a verifiers Environment runs its own loop against the endpoint
        from tether.rollout.verifiers import make_verifiers_rollout

        if (vf := make_verifiers_rollout(cfg)) is not None:
            return vf
    if is_episode_task(cfg.data.task):
        from tether.rollout.episodes import EpisodeRollout

        return EpisodeRollout(cfg.env, r.batch_size, r.on_drift)
    from tether.rollout.single import SingleTurnRollout

    return SingleTurnRollout(cfg.reward, r.batch_size, r.max_prompt_tokens, cfg.data.chat)


__all__ = ["Rollout", "RolloutState", "WorkerState", "collect_groups", "compute_greedy_baseline",
           "compute_rollout_stats", "compute_tokenizer_corpus", "is_episode_task", "make_rollout"]
