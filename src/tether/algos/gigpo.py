"""Turn-level advantage estimators for multi-turn episodes, registered in ADVANTAGES:

    gigpo      GiGPO (Feng et al., arXiv 2505.10978 §4): A = A^E + omega * A^S, step groups by
               anchor state (identical observations across the group's trajectories).
    step_grpo  GRPO on per-turn discounted returns: A_{i,t} = (G_{i,t} - mean_g R) / (std_g R + eps).
               With a terminal outcome r, G_{i,t} = r * gamma^(T_i-1-t): Kimi-Researcher's
               gamma-decayed outcome reward (moonshotai.github.io/Kimi-Researcher, "RL training");
               with gamma = 1 and a terminal reward it equals `grpo`.

Both read the per-turn structure from `AdvantageInputs.step_BT` (turn index of each action
token) and the per-token rewards: a step's reward r_t is the sum of `token_rewards_BT` over the
step's action tokens (batching puts Turn.reward on a turn's last action token and the trajectory
score on the final one), so the rewards of an episode sum to its return R = sum_t r_t.
Discounted step returns: G_t = r_t + gamma * G_{t+1} with gamma = cfg.step_gamma.

Conventions shared with `advantages.py`: statistics in float64 and centred, so equal values give
exact zeros; invalid trajectories are excluded from every statistic and get exactly 0; a group
(or step group) of one gets 0; advantages are exactly 0 off-mask. A trajectory masked by compact
filtering (loss weight 0) still counts in the statistics, as in `grpo`.

Shapes: B sequences, T tokens, S steps (unique (trajectory, turn) pairs), U trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tether.algos.advantages import _group_stats
from tether.algos.base import ADVANTAGES, AdvantageFacts, AdvantageInputs, AdvantageOutputs
from tether.algos.config import AdvantageConfig

_F64 = torch.float64


@dataclass(frozen=True)
class StepView:
    """The steps of a batch. `index_BT` maps each action token to its step (-1 elsewhere);
    steps are sorted by (trajectory, turn), so a trajectory's steps are consecutive."""

    index_BT: torch.Tensor  # [B,T] long
    traj_S: torch.Tensor  # [S] long, dense trajectory id 0..U-1
    group_S: torch.Tensor  # [S] long
    anchor_S: torch.Tensor  # [S] long (-1 when no anchors were given)
    reward_S: torch.Tensor  # [S] float64
    valid_S: torch.Tensor  # [S] bool


def compute_step_view(inp: AdvantageInputs) -> StepView:
    """Group action tokens into steps. Without `step_BT`, every sequence is one turn-0 step."""
    B, T = inp.mask_BT.shape
    step_BT = inp.step_BT if inp.step_BT is not None else torch.where(inp.mask_BT > 0, 0, -1)
    act_BT = step_BT >= 0
    traj_BT = inp.traj_B[:, None].expand(B, T)
    key_BT = traj_BT * (int(step_BT.max().clamp(min=0)) + 1) + step_BT.clamp(min=0)
    keys, inverse = torch.unique(key_BT[act_BT], return_inverse=True)  # sorted: (traj, turn) order
    S = keys.numel()
    index_BT = torch.full((B, T), -1, dtype=torch.long)
    index_BT[act_BT] = inverse
    rows = torch.arange(B)[:, None].expand(B, T)[act_BT]
    first = torch.full((S,), B * T, dtype=torch.long).scatter_reduce(0, inverse, torch.arange(inverse.numel()), "amin")
    row_S = rows[first]
    _, traj_S = torch.unique(inp.traj_B[row_S], return_inverse=True)
    anchor_S = inp.anchor_BT[act_BT][first] if inp.anchor_BT is not None else torch.full((S,), -1, dtype=torch.long)
    reward_S = torch.zeros(S, dtype=_F64).index_add(0, inverse, inp.token_rewards_BT[act_BT].to(_F64))
    valid_S = torch.ones(S, dtype=torch.long).scatter_reduce(0, inverse, inp.valid_B[rows].long(), "amin").bool()
    return StepView(index_BT, traj_S, inp.group_B[row_S], anchor_S, reward_S, valid_S)


