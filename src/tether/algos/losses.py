"""Policy losses, registered in POLICY_LOSSES with one signature:

    POLICY_LOSSES[name](PolicyLossInputs, PolicyLossConfig) -> (loss_BT, metrics)

Each returns a per-token loss [B,T] (exactly 0 off-mask) that the caller aggregates with
`agg_loss`; nothing here normalises. Numerics (docs/design.md, correctness rule 5): masked positions are replaced
via `torch.where` BEFORE any `exp`, and the log-ratio is clamped to +-cfg.log_ratio_clamp before
`exp` (the clamp zeroes the gradient where it binds, which only happens for absurd ratios).

Metrics are 0-dim detached tensors averaged over the masked tokens of this call:
clip_frac, clip_frac_low, clip_frac_high, ratio_mean, ratio_max, approx_kl (k3 of
KL(pi_old || pi_theta) from samples of pi_old: (r - 1) - log r), plus dual_clip_frac when set.
ppo_clip and cispo also split PPO's clipped set by token rarity (MiniMax-M1, arXiv 2506.13585
§3.1: the clip drops low-probability "reflection" tokens): clip_frac_rare is the clipped share
among the RARE_QUANTILE of masked tokens with the lowest pi_old probability in this call,
clip_frac_common the share among the rest. Under ppo_clip those tokens lose their gradient; under
cispo the same tokens keep it (only their IS weight is capped).

The value loss of PPO is `compute_value_loss`; the entropy bonus has no function here: the
caller aggregates the entropy with the same `agg_loss` as the policy loss (docs/design.md, correctness rule 7).
"""

from __future__ import annotations

import math

import torch

from tether.algos.base import POLICY_LOSSES, Metrics, PolicyLossFacts, PolicyLossInputs

LINEAR_IN_ADVANTAGE = PolicyLossFacts(zero_at_zero_advantage=True)
from tether.algos.config import PolicyLossConfig


