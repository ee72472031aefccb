"""Per-turn fields the advantage estimators need, built from a step's TrajectoryGroups.

    fields = compute_step_fields(groups, padded)           # task_B, step_BT, anchor_BT
    adv = compute_advantages(AdvantageInputs(..., **fields), cfg.algo.advantage)

- `step_BT`: the turn index of each action token (from batching), read by `gigpo` / `step_grpo`.
- `anchor_BT`: GiGPO anchor states (arXiv 2505.10978 §4): turns of one group that acted on an
  identical observation share an id. The rollout records the digest of the observation messages
  in `Turn.info["anchor"]`; a turn without one (single-turn tasks) is keyed by its context ids.
- `task_B`: the task type of each sequence (`task["env"]`, else one task), for multi-task
  normalisation (`algo.advantage.task_norm`: AgentRL per-task whitening, ERPO per-environment
  baselines).

How env rewards reach the token rewards (broadcast vs step) is decided by the rollout
(`tether.rollout.runner.compute_turn_rewards`, config `env.credit`).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from tether.train.batching import PaddedRecords
from tether.types import Turn, TrajectoryGroup


def compute_turn_anchor(turn: Turn) -> str:
    """The anchor key of a turn: the rollout's observation digest, else a digest of its context."""
    key = turn.info.get("anchor") if turn.info else None
    if key is None:
        key = hashlib.sha1(repr(turn.context_ids).encode()).hexdigest()[:16]
    return str(key)


def compute_anchor_table(groups: Sequence[TrajectoryGroup]) -> torch.Tensor:
    """[U, max turns] long: dense anchor id of every (trajectory, turn), -1 past a trajectory's
    end. Trajectories are numbered as `batching.build_records` numbers them; ids are unique per
    (group, anchor key), so identical observations in different groups never share a step group."""
    trajs = [(g, t) for g, group in enumerate(groups) for t in group.trajectories]
    width = max((len(t.turns) for _, t in trajs), default=0)
    table = torch.full((len(trajs), max(width, 1)), -1, dtype=torch.long)
    ids: dict[tuple[int, str], int] = {}
    for u, (g, traj) in enumerate(trajs):
        for k, turn in enumerate(traj.turns):
            table[u, k] = ids.setdefault((g, compute_turn_anchor(turn)), len(ids))
    return table


def compute_task_ids(groups: Sequence[TrajectoryGroup], group_B: torch.Tensor) -> torch.Tensor:
    """[B] long: index (in sorted name order) of the task type of each sequence's group."""
    names = [str(g.task.get("env", "")) if g.task else "" for g in groups]
    index = {n: i for i, n in enumerate(sorted(set(names)))}
    per_group = torch.tensor([index[n] for n in names], dtype=torch.long)
    return per_group[group_B] if len(names) else torch.zeros_like(group_B)


def compute_step_fields(groups: Sequence[TrajectoryGroup], padded: PaddedRecords) -> dict[str, torch.Tensor | None]:
    """`task_B`, `step_BT` and `anchor_BT` for AdvantageInputs (see module docstring)."""
    step_BT = padded.turn_BT
    anchor_BT = None
    if step_BT is not None:
        table = compute_anchor_table(groups)
        looked_up = table[padded.traj_B[:, None], step_BT.clamp(min=0, max=table.shape[1] - 1)]
        anchor_BT = torch.where(step_BT >= 0, looked_up, torch.full_like(step_BT, -1))
    return {"task_B": compute_task_ids(groups, padded.group_B), "step_BT": step_BT, "anchor_BT": anchor_BT}
