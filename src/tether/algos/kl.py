"""KL estimators, the adaptive KL controller, and KL-in-reward.

    KL_ESTIMATORS[name](KLInputs, KLConfig) -> kl_BT

Estimators of KL(pi_theta || pi_ref) per token (Schulman, "Approximating KL divergence",
joschu.net/blog/kl-approx.html), with log rho = log pi_ref - log pi_theta:

    k1 = -log rho                 unbiased value, high variance, can be negative
    k2 = 1/2 (log rho)^2          low variance, biased
    k3 = rho - 1 - log rho        unbiased value, low variance, >= 0 (GRPO, arXiv 2402.03300 §4.1)
    k3_iw = w * k3, w = pi_theta / pi_old NOT detached: unbiased value AND gradient of
            KL(pi_theta || pi_ref) under samples from pi_old (DeepSeek-V3.2, arXiv 2512.02556 §3)

Gradient caveat: with samples fixed, E[grad k3] is the gradient of the FORWARD KL(pi_ref||pi_theta),
E[grad k2] that of KL(pi_theta||pi_ref), and k1 as a loss has zero expected gradient on-policy;
k3_iw fixes k3's bias (docs/design.md, correctness rule 23, verl PR#2953).

Numerics (docs/design.md, correctness rule 5): masked positions are replaced with 0 via `torch.where` before
`exp`, and the log-ratio is clamped to +-cfg.clamp (default 20) before `exp`. Where the clamp
binds, the gradient through that term is ZERO (clamp has no gradient outside its range); verl's
low_var_kl additionally clamps k3 to <= 10, which tether does not. kl_BT is exactly 0 off-mask.
The estimators never run under no_grad: a KL loss with beta > 0 always has a gradient
(SkyRL PR#1353).
"""

from __future__ import annotations

from typing import Any

import torch

from tether.algos.base import KL_ESTIMATORS, KLInputs
from tether.algos.config import KLConfig


def _where_mask(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(keep_BT, x_BT, torch.zeros_like(x_BT))


def _log_rho_BT(inp: KLInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """log(pi_ref / pi_theta), 0 off-mask (not clamped), and the keep mask."""
    keep_BT = inp.mask_BT > 0
    return _where_mask(inp.ref_logp_BT.detach() - inp.logp_BT, keep_BT), keep_BT


def _k3_BT(log_rho_BT: torch.Tensor, clamp: float) -> torch.Tensor:
    log_rho_BT = log_rho_BT.clamp(-clamp, clamp)
    return torch.exp(log_rho_BT) - 1 - log_rho_BT


@KL_ESTIMATORS.register("k1")
def compute_kl_k1(inp: KLInputs, cfg: KLConfig) -> torch.Tensor:
    """k1 = log pi_theta - log pi_ref (Schulman 2020). Default for KL-in-reward (verl, OpenRLHF)."""
    log_rho_BT, keep_BT = _log_rho_BT(inp)
    return _where_mask(-log_rho_BT, keep_BT)


@KL_ESTIMATORS.register("k2")
def compute_kl_k2(inp: KLInputs, cfg: KLConfig) -> torch.Tensor:
    """k2 = 1/2 (log pi_theta - log pi_ref)^2 (Schulman 2020); its gradient is that of KL(pi_theta||pi_ref)."""
    log_rho_BT, keep_BT = _log_rho_BT(inp)
    return _where_mask(0.5 * log_rho_BT.square(), keep_BT)


@KL_ESTIMATORS.register("k3")
def compute_kl_k3(inp: KLInputs, cfg: KLConfig) -> torch.Tensor:
    """k3 = rho - 1 - log rho, rho = pi_ref / pi_theta (GRPO's KL, arXiv 2402.03300 §4.1).

    The log-ratio is clamped to +-cfg.clamp before exp; the gradient is zero where it binds.
    """
    log_rho_BT, keep_BT = _log_rho_BT(inp)
    return _where_mask(_k3_BT(log_rho_BT, cfg.clamp), keep_BT)


@KL_ESTIMATORS.register("k3_iw")
def compute_kl_k3_iw(inp: KLInputs, cfg: KLConfig) -> torch.Tensor:
    """Importance-weighted k3 (DeepSeek-V3.2, arXiv 2512.02556 §3 "Unbiased KL Estimate").

    w * k3 with w = pi_theta / pi_old = exp(logp - old_logp), NOT detached: the gradient flows
    through both w and k3, so E_{pi_old}[w k3] is KL(pi_theta || pi_ref) in value and gradient.
    Per-token w, also when a sequence-level ratio is used elsewhere (TRL then uses the sequence
    ratio). Both log-ratios are clamped to +-cfg.clamp before exp.
    """
    log_rho_BT, keep_BT = _log_rho_BT(inp)
    log_w_BT = _where_mask(inp.logp_BT - inp.old_logp_BT.detach(), keep_BT).clamp(-cfg.clamp, cfg.clamp)
    return _where_mask(torch.exp(log_w_BT) * _k3_BT(log_rho_BT, cfg.clamp), keep_BT)


def compute_kl_in_reward(
    token_rewards_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    estimator: str = "k1",
    clamp: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL as a reward penalty (Ziegler et al., arXiv 1909.08593 §2.2; REINFORCE++ arXiv 2501.03262).

    r_t <- r_t - coef * KL_t on masked tokens, KL from the sampling policy's log-probs (old_logp)
    against the reference, with the named estimator (default k1, as verl and OpenRLHF).
    Off-mask rewards are returned unchanged (estimators ignore them). Computed without gradient.
    Returns (token_rewards_BT, kl_BT); kl_BT is exactly 0 off-mask, for logging.
    """
    with torch.no_grad():
        inp = KLInputs(logp_BT=old_logp_BT, ref_logp_BT=ref_logp_BT, old_logp_BT=old_logp_BT, mask_BT=mask_BT)
        kl_BT = KL_ESTIMATORS[estimator](inp, KLConfig(estimator=estimator, clamp=clamp))
        penalised_BT = torch.where(mask_BT > 0, token_rewards_BT - coef * kl_BT, token_rewards_BT)
    return penalised_BT, kl_BT


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., arXiv 1909.08593 §2.2).

    e = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon).
    The only stateful piece of the algorithm library; `state_dict` goes into checkpoints.
    Defaults in peers: verl target 0.1, horizon 10000, initial beta 0.001.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target > 0 and horizon > 0, got {target}, {horizon}")
        self.coef = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, kl: float, n_steps: int) -> float:
        """Update beta from the observed KL over `n_steps` samples (or steps); returns the new beta."""
        error = min(max(float(kl) / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
        return self.coef

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])
        self.target = float(state["target"])
        self.horizon = int(state["horizon"])