def _where_mask(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(keep_BT, x_BT, torch.zeros_like(x_BT))


def _masked_mean(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    x_BT = x_BT.detach().float()
    n = keep_BT.sum().clamp(min=1)
    return (_where_mask(x_BT, keep_BT).sum() / n).detach()


def _masked_max(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    if not bool(keep_BT.any()):
        return torch.zeros((), device=x_BT.device)
    return x_BT.detach().float()[keep_BT].max()


def _log_ratio_BT(inp: PolicyLossInputs, keep_BT: torch.Tensor, clamp: float) -> torch.Tensor:
    """log(pi_theta / pi_old), 0 off-mask (before exp), clamped to +-clamp."""
    diff_BT = inp.logp_BT - inp.old_logp_BT.detach()
    return _where_mask(diff_BT, keep_BT).clamp(-clamp, clamp)


def _ratio_metrics(ratio_BT: torch.Tensor, log_ratio_BT: torch.Tensor, keep_BT: torch.Tensor) -> Metrics:
    r, lr = ratio_BT.detach(), log_ratio_BT.detach()
    return {
        "ratio_mean": _masked_mean(r, keep_BT),
        "ratio_max": _masked_max(r, keep_BT),
        "approx_kl": _masked_mean((r - 1) - lr, keep_BT),
    }


RARE_QUANTILE = 0.2  # the lowest-probability fifth of a call's tokens counts as "rare"


def _rare_tokens(old_logp_BT: torch.Tensor, keep_BT: torch.Tensor, q: float = RARE_QUANTILE) -> torch.Tensor:
    """[B,T] bool: the ceil(q * n) masked tokens with the lowest pi_old log-prob (ties included)."""
    vals = old_logp_BT.detach().float()[keep_BT]
    if vals.numel() == 0:
        return torch.zeros_like(keep_BT)
    k = max(1, math.ceil(q * vals.numel()))
    cutoff = torch.kthvalue(vals, k).values
    return keep_BT & (old_logp_BT.detach().float() <= cutoff)


def _rarity_clip_metrics(clipped_BT: torch.Tensor, old_logp_BT: torch.Tensor, keep_BT: torch.Tensor) -> Metrics:
    """The clipped share among rare tokens (lowest-probability quantile) and among the rest."""
    rare_BT = _rare_tokens(old_logp_BT, keep_BT)
    return {"clip_frac_rare": _masked_mean(clipped_BT.float(), rare_BT),
            "clip_frac_common": _masked_mean(clipped_BT.float(), keep_BT & ~rare_BT)}


def _clip_metrics(
    ratio_BT: torch.Tensor, adv_BT: torch.Tensor, keep_BT: torch.Tensor, cfg: PolicyLossConfig
) -> Metrics:
    """Fractions of tokens where the clip removes the gradient (TRL's definitions):
    low: r < 1 - eps_low with A < 0; high: r > 1 + eps_high with A > 0."""
    r = ratio_BT.detach()
    low_BT = (r < 1 - cfg.clip_low) & (adv_BT < 0)
    high_BT = (r > 1 + cfg.clip_high) & (adv_BT > 0)
    return {
        "clip_frac": _masked_mean((low_BT | high_BT).float(), keep_BT),
        "clip_frac_low": _masked_mean(low_BT.float(), keep_BT),
        "clip_frac_high": _masked_mean(high_BT.float(), keep_BT),
    }


def _ppo_dropped(ratio_BT: torch.Tensor, adv_BT: torch.Tensor, cfg: PolicyLossConfig) -> torch.Tensor:
    """[B,T] bool: tokens whose gradient PPO's clip removes (r < 1-eps_low, A < 0 or r > 1+eps_high, A > 0)."""
    r = ratio_BT.detach()
    return ((r < 1 - cfg.clip_low) & (adv_BT < 0)) | ((r > 1 + cfg.clip_high) & (adv_BT > 0))


def _clipped_surrogate(
    ratio_BT: torch.Tensor, adv_BT: torch.Tensor, keep_BT: torch.Tensor, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, Metrics]:
    """max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), optionally dual-clipped for A < 0."""
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    metrics: Metrics = {}
    if cfg.dual_clip_c is not None:
        # Dual-clip (Ye et al., arXiv 1912.09729): for A < 0 the loss is capped at -c A, so a
        # huge ratio on a negative-advantage token cannot produce an unbounded update.
        cap_BT = -adv_BT * cfg.dual_clip_c
        dual_BT = (adv_BT < 0) & (cap_BT < loss_BT)
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, cap_BT), loss_BT)
        metrics["dual_clip_frac"] = _masked_mean(dual_BT.float(), keep_BT)
    return _where_mask(loss_BT, keep_BT), metrics


@POLICY_LOSSES.register("ppo_clip", LINEAR_IN_ADVANTAGE)
def compute_ppo_clip_loss(inp: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al., arXiv 1707.06347 §3, Eq. 7), per token.

    Independent clip bounds 1 - clip_low / 1 + clip_high: DAPO clip-higher (arXiv 2503.14476 §3.1,
    eps_high = 0.28). Dual-clip (arXiv 1912.09729) only when cfg.dual_clip_c is set: off by default
    as in OpenRLHF and TRL (verl turns it on with c = 3).
    """
    keep_BT = inp.mask_BT > 0
    adv_BT = _where_mask(inp.advantages_BT.detach(), keep_BT)
    log_ratio_BT = _log_ratio_BT(inp, keep_BT, cfg.log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    loss_BT, metrics = _clipped_surrogate(ratio_BT, adv_BT, keep_BT, cfg)
    metrics.update(_clip_metrics(ratio_BT, adv_BT, keep_BT, cfg))
    metrics.update(_rarity_clip_metrics(_ppo_dropped(ratio_BT, adv_BT, cfg), inp.old_logp_BT, keep_BT))
    metrics.update(_ratio_metrics(ratio_BT, log_ratio_BT, keep_BT))
    return loss_BT, metrics


@POLICY_LOSSES.register("gspo", LINEAR_IN_ADVANTAGE)
def compute_gspo_loss(inp: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al., arXiv 2507.18071 §4), in its GSPO-token form (§4.3).

    s_i = exp((1/|o_i|) sum_t log(pi_theta / pi_old)), and per token
    s_{i,t} = sg(s_i) * pi_theta(o_t) / sg(pi_theta(o_t)): its value is s_i and its gradient
    s_i * grad log pi_theta(o_t), so with a sequence-constant advantage the per-token loss
    max(-A s_{i,t}, -A clip(s_{i,t})) aggregated with `seq_mean_token_mean` has exactly the
    gradient of the paper's sequence objective. Use AggConfig.mode=seq_mean_token_mean to match
    the paper (verl >= 0.9.1 uses the actor's aggregation, default token_mean).
    Clip bounds come from cfg.clip_low / cfg.clip_high; the paper uses 3e-4 / 4e-4 (verl and TRL
    default to 0.2, three orders of magnitude wider). No dual-clip.
    """
    keep_BT = inp.mask_BT > 0
    adv_BT = _where_mask(inp.advantages_BT.detach(), keep_BT)
    log_ratio_BT = _where_mask(inp.logp_BT - inp.old_logp_BT.detach(), keep_BT)
    len_B = keep_BT.sum(dim=-1).clamp(min=1)
    seq_log_ratio_B = (log_ratio_BT.sum(dim=-1) / len_B).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    logp_BT = _where_mask(inp.logp_BT, keep_BT)
    token_log_ratio_BT = seq_log_ratio_B.detach()[:, None] + logp_BT - logp_BT.detach()
    ratio_BT = torch.exp(token_log_ratio_BT)
    loss_BT = torch.maximum(-adv_BT * ratio_BT, -adv_BT * ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high))
    metrics = _clip_metrics(ratio_BT, adv_BT, keep_BT, cfg)
    metrics.update(_ratio_metrics(ratio_BT, seq_log_ratio_B.detach()[:, None].expand_as(ratio_BT), keep_BT))
    return _where_mask(loss_BT, keep_BT), metrics


