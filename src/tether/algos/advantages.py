"""Advantage estimators, registered in ADVANTAGES with one signature:

    ADVANTAGES[name](AdvantageInputs, AdvantageConfig) -> AdvantageOutputs

Shared conventions (every estimator):
- Advantages are EXACTLY 0 off-mask and on invalid sequences (valid_B False: the reward failed).
- Group statistics (mean, std, leave-one-out) count each trajectory once: sequences that share
  `traj_B` are one episode (a multi-turn episode with a non-append context becomes several
  sequences) and enter the statistics with one score. Invalid trajectories are excluded.
- Group statistics run in float64 and are centred on the group's first member before averaging,
  so an all-equal group gets exactly 0 (verl's float32 path gives -0.0015 for [0.1, 0.1, 0.1]).
- A group of one valid trajectory gets advantage 0: with nothing to compare against there is no
  signal (verl instead returns A = R for GRPO; that rewards a lone sample for its raw score).
- Whitening (reinforce_pp*, gae) runs over the masked tokens of valid sequences: mean, Bessel
  std (as verl's compute_masked_whiten; OpenRLHF uses the biased variance), (x - mean) / (std + eps).

Shapes: B sequences, T tokens, U unique trajectories, G groups.
"""

from __future__ import annotations

import torch

from tether.algos.base import ADVANTAGES, AdvantageFacts, AdvantageInputs, AdvantageOutputs
from tether.algos.config import AdvantageConfig

_F64 = torch.float64


# ----------------------------------------------------------------------------- helpers


def _out_dtype(inp: AdvantageInputs) -> torch.dtype:
    return torch.promote_types(inp.token_rewards_BT.dtype, torch.float32)


def _first_index(ids_N: torch.Tensor, keep_N: torch.Tensor, num_ids: int) -> torch.Tensor:
    """[num_ids] index of the first kept element with each id (N where there is none)."""
    n = ids_N.numel()
    idx_N = torch.arange(n, device=ids_N.device)
    cand_N = torch.where(keep_N, idx_N, torch.full_like(idx_N, n))
    init = torch.full((num_ids,), n, dtype=torch.long, device=ids_N.device)
    return init.scatter_reduce(0, ids_N, cand_N, reduce="amin")


