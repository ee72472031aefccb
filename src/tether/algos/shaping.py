"""Reward shaping: pure functions that turn lengths and outcomes into reward terms.

Shaped terms are ADDED to the reward by the caller; dynamic-sampling filters must keep judging
the raw outcome (see corrections.keep_nonzero_variance; NeMo-RL#2431).
"""

from __future__ import annotations

import torch


def compute_overlong_penalty(
    lengths_B: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al., arXiv 2503.14476 §3.4), [B] -> [B].

    With L_exp = max_len - cache_len:
        0                          if |y| <= L_exp
        (L_exp - |y|) / cache_len  if L_exp < |y| <= max_len     (linear from 0 to -1)
        -1                         if |y| > max_len              (the paper's floor)
    all times `factor` (verl `penalty_factor`). verl's DAPO reward manager has no -1 floor; it
    never matters there because generation stops at max_len, but tether follows the paper.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    expected = max_len - cache_len
    ramp_B = (expected - lengths_B.to(torch.float32)) / cache_len
    return factor * ramp_B.clamp(min=-1.0, max=0.0)


def compute_length_reward(lengths_G: torch.Tensor, correct_G: torch.Tensor) -> torch.Tensor:
    """Kimi k1.5 length reward (arXiv 2501.12599 §2.3.3) over the samples of one problem, [G] -> [G].

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len); reward = lambda_i if correct,
    min(0, lambda_i) if wrong (short wrong answers are not rewarded); all 0 if all lengths are
    equal. The caller weights it (ShapingConfig.length_penalty_coef) and adds it to the reward,
    after a warm-up without it as in the paper.
    """
    lengths = lengths_G.to(torch.float64)
    if lengths.numel() == 0 or bool(lengths.max() == lengths.min()):
        return torch.zeros(lengths_G.shape, dtype=torch.float32)
    lo, hi = lengths.min(), lengths.max()
    lam_G = 0.5 - (lengths - lo) / (hi - lo)
    reward_G = torch.where(correct_G.bool(), lam_G, lam_G.clamp(max=0.0))
    return reward_G.to(torch.float32)


def compute_gamma_decayed_rewards(outcome: float, num_steps: int, gamma: float) -> torch.Tensor:
    """Gamma-decayed step rewards (Kimi-Researcher, moonshotai.github.io/Kimi-Researcher, "RL training").

    Step i in 1..T gets r * gamma^(T - i): the last step gets r, earlier steps less, so a short
    successful trajectory collects more total reward than a long one. Returns [T] (float32).
    """
    if num_steps < 0 or not 0 < gamma <= 1:
        raise ValueError(f"need num_steps >= 0 and 0 < gamma <= 1, got {num_steps}, {gamma}")
    exponents = torch.arange(num_steps - 1, -1, -1, dtype=torch.float64)
    return (outcome * gamma**exponents).to(torch.float32)