@POLICY_LOSSES.register("cispo", LINEAR_IN_ADVANTAGE)
def compute_cispo_loss(inp: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv 2506.13585 §3.1): -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi.

    The IS weight is clipped and detached, so every token keeps a gradient (A * w * grad log pi).
    Convention: tether caps at 1 + clip_high and floors at 1 - clip_low, as verl. TRL instead uses
    `epsilon_high` as an ABSOLUTE cap (no 1+, no floor; it recommends 5.0), so "0.28" means a cap
    of 1.28 here and 0.28 in TRL. The paper tunes only the upper bound: set clip_low >= 1 to
    remove the floor. The loss VALUE depends on the absolute log-probs; compare by gradients.
    clip_frac counts tokens whose weight was clipped (either side, any advantage sign).
    """
    keep_BT = inp.mask_BT > 0
    adv_BT = _where_mask(inp.advantages_BT.detach(), keep_BT)
    log_ratio_BT = _log_ratio_BT(inp, keep_BT, cfg.log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT).detach()
    weight_BT = ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_BT = -weight_BT * adv_BT * _where_mask(inp.logp_BT, keep_BT)
    low_BT, high_BT = ratio_BT < 1 - cfg.clip_low, ratio_BT > 1 + cfg.clip_high
    metrics: Metrics = {
        "clip_frac": _masked_mean((low_BT | high_BT).float(), keep_BT),
        "clip_frac_low": _masked_mean(low_BT.float(), keep_BT),
        "clip_frac_high": _masked_mean(high_BT.float(), keep_BT),
    }
    metrics.update(_rarity_clip_metrics(_ppo_dropped(ratio_BT, adv_BT, cfg), inp.old_logp_BT, keep_BT))
    metrics.update(_ratio_metrics(ratio_BT, log_ratio_BT, keep_BT))
    return _where_mask(loss_BT, keep_BT), metrics


def compute_value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip: float,
) -> torch.Tensor:
    """Clipped value loss, per token: 1/2 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2).

    From the OpenAI baselines PPO2 implementation (the PPO paper, arXiv 1707.06347, does not
    state it); eps_v = ValueConfig.clip (0.5 as verl and OpenRLHF). Exactly 0 off-mask; the
    caller aggregates with `agg_loss` (same mode as the actor). All [B,T].
    """
    keep_BT = mask_BT > 0
    v_BT = _where_mask(values_BT, keep_BT)
    old_BT = _where_mask(old_values_BT.detach(), keep_BT)
    ret_BT = _where_mask(returns_BT.detach(), keep_BT)
    v_clipped_BT = old_BT + (v_BT - old_BT).clamp(-clip, clip)
    loss_BT = 0.5 * torch.maximum((v_BT - ret_BT).square(), (v_clipped_BT - ret_BT).square())
    return _where_mask(loss_BT, keep_BT)