def _trajectory_view(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deduplicate sequences into trajectories.

    Returns scores_U (float64, the first sequence's score: a trajectory's sequences carry the same
    outcome by construction), group_U (dense group ids 0..G-1), valid_U (all of its sequences
    valid) and seq_to_traj_B ([B] index into U).
    """
    _, seq_to_traj_B = torch.unique(inp.traj_B, return_inverse=True)
    num_traj = int(seq_to_traj_B.max().item()) + 1 if seq_to_traj_B.numel() else 0
    first_U = _first_index(seq_to_traj_B, torch.ones_like(inp.valid_B, dtype=torch.bool), num_traj)
    valid_U = torch.ones(num_traj, dtype=torch.long, device=inp.valid_B.device).scatter_reduce(
        0, seq_to_traj_B, inp.valid_B.long(), reduce="amin"
    ).bool()
    _, group_U = torch.unique(inp.group_B[first_U], return_inverse=True)
    return inp.scores_B.to(_F64)[first_U], group_U, valid_U, seq_to_traj_B


def _group_stats(x_U: torch.Tensor, group_U: torch.Tensor, keep_U: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-item statistics of the item's group over kept items (float64).

    centred: x - ref (ref = the group's first kept value; 0 for dropped items), so equal values
    give exact zeros; dev: x - group mean; n: group size; total: sum of `centred` in the group;
    std: Bessel std (0 for groups of fewer than two).
    """
    num_groups = int(group_U.max().item()) + 1 if group_U.numel() else 0
    first_G = _first_index(group_U, keep_U, num_groups)
    ref_G = x_U[first_G.clamp(max=max(x_U.numel() - 1, 0))] if x_U.numel() else x_U
    zeros_U = torch.zeros_like(x_U)
    centred_U = torch.where(keep_U, x_U - ref_G[group_U], zeros_U)
    zeros_G = torch.zeros(num_groups, dtype=_F64, device=x_U.device)
    n_G = zeros_G.index_add(0, group_U, keep_U.to(_F64))
    total_G = zeros_G.index_add(0, group_U, centred_U)
    dev_U = torch.where(keep_U, centred_U - (total_G / n_G.clamp(min=1))[group_U], zeros_U)
    var_G = zeros_G.index_add(0, group_U, dev_U.square()) / (n_G - 1).clamp(min=1)
    var_G = torch.where(n_G > 1, var_G, zeros_G)
    return {
        "centred": centred_U,
        "dev": dev_U,
        "n": n_G[group_U],
        "total": total_G[group_U],
        "std": var_G.sqrt()[group_U],
    }


def _broadcast(adv_U: torch.Tensor, seq_to_traj_B: torch.Tensor, inp: AdvantageInputs) -> torch.Tensor:
    """Trajectory advantage -> [B,T], exactly 0 off-mask and on invalid sequences."""
    adv_B = torch.where(inp.valid_B, adv_U[seq_to_traj_B], 0.0)
    keep_BT = inp.mask_BT > 0
    return torch.where(keep_BT, adv_B[:, None], 0.0).to(_out_dtype(inp))


def _keep_BT(inp: AdvantageInputs) -> torch.Tensor:
    return (inp.mask_BT > 0) & inp.valid_B[:, None]


def compute_masked_whiten(x_BT: torch.Tensor, keep_BT: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / (std + eps) over the kept positions (Bessel std, float64); 0 elsewhere.

    The batch whitening of REINFORCE++ (arXiv 2501.03262) and of GAE advantages in PPO
    implementations (verl `masked_whiten`, with Bessel variance; OpenRLHF uses the biased one).

    Centred on the first kept value before averaging so that a constant input gives exact 0.
    Fewer than two kept positions: std = 0 (a single token is centred to 0).
    """
    x = x_BT.to(_F64)
    flat_x, flat_keep = x.reshape(-1), keep_BT.reshape(-1)
    stats = _group_stats(flat_x, torch.zeros_like(flat_x, dtype=torch.long), flat_keep)
    out = torch.where(flat_keep, stats["dev"] / (stats["std"] + eps), torch.zeros_like(flat_x))
    return out.reshape(x_BT.shape)


def _discounted_to_go(r_BT: torch.Tensor, keep_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{next kept t}, over kept positions only (0 elsewhere).

    Off-mask positions (environment/tool tokens, padding) are skipped: their rewards are ignored
    and they do not count as steps for the discount.
    """
    running_B = torch.zeros(r_BT.shape[0], dtype=_F64, device=r_BT.device)
    out_BT = torch.zeros_like(r_BT, dtype=_F64)
    for t in reversed(range(r_BT.shape[1])):
        k_B = keep_BT[:, t]
        running_B = torch.where(k_B, r_BT[:, t].to(_F64) + gamma * running_B, running_B)
        out_BT[:, t] = torch.where(k_B, running_B, torch.zeros_like(running_B))
    return out_BT


# ----------------------------------------------------------------------------- outcome (group)


@ADVANTAGES.register("grpo", AdvantageFacts(group_relative=True))
def compute_grpo_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """GRPO outcome advantage (DeepSeekMath, arXiv 2402.03300 §4.1.2): A_i = (R_i - mean) / (std + eps).

    std is the Bessel-corrected group std (verl, TRL, OpenRLHF all agree); eps = cfg.eps
    (default 1e-6 as verl; TRL 1e-4, OpenRLHF 1e-9). Group of one -> 0; all-equal group -> exactly 0.
    Example: rewards [1, 0, 0, 1] -> mean 0.5, std 0.5774 -> A = [+0.866, -0.866, -0.866, +0.866].
    """
    scores_U, group_U, valid_U, seq_to_traj_B = _trajectory_view(inp)
    s = _group_stats(scores_U, group_U, valid_U)
    adv_U = torch.where(s["n"] > 1, s["dev"] / (s["std"] + cfg.eps), torch.zeros_like(s["dev"]))
    return AdvantageOutputs(advantages_BT=_broadcast(adv_U, seq_to_traj_B, inp))


@ADVANTAGES.register("dr_grpo", AdvantageFacts(group_relative=True))
def compute_dr_grpo_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """Dr. GRPO advantage (Liu et al., arXiv 2503.20783 §3.2): A_i = R_i - mean (no std division).

    Pair with AggConfig.mode=constant_norm for the full Dr. GRPO objective. Group of one -> 0.
    """
    scores_U, group_U, valid_U, seq_to_traj_B = _trajectory_view(inp)
    s = _group_stats(scores_U, group_U, valid_U)
    return AdvantageOutputs(advantages_BT=_broadcast(s["dev"], seq_to_traj_B, inp))


@ADVANTAGES.register("rloo", AdvantageFacts(group_relative=True))
def compute_rloo_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """RLOO (Ahmadian et al., arXiv 2402.14740, "REINFORCE Leave-One-Out"): A_i = R_i - (1/(k-1)) sum_{j != i} R_j.

    Computed in the leave-one-out form (equal to k/(k-1) (R_i - mean)). Group of one -> 0 (no
    other sample to form a baseline; verl's loop path returns R there, its vectorised path 0).
    """
    scores_U, group_U, valid_U, seq_to_traj_B = _trajectory_view(inp)
    s = _group_stats(scores_U, group_U, valid_U)
    others_mean_U = (s["total"] - s["centred"]) / (s["n"] - 1).clamp(min=1)
    adv_U = torch.where((s["n"] > 1) & valid_U, s["centred"] - others_mean_U, torch.zeros_like(scores_U))
    return AdvantageOutputs(advantages_BT=_broadcast(adv_U, seq_to_traj_B, inp))


@ADVANTAGES.register("remax", AdvantageFacts(needs_greedy_baseline=True))
def compute_remax_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """ReMax (Li et al., arXiv 2310.10505, the ReMax algorithm): A = r(x, y_sampled) - r(x, y_greedy), no normalisation.

    baseline_B holds the reward of the greedy rollout of each sequence's prompt.
    """
    if inp.baseline_B is None:
        raise ValueError("advantage 'remax' needs baseline_B (the greedy-rollout reward per sequence)")
    adv_B = inp.scores_B.to(_F64) - inp.baseline_B.to(_F64)
    seq_to_traj_B = torch.arange(adv_B.numel(), device=adv_B.device)
    return AdvantageOutputs(advantages_BT=_broadcast(adv_B, seq_to_traj_B, inp))


# ----------------------------------------------------------------------------- token level


@ADVANTAGES.register("reinforce_pp", AdvantageFacts(reads_token_rewards=True))
def compute_reinforce_pp_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """REINFORCE++ (Hu et al., arXiv 2501.03262): token reward-to-go, then global whitening.

    A_t = sum_{s >= t} gamma^(s-t) r_s over the action tokens of the sequence (token_rewards_BT:
    outcome on the last action token, minus any per-token KL penalty), then whitened over all
    masked tokens of the batch. Each sequence is its own return horizon: for a trajectory split
    into several sequences, batching must place a reward in each sequence.
    returns_BT holds the un-whitened reward-to-go.
    """
    keep_BT = _keep_BT(inp)
    to_go_BT = _discounted_to_go(inp.token_rewards_BT, keep_BT, cfg.gamma)
    adv_BT = compute_masked_whiten(to_go_BT, keep_BT, cfg.eps)
    dtype = _out_dtype(inp)
    return AdvantageOutputs(advantages_BT=adv_BT.to(dtype), returns_BT=to_go_BT.to(dtype))


@ADVANTAGES.register("reinforce_pp_baseline", AdvantageFacts(group_relative=True))
def compute_reinforce_pp_baseline_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """REINFORCE++-baseline (Hu et al., arXiv 2501.03262): R_i - group mean, broadcast, global whitening.

    The group mean counts each trajectory once; a group of one gets 0 before whitening (verl keeps
    R there). Whitening runs over the masked tokens of valid sequences, so long responses weigh
    more in the batch mean and std (as in verl and OpenRLHF).
    """
    scores_U, group_U, valid_U, seq_to_traj_B = _trajectory_view(inp)
    s = _group_stats(scores_U, group_U, valid_U)
    centred_BT = _broadcast(s["dev"], seq_to_traj_B, inp)
    adv_BT = compute_masked_whiten(centred_BT, _keep_BT(inp), cfg.eps)
    return AdvantageOutputs(advantages_BT=adv_BT.to(_out_dtype(inp)))


@ADVANTAGES.register("gae", AdvantageFacts(needs_critic=True, reads_token_rewards=True))
def compute_gae_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """GAE (Schulman et al., arXiv 1506.02438 §3) over the action tokens, then whitening.

    delta_t = r_t + gamma V_{t'} - V_t and A_t = delta_t + gamma lambda A_{t'}, where t' is the next
    masked (action) token of the sequence: off-mask positions are skipped, not treated as steps
    (as verl's multi-turn GAE); after the last action token V = 0 (terminal).
    returns_BT = A + V (value targets, before whitening); advantages are then whitened over the
    masked tokens of valid sequences (verl and OpenRLHF default). Both are exactly 0 off-mask.
    """
    if inp.values_BT is None:
        raise ValueError("advantage 'gae' needs values_BT (critic values V(s_t) per token)")
    keep_BT = _keep_BT(inp)
    zeros_B = torch.zeros(keep_BT.shape[0], dtype=_F64, device=keep_BT.device)
    next_value_B, running_B = zeros_B, zeros_B
    raw_BT = torch.zeros(keep_BT.shape, dtype=_F64, device=keep_BT.device)
    for t in reversed(range(keep_BT.shape[1])):
        k_B = keep_BT[:, t]
        v_B = torch.where(k_B, inp.values_BT[:, t].to(_F64), zeros_B)
        r_B = torch.where(k_B, inp.token_rewards_BT[:, t].to(_F64), zeros_B)
        delta_B = r_B + cfg.gamma * next_value_B - v_B
        running_B = torch.where(k_B, delta_B + cfg.gamma * cfg.lam * running_B, running_B)
        next_value_B = torch.where(k_B, v_B, next_value_B)
        raw_BT[:, t] = torch.where(k_B, running_B, zeros_B)
    values_BT = torch.where(keep_BT, inp.values_BT.to(_F64), 0.0)
    returns_BT = torch.where(keep_BT, raw_BT + values_BT, 0.0)
    dtype = _out_dtype(inp)
    adv_BT = compute_masked_whiten(raw_BT, keep_BT, cfg.eps)
    return AdvantageOutputs(advantages_BT=adv_BT.to(dtype), returns_BT=returns_BT.to(dtype))


# ----------------------------------------------------------------------------- multi-task


def normalize_by_task(
    advantages_BT: torch.Tensor, mask_BT: torch.Tensor, task_B: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Task-level advantage normalisation (AgentRL, Zhang et al., arXiv 2510.04206): whiten per task.

    Each task type's advantages are whitened separately over its masked tokens, so tasks with
    different reward scales contribute comparably in multi-task RL. (The paper gives no equation;
    this is the per-task form of the global token whitening of REINFORCE++.) Apply after the
    estimator; positions with mask 0 stay exactly 0. [B,T], [B,T], [B] -> [B,T].
    """
    keep_BT = mask_BT > 0
    out_BT = torch.zeros(advantages_BT.shape, dtype=_F64, device=advantages_BT.device)
    for task in torch.unique(task_B).tolist():
        in_task_BT = keep_BT & (task_B == task)[:, None]
        out_BT = torch.where(in_task_BT, compute_masked_whiten(advantages_BT, in_task_BT, eps), out_BT)
    return out_BT.to(advantages_BT.dtype)
