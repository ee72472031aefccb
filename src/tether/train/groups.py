"""Operations on a step's TrajectoryGroups before batching: reward shaping, dynamic sampling
and compact filtering. Each returns new frozen values; nothing is mutated.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from tether.algos.corrections import compute_stop_reason_weights, select_groups
from tether.algos.shaping import compute_length_reward, compute_overlong_penalty
from tether.algos.config import AlgoConfig, DynamicSamplingConfig
from tether.types import Outcome, Trajectory, TrajectoryGroup


def compute_raw_outcome(traj: Trajectory) -> float:
    """The unshaped outcome used by filters: verified correctness when known, else the raw
    reward total. Failed rewards are NaN so that filters ignore them."""
    if traj.reward.outcome != Outcome.OK:
        return float("nan")
    if traj.reward.correct is not None:
        return 1.0 if traj.reward.correct else 0.0
    return float(traj.reward.total)


def _with_bonus(traj: Trajectory, name: str, value: float) -> Trajectory:
    if traj.reward.outcome != Outcome.OK or value == 0.0:
        return traj
    comps = dict(traj.reward.components)
    comps[name] = comps.get(name, 0.0) + value
    reward = dataclasses.replace(traj.reward, total=traj.reward.total + value, components=comps)
    return dataclasses.replace(traj, reward=reward)


def apply_reward_shaping(groups: Sequence[TrajectoryGroup], algo: AlgoConfig, max_new_tokens: int) -> list[TrajectoryGroup]:
    """DAPO overlong penalty and Kimi k1.5 length reward, added as named reward components."""
    sh = algo.shaping
    if sh.overlong_cache_len is None and sh.length_penalty_coef == 0:
        return list(groups)
    out = []
    for g in groups:
        trajs = list(g.trajectories)
        lengths = torch.tensor([t.num_action_tokens for t in trajs], dtype=torch.float32)
        if sh.overlong_cache_len is not None:
            pen = compute_overlong_penalty(lengths, max_new_tokens, sh.overlong_cache_len, sh.overlong_factor)
            trajs = [_with_bonus(t, "overlong", float(p)) for t, p in zip(trajs, pen)]
        if sh.length_penalty_coef:
            correct = torch.tensor([bool(t.reward.correct) for t in trajs])
            lr = compute_length_reward(lengths, correct) * sh.length_penalty_coef
            trajs = [_with_bonus(t, "length", float(v)) for t, v in zip(trajs, lr)]
        out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
    return out


def select_informative_groups(groups: Sequence[TrajectoryGroup], cfg: DynamicSamplingConfig) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """DAPO dynamic sampling on raw outcomes; reports the zero-variance fraction either way."""
    outcomes = [[compute_raw_outcome(t) for t in g.trajectories] for g in groups]
    keep, m = select_groups(outcomes, cfg)
    return [groups[i] for i in keep], {k: float(v) for k, v in m.items()}


def compute_compact_weights(groups: Sequence[TrajectoryGroup], policy: dict[str, str]) -> tuple[list[TrajectoryGroup], dict[tuple[int, int], float], dict[str, float]]:
    """Per-stop-reason compact filtering: loss weights per (group, trajectory), rewards zeroed
    where the policy says so, and the masked fraction per reason."""
    if not policy:
        return list(groups), {}, {}
    stops = [t.stop for g in groups for t in g.trajectories]
    weight_B, zero_B = compute_stop_reason_weights(stops, policy)
    weights: dict[tuple[int, int], float] = {}
    out, k = [], 0
    for gi, g in enumerate(groups):
        trajs = []
        for ti, t in enumerate(g.trajectories):
            weights[(gi, ti)] = float(weight_B[k])
            if bool(zero_B[k]):
                t = dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=0.0))
            trajs.append(t)
            k += 1
        out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
    metrics = {"compact/masked_frac": float((weight_B == 0).float().mean()) if len(stops) else 0.0}
    for reason in policy:
        n = sum(1 for s in stops if str(getattr(s, "value", s)) == reason)
        metrics[f"compact/{reason}_frac"] = n / max(len(stops), 1)
    return out, weights, metrics
