"""Policy lag: admission control and the staleness metrics of a step (docs/design.md, correctness rule 15).

Versions: the trainer's weights are version v; one update makes v + 1. The batch that the
trainer consumes at version c is "batch c". A sample's staleness is c minus the version of the
policy that produced it (for a multi-turn episode, of its OLDEST turn: partial rollouts and
cross-policy sampling make turns of one episode come from different versions).

Admission control bounds staleness *before* generation: a worker holding version w may start
work for batch c only if c - w <= max_staleness. Nothing is ever discarded for being slow —
dropping late samples biases the data toward easy prompts (tinker-cookbook PR#822).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from tether.types import TrajectoryGroup


def is_admissible(batch_version: int, worker_version: int, max_staleness: int) -> bool:
    """May weights of `worker_version` generate for the trainer's batch `batch_version`?"""
    return batch_version - worker_version <= max_staleness


def compute_admissible_batches(trainer_version: int, next_batch: int, max_staleness: int) -> list[int]:
    """Batches that can be dispatched now, once every worker holds `trainer_version`:
    `next_batch` .. trainer_version + max_staleness (empty when none)."""
    return list(range(next_batch, trainer_version + max_staleness + 1))


def compute_lags(groups: Sequence[TrajectoryGroup], batch_version: int) -> tuple[list[int], list[int]]:
    """(per-trajectory lag of the oldest turn, per-turn lag) for a batch consumed at `batch_version`."""
    traj, turns = [], []
    for g in groups:
        for t in g.trajectories:
            versions = [turn.policy_version for turn in t.turns]
            if not versions:
                continue
            traj.append(batch_version - min(versions))
            turns.extend(batch_version - v for v in versions)
    return traj, turns


def compute_staleness_metrics(groups: Sequence[TrajectoryGroup], batch_version: int, max_bucket: int) -> dict[str, float]:
    """`staleness/mean|max`, the histogram `staleness/frac_lag_<k>` (k = 0..max_bucket; the last
    bucket also counts larger lags), per-turn means, and the fraction of episodes whose tokens
    came from more than one policy version (`staleness/mixed_version_frac`: turns of different
    versions, or an in-flight update inside a turn, `Turn.action_versions`)."""
    traj, turns = compute_lags(groups, batch_version)
    n = max(len(traj), 1)
    out = {"staleness/mean": sum(traj) / n, "staleness/max": float(max(traj, default=0)),
           "staleness/turn_mean": sum(turns) / max(len(turns), 1)}
    hist = Counter(min(lag, max_bucket) for lag in traj)
    for k in range(max_bucket + 1):
        out[f"staleness/frac_lag_{k}"] = hist.get(k, 0) / n
    mixed = [len({v for turn in t.turns for v in (turn.policy_version, *turn.action_versions)}) > 1
             for g in groups for t in g.trajectories if t.turns]
    out["staleness/mixed_version_frac"] = sum(mixed) / max(len(mixed), 1)
    return out


def add_to_histogram(hist: Counter, lags: Iterable[int]) -> Counter:
    """Run-long staleness histogram (summary.json)."""
    hist.update(lags)
    return hist


__all__ = ["add_to_histogram", "compute_admissible_batches", "compute_lags", "compute_staleness_metrics", "is_admissible"]
