"""Off-policy corrections and sample filters.

- IS_CORRECTIONS[mode](ISInputs, ISCorrectionConfig) -> (weights_BT, metrics): truncated (TIS)
  or masked (MIS) importance weights pi_old / mu for the rollout-engine / trainer mismatch.
- compute_mismatch_metrics: rollout/trainer log-prob gap diagnostics (docs/design.md, correctness rule 3).
- compute_off_policy_mask: DeepSeek-V3.2 off-policy sequence masking (arXiv 2512.02556 §3, Eq. 9).
- GROUP_FILTERS / select_groups: DAPO dynamic sampling (arXiv 2503.14476 §3.2) on RAW outcomes.
- compute_stop_reason_weights: compact filtering per stop reason (DeepSWE vs Golubev et al.).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tether.algos.base import GROUP_FILTERS, IS_CORRECTIONS, ISInputs, Metrics
from tether.algos.config import DynamicSamplingConfig, ISCorrectionConfig

# |log ratio| clamp before exp: exp(20) ~ 4.9e8 is finite in float32, and any weight
# that large is truncated or masked anyway.
LOG_RATIO_CLAMP = 20.0


def _where_mask(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(keep_BT, x_BT, torch.zeros_like(x_BT))


def _masked_mean(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return (_where_mask(x_BT.float(), keep_BT).sum() / keep_BT.sum().clamp(min=1)).detach()


def _raw_weights_BT(inp: ISInputs, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached pi_old / mu per token, or exp(sum_t log ratio) broadcast per sequence; 0 off-mask."""
    keep_BT = inp.mask_BT > 0
    log_ratio_BT = _where_mask((inp.old_logp_BT - inp.rollout_logp_BT).detach().float(), keep_BT)
    if level == "token":
        log_w_BT = log_ratio_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    elif level == "sequence":
        log_w_B = log_ratio_BT.sum(dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_w_BT = log_w_B[:, None].expand_as(log_ratio_BT)
    else:
        raise ValueError(f"IS correction level must be 'token' or 'sequence', got {level!r}")
    return _where_mask(torch.exp(log_w_BT), keep_BT), keep_BT


@IS_CORRECTIONS.register("none")
def compute_is_none(inp: ISInputs, cfg: ISCorrectionConfig) -> tuple[torch.Tensor, Metrics]:
    """No correction: weight 1 on masked tokens (0 off-mask). Metrics still report the raw mean weight."""
    w_BT, keep_BT = _raw_weights_BT(inp, cfg.level)
    return keep_BT.to(w_BT.dtype), {"is_weight_mean": _masked_mean(w_BT, keep_BT)}


@IS_CORRECTIONS.register("truncate")
def compute_is_truncate(inp: ISInputs, cfg: ISCorrectionConfig) -> tuple[torch.Tensor, Metrics]:
    """Truncated IS (TIS; Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy
    RL Training", 2025): w = min(pi_old / mu, threshold_high), detached; multiplies the policy loss.

    Upper truncation only, as the TIS post and verl (`rollout_is_threshold` 2.0); OpenRLHF clamps
    both sides to [0.5, 5]. Sequence level: w = exp(sum_t log ratio) per sequence (clamped log).
    is_weight_mean is the mean truncated weight over masked tokens; is_trunc_frac the fraction of
    masked tokens whose weight was truncated (token-weighted also at sequence level).
    """
    w_BT, keep_BT = _raw_weights_BT(inp, cfg.level)
    truncated_BT = keep_BT & (w_BT > cfg.threshold_high)
    out_BT = _where_mask(w_BT.clamp(max=cfg.threshold_high), keep_BT)
    return out_BT, {
        "is_weight_mean": _masked_mean(out_BT, keep_BT),
        "is_trunc_frac": _masked_mean(truncated_BT.float(), keep_BT),
    }


@IS_CORRECTIONS.register("mask")
def compute_is_mask(inp: ISInputs, cfg: ISCorrectionConfig) -> tuple[torch.Tensor, Metrics]:
    """Masked IS (MIS / IcePop; TRL `token_mask` / `sequence_mask`): w * 1[low <= w <= high].

    Convention: the kept tokens keep their importance weight (w, not 1), as TRL's sequence_mask and
    IcePop; weights outside [threshold_low, threshold_high] become 0. threshold_low None means no
    lower bound. is_mask_frac: fraction of masked tokens zeroed (token-weighted).
    """
    w_BT, keep_BT = _raw_weights_BT(inp, cfg.level)
    low = cfg.threshold_low if cfg.threshold_low is not None else 0.0
    inside_BT = (w_BT >= low) & (w_BT <= cfg.threshold_high)
    out_BT = _where_mask(w_BT, keep_BT & inside_BT)
    return out_BT, {
        "is_weight_mean": _masked_mean(out_BT, keep_BT),
        "is_mask_frac": _masked_mean((~inside_BT).float(), keep_BT),
    }


def compute_mismatch_metrics(
    old_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> Metrics:
    """Rollout-engine vs trainer diagnostics (verl docs/algo/rollout_corr_math.md §4; docs/design.md,
    correctness rule 3).

    logp_gap_mean / logp_gap_max: mean and max |log pi_old - log mu| over masked tokens.
    logp_gap_signed: mean of log mu - log pi_old (the k1 estimate of KL(mu || pi_old), >= 0 in
    expectation): ~0 when the two differ by numerics only, ~logp_gap_mean when mu favours the
    tokens it sampled on every token (a top-k/top-p filter, a lower temperature).
    rollout_kl_k3: k3 estimate of KL(mu || pi_old) from samples of mu: rho - 1 - log rho, rho = pi_old/mu.
    ess: normalised effective sample size of the sequence weights w_i = exp(sum_t log rho),
    (sum w)^2 / (n sum w^2) in (0, 1] over non-empty sequences (1 = no mismatch), computed from
    log-weights with softmax so it cannot overflow.
    """
    keep_BT = mask_BT > 0
    log_rho_BT = _where_mask((old_logp_BT - rollout_logp_BT).detach().double(), keep_BT)
    gap_BT = log_rho_BT.abs()
    rho_BT = torch.exp(log_rho_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    nonempty_B = keep_BT.any(dim=-1)
    if bool(nonempty_B.any()):
        probs = torch.softmax(log_rho_BT.sum(dim=-1)[nonempty_B], dim=0)
        ess = 1.0 / (probs.numel() * probs.square().sum())
    else:
        ess = torch.ones_like(gap_BT.sum())
    gap_max = gap_BT[keep_BT].max() if bool(keep_BT.any()) else torch.zeros_like(gap_BT.sum())
    return {
        "logp_gap_mean": _masked_mean(gap_BT, keep_BT),
        "logp_gap_signed": _masked_mean(-log_rho_BT, keep_BT),
        "logp_gap_max": gap_max.float(),
        "rollout_kl_k3": _masked_mean(rho_BT - 1 - log_rho_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), keep_BT),
        "ess": ess.float(),
    }


def compute_off_policy_mask(
    rollout_logp_BT: torch.Tensor,
    logp_BT_detached: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    delta: float,
) -> torch.Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556 §3, Eq. 9).

    M_{i,t} = 0 if A_{i,t} < 0 and (1/|o_i|) sum_t log(mu(o_t) / pi_theta(o_t)) > delta, else 1;
    mu is the sampling (rollout) policy, so the mask covers staleness and engine mismatch.
    Negative-advantage sequences that drifted far are dropped; positive ones are always kept.
    Returns mask_BT * M (same dtype as mask_BT); delta = ISCorrectionConfig.off_policy_mask_delta.
    """
    keep_BT = mask_BT > 0
    diff_BT = _where_mask((rollout_logp_BT - logp_BT_detached).detach().double(), keep_BT)
    mean_B = diff_BT.sum(dim=-1) / keep_BT.sum(dim=-1).clamp(min=1)
    drop_BT = (advantages_BT.detach() < 0) & (mean_B > delta)[:, None]
    return torch.where(drop_BT, torch.zeros_like(mask_BT), mask_BT)


# ----------------------------------------------------------------------------- dynamic sampling


@GROUP_FILTERS.register("zero_variance")
def keep_nonzero_variance(outcomes_G: Sequence[float], cfg: DynamicSamplingConfig) -> bool:
    """DAPO dynamic sampling (arXiv 2503.14476 §3.2): keep a group iff max - min > cfg.tol.

    Judge RAW outcomes (verified correctness or the raw reward), never the shaped reward: with
    length shaping an all-wrong group gets spread-out rewards, survives the filter and gives short
    or empty answers a positive advantage (NeMo-RL#2431). Non-finite outcomes (failed rewards)
    are ignored; fewer than two finite outcomes -> dropped. The tolerance replaces exact
    `std == 0` float comparisons.
    """
    finite = [float(x) for x in outcomes_G if math.isfinite(float(x))]
    if len(finite) < 2:
        return False
    return max(finite) - min(finite) > cfg.tol


def select_groups(
    outcomes_per_group: Sequence[Sequence[float]], cfg: DynamicSamplingConfig, name: str = "zero_variance"
) -> tuple[list[int], Metrics]:
    """Indices of the groups to train on, and metrics (DAPO arXiv 2503.14476 §3.2).

    With cfg.enable False every group is kept, but frac_zero_variance is still reported (a
    step where most groups carry no signal should be visible; docs/design.md, correctness rule 8).
    Metrics: frac_zero_variance (fraction the filter rejects), num_groups, num_kept.
    """
    verdicts = [GROUP_FILTERS[name](outcomes, cfg) for outcomes in outcomes_per_group]
    keep_idx = [i for i, ok in enumerate(verdicts) if ok or not cfg.enable]
    n = len(verdicts)
    return keep_idx, {
        "frac_zero_variance": torch.tensor((n - sum(verdicts)) / n if n else 0.0),
        "num_groups": torch.tensor(float(n)),
        "num_kept": torch.tensor(float(len(keep_idx))),
    }


# ----------------------------------------------------------------------------- compact filtering

STOP_REASON_POLICIES = ("mask", "keep", "zero")


def compute_stop_reason_weights(
    stop_reasons: Sequence[str], policy: dict[str, str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact filtering per stop reason (DeepSWE, together.ai/blog/deepswe; Golubev et al.).

    policy maps a stop reason ("length", "timeout", "max_turns", "context_overflow", ...) to
      "mask": loss weight 0 — the trajectory leaves the loss (DeepSWE compact filtering: a
               truncated agent run is not evidence that its actions were bad);
      "keep": as is — the truncated run is a negative sample (Golubev et al.: masking over-long
               looping trajectories removes the negatives the model needs to learn to escape loops);
      "zero": keep in the loss but override its reward to 0.
    Reasons not in `policy` are kept. The trade-off is per reason, hence a dict, not a flag.
    Returns loss_weight_B (float {0,1}, multiply into the loss mask; group statistics still see
    the trajectory unless the caller also clears valid_B) and reward_override_B (bool: True where
    the caller must replace the reward by 0).
    """
    bad = {k: v for k, v in policy.items() if v not in STOP_REASON_POLICIES}
    if bad:
        raise ValueError(f"unknown stop-reason policy {bad}; valid: {', '.join(STOP_REASON_POLICIES)}")
    # StopReason is a str enum whose hash differs from its value's: compare by value.
    actions = [policy.get(str(getattr(r, "value", r)), "keep") for r in stop_reasons]
    loss_weight_B = torch.tensor([0.0 if a == "mask" else 1.0 for a in actions])
    reward_override_B = torch.tensor([a == "zero" for a in actions], dtype=torch.bool)
    return loss_weight_B, reward_override_B