def compute_step_returns(v: StepView, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(G_S, R_U): discounted return-to-go of each step within its trajectory, and each
    trajectory's undiscounted return R = sum_t r_t."""
    S = v.reward_S.numel()
    G = torch.zeros(S, dtype=_F64)
    running = 0.0
    for s in reversed(range(S)):
        same = s + 1 < S and bool(v.traj_S[s + 1] == v.traj_S[s])
        running = float(v.reward_S[s]) + (gamma * running if same else 0.0)
        G[s] = running
    U = int(v.traj_S.max()) + 1 if S else 0
    R = torch.zeros(U, dtype=_F64).index_add(0, v.traj_S, v.reward_S)
    return G, R


def _trajectory_stats(v: StepView, R_U: torch.Tensor) -> dict[str, torch.Tensor]:
    """Group statistics of the trajectories' returns (per trajectory U)."""
    U = R_U.numel()
    group_U = torch.zeros(U, dtype=torch.long).scatter(0, v.traj_S, v.group_S)
    valid_U = torch.ones(U, dtype=torch.long).scatter_reduce(0, v.traj_S, v.valid_S.long(), "amin").bool()
    _, dense_U = torch.unique(group_U, return_inverse=True)
    return _group_stats(R_U, dense_U, valid_U)


def _to_tokens(adv_S: torch.Tensor, v: StepView, inp: AdvantageInputs) -> AdvantageOutputs:
    """Step advantages -> [B,T]; exactly 0 off-mask, on invalid sequences and non-action tokens."""
    keep_BT = (inp.mask_BT > 0) & inp.valid_B[:, None] & (v.index_BT >= 0)
    adv_S = torch.where(v.valid_S, adv_S, torch.zeros_like(adv_S))
    gathered = adv_S[v.index_BT.clamp(min=0)] if adv_S.numel() else torch.zeros(v.index_BT.shape, dtype=_F64)
    out_dtype = torch.promote_types(inp.token_rewards_BT.dtype, torch.float32)
    return AdvantageOutputs(advantages_BT=torch.where(keep_BT, gathered, 0.0).to(out_dtype))


@ADVANTAGES.register("gigpo", AdvantageFacts(group_relative=True, reads_token_rewards=True))
def compute_gigpo_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """GiGPO (Feng et al., arXiv 2505.10978 §4, episode- and step-level relative advantages): A = A^E + omega * A^S.

    A^E(tau_i) = (R_i - mean_g R) / F over the group's trajectories (episode relative advantage);
    A^S(a_t) = (G_t - mean_anchor G) / F over the steps of the group whose observation is
    identical (anchor-state grouping, `anchor_BT`); G_t = discounted step return with
    gamma = cfg.step_gamma; omega = cfg.step_weight; F = Bessel std + eps when
    cfg.step_std_norm else 1 (the paper code's default `mean_norm`). Singleton groups give 0.
    Example (hand-computed in the tests): two 2-turn episodes of one problem sharing turn-0's
    observation, rewards (0, 1) and (0, 0), gamma 0.5, F = 1: R = (1, 0) -> A^E = (+0.5, -0.5);
    turn-0 returns (0.5, 0) share an anchor -> A^S = (+0.25, -0.25); turn-1 observations differ
    -> A^S = 0; so A = (0.75, 0.5 | -0.75, -0.5).
    """
    if inp.anchor_BT is None:
        raise ValueError("advantage 'gigpo' needs anchor_BT (anchor-state ids per action token)")
    v = compute_step_view(inp)
    if v.reward_S.numel() == 0:
        return _to_tokens(v.reward_S, v, inp)
    G_S, R_U = compute_step_returns(v, cfg.step_gamma)
    ep = _trajectory_stats(v, R_U)
    norm_U = ep["std"] + cfg.eps if cfg.step_std_norm else torch.ones_like(ep["std"])
    adv_E_U = torch.where(ep["n"] > 1, ep["dev"] / norm_U, torch.zeros_like(R_U))
    _, anchor_group_S = torch.unique(torch.stack([v.group_S, v.anchor_S]), dim=1, return_inverse=True)
    st = _group_stats(G_S, anchor_group_S, v.valid_S)
    norm_S = st["std"] + cfg.eps if cfg.step_std_norm else torch.ones_like(st["std"])
    adv_S_S = torch.where(st["n"] > 1, st["dev"] / norm_S, torch.zeros_like(G_S))
    return _to_tokens(adv_E_U[v.traj_S] + cfg.step_weight * adv_S_S, v, inp)


@ADVANTAGES.register("step_grpo", AdvantageFacts(group_relative=True, reads_token_rewards=True))
def compute_step_grpo_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """GRPO on per-turn discounted returns (Kimi-Researcher's gamma decay; see module docstring).

    A_{i,t} = (G_{i,t} - mean_g R) / (std_g R + eps): the baseline and scale are the group's
    episode-return statistics (DeepSeekMath arXiv 2402.03300 §4.1.2), the signal is the return
    from turn t on, discounted per turn by cfg.step_gamma. A terminal reward r gives
    G_{i,t} = r * gamma^(T_i - 1 - t): a successful short episode credits its early actions more
    than a long one. Computed as ((G - R) + (R - mean)) / (std + eps), so gamma = 1 with a
    terminal reward reproduces `grpo` exactly. Group of one -> 0.
    """
    v = compute_step_view(inp)
    if v.reward_S.numel() == 0:
        return _to_tokens(v.reward_S, v, inp)
    G_S, R_U = compute_step_returns(v, cfg.step_gamma)
    ep = _trajectory_stats(v, R_U)
    num_S = (G_S - R_U[v.traj_S]) + ep["dev"][v.traj_S]
    adv_S = torch.where(ep["n"][v.traj_S] > 1, num_S / (ep["std"][v.traj_S] + cfg.eps), torch.zeros_like(G_S))
    return _to_tokens(adv_S, v, inp)
