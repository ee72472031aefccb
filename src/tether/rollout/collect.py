"""A training step's rollout side, shared by the sync recipe and the Ray rollout workers.

`collect_groups(st, rollout, r, ds)` reads only a small state (`RolloutState`: policy, problem
stream, generator, fault seams) and the sections it needs (`rollout:`, `algo.dynamic_sampling`),
so `tether.dist.worker` runs exactly what `tether train` runs without importing the recipe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tether.algos.config import DynamicSamplingConfig
from tether.policy.config import SamplingConfig
from tether.rollout.config import RolloutConfig
from tether.train.groups import select_informative_groups
from tether.rollout.stats import compute_rollout_stats
from tether.types import TrajectoryGroup


class RolloutState(Protocol):
    """What the rollout side of a step reads (RLState and WorkerState both have it)."""

    policy: Any
    stream: Any  # .next_batch(k) -> problems
    generator: torch.Generator | None
    faults: Any  # .begin_rollout(problems, sampling) / .end_rollout(groups) (tether.health.faults)


@dataclass
class WorkerState:
    """A `RolloutState` for a process that does not train (a Ray rollout worker, a benchmark)."""

    policy: Any
    stream: Any
    generator: torch.Generator
    faults: Any = None
    step: int = 0

    def __post_init__(self) -> None:
        if self.faults is None:
            from tether.health.faults import NO_FAULTS

            self.faults = NO_FAULTS


def collect_groups(st: RolloutState, rollout: Any, r: RolloutConfig,
                   ds: DynamicSamplingConfig) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Rollouts for B_p problems (`r.problems_per_step`, `r.n` each) played by `rollout` (a
    tether.rollout.Rollout); with dynamic sampling (DAPO, arXiv 2503.14476 §3.2), redraw until B_p
    informative groups or `max_gen_batches` extra rounds."""
    from tether.health.telemetry import compute_buffers_fingerprint, compute_fingerprint_of_sums, compute_weight_sums

    kept: list[TrajectoryGroup] = []
    metrics: dict[str, float] = {}
    rounds = 1 + (ds.max_gen_batches if ds.enable else 0)
    for i in range(rounds):
        problems = st.stream.next_batch(r.problems_per_step)
        problems, sampling = st.faults.begin_rollout(problems, r.sampling)  # seams: data, sampler, weight sync (tether.health.faults)
        groups, m = rollout.run(st.policy, problems, r.n, sampling, st.generator)  # after the sampler seam
        # the weights that sampled, and their version (health: stale sync); after the rollout, so an
        # in-flight update adopted mid-generation (dist.inflight) is the version fingerprinted
        t_fp = time.perf_counter()
        sums = compute_weight_sums(getattr(st.policy, "model", None))
        m["rollout/weights_fp"] = compute_fingerprint_of_sums(sums)
        note = getattr(getattr(st, "health", None), "note_sampler_weights", None)
        if note is not None:  # which tensors match which trainer version, when the fingerprint does not
            note(sums)
        m["rollout/buffers_fp"] = compute_buffers_fingerprint(getattr(st.policy, "model", None))  # non-parameter state
        m["time/fingerprint"] = time.perf_counter() - t_fp  # the health layer's cost here (benchmarks/health_overhead.py)
        m["rollout/weights_fp_version"] = float(getattr(st.policy, "version", float("nan")))
        groups = st.faults.end_rollout(groups)  # seams: rewards, rollout log-probs, grouping
        if i == 0:
            metrics.update(m)
            metrics.update(compute_rollout_stats(groups))
        else:
            for k in ("time/generate", "time/reward", "rollout/gen_tokens"):
                metrics[k] = metrics.get(k, 0.0) + m.get(k, 0.0)
        informative, fm = select_informative_groups(groups, ds)
        if i == 0:
            metrics["frac_zero_variance_groups"] = fm["frac_zero_variance"]
        kept.extend(informative)
        if len(kept) >= r.problems_per_step:
            break
    metrics["dynamic_sampling/rounds"] = float(i + 1)
    metrics["dynamic_sampling/shortfall"] = float(max(0, r.problems_per_step - len(kept)))
    return kept[: r.problems_per_step], metrics


def compute_greedy_baseline(policy: Any, rollout: Any, sampling: SamplingConfig,
                            groups: list[TrajectoryGroup]) -> torch.Tensor:
    """ReMax (arXiv 2310.10505 §4): the reward of one greedy rollout (or episode) of `rollout` per problem -> [G]."""
    greedy, _ = rollout.run(policy, [g.task for g in groups], 1, sampling, None, greedy=True)
    return torch.tensor([g.trajectories[0].reward.total for g in greedy], dtype=torch.float32)
