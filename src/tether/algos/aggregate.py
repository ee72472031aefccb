"""Loss aggregation: the ONE place where a per-token loss becomes a scalar (docs/design.md, correctness rule 7).

Policy-gradient, KL and entropy terms all go through `agg_loss`, so they are normalised the same
way (docs/design.md, correctness rule 7; trl#2995: KL normalised differently from the PG term).

The denominators are GLOBAL: `compute_agg_norm` is called once on the whole mini-batch (the
set of sequences that makes one optimizer step) and the same `AggNorm` is passed to every
micro-batch. Every mode is then a sum of per-sequence terms divided by a constant, so

    sum_k agg_loss(loss[mb_k], mask[mb_k], mode, norm) == agg_loss(loss, mask, mode, norm)

for any split into micro-batches: gradient accumulation and micro-batch size never change the
gradient (trl#2617, verl legacy dp_actor per-micro-batch means). Under data parallelism, pass
the all-reduced counts (sum of num_tokens / num_seqs over ranks) and divide nothing else.

Modes (each with the arXiv id and section of the paper whose objective it reproduces):

    token_mean            sum_{i,t} l m / sum_{i,t} m                DAPO arXiv 2503.14476 §3.3
    seq_mean_token_mean   (1/B) sum_i (sum_t l m / L_i)              GRPO arXiv 2402.03300 §4.1
    seq_mean_token_sum    (1/B) sum_i sum_t l m                      (verl option)
    constant_norm         sum_{i,t} l m / (B * L_max)                Dr. GRPO arXiv 2503.20783 §3.2

Masks are applied with `torch.where`, never by multiplying alone: a NaN/inf loss at a padded
position would otherwise give NaN (0 * inf) in the value and the gradient (docs/design.md, correctness rule 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tether.algos.base import AGG_MODES


@dataclass(frozen=True)
class AggNorm:
    """Global denominators of one mini-batch.

    num_tokens: sum of the loss mask over the whole mini-batch (token count for a {0,1} mask)
    num_seqs:   number of sequences with at least one mask token (empty sequences do not count)
    max_len:    the constant L_max of `constant_norm` (Dr. GRPO generation budget)
    """

    num_tokens: float
    num_seqs: float
    max_len: int


def compute_agg_norm(mask_BT: torch.Tensor, max_len: int | None = None) -> AggNorm:
    """Global denominators of a mini-batch (docs/design.md, correctness rule 7).

    mask_BT: [B,T] loss mask of the WHOLE mini-batch (before any micro-batch split).
    max_len: L_max for `constant_norm`; pass a constant (AggConfig.max_len, default the
        generation budget max_new_tokens). None falls back to T, the padded length of this
        mini-batch, which is not constant across steps (verl's default; less faithful to Dr. GRPO).
    """
    if mask_BT.dim() != 2:
        raise ValueError(f"mask_BT must be [B,T], got shape {tuple(mask_BT.shape)}")
    num_tokens = float(mask_BT.sum().item())
    num_seqs = float((mask_BT > 0).any(dim=-1).sum().item())
    return AggNorm(num_tokens=num_tokens, num_seqs=num_seqs, max_len=int(max_len or mask_BT.shape[-1]))


def _safe(denominator: float) -> float:
    # An all-masked mini-batch has a zero numerator; dividing by 1 keeps the loss an exact 0
    # (and finite) instead of 0/0 = NaN.
    return denominator if denominator > 0 else 1.0


def _masked_BT(loss_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """loss * mask where mask > 0, exactly 0 elsewhere (NaN/inf there never leak, in value or grad)."""
    # The product is NaN where loss is NaN and mask 0, but `where` never selects it, and its
    # backward sends 0 * mask = 0 there.
    return torch.where(mask_BT > 0, loss_BT * mask_BT, torch.zeros_like(loss_BT))


@AGG_MODES.register("token_mean")
def agg_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, norm: AggNorm) -> torch.Tensor:
    """sum_{i,t} l m / num_tokens — DAPO token-level loss (arXiv 2503.14476 §3.3)."""
    return _masked_BT(loss_BT, mask_BT).sum() / _safe(norm.num_tokens)


@AGG_MODES.register("seq_mean_token_mean")
def agg_seq_mean_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, norm: AggNorm) -> torch.Tensor:
    """(1/num_seqs) sum_i (1/L_i) sum_t l m — the GRPO paper objective (arXiv 2402.03300 §4.1).

    L_i is the sequence's own mask sum, which lies entirely inside one micro-batch (sequences are
    never split), so only num_seqs needs to be global. Empty sequences contribute 0.
    """
    seq_sum_B = _masked_BT(loss_BT, mask_BT).sum(dim=-1)
    len_B = mask_BT.sum(dim=-1)
    nonempty_B = len_B > 0
    per_seq_B = torch.where(nonempty_B, seq_sum_B / torch.where(nonempty_B, len_B, 1.0), 0.0)
    return per_seq_B.sum() / _safe(norm.num_seqs)


@AGG_MODES.register("seq_mean_token_sum")
def agg_seq_mean_token_sum(loss_BT: torch.Tensor, mask_BT: torch.Tensor, norm: AggNorm) -> torch.Tensor:
    """(1/num_seqs) sum_{i,t} l m — sequence mean of token sums (verl `seq-mean-token-sum`)."""
    return _masked_BT(loss_BT, mask_BT).sum() / _safe(norm.num_seqs)


@AGG_MODES.register("constant_norm")
def agg_constant_norm(loss_BT: torch.Tensor, mask_BT: torch.Tensor, norm: AggNorm) -> torch.Tensor:
    """sum_{i,t} l m / (num_seqs * L_max) — Dr. GRPO (arXiv 2503.20783 §3.2), no 1/|o_i| bias.

    Convention: this follows TRL `loss_type="dr_grpo"` and verl >= 0.9.1
    `seq-mean-token-sum-norm`, which both divide by B * L_max (a mean over sequences of token
    sums scaled by a constant). Older verl divided by L only (no 1/B), making the loss B times
    larger; tether does not follow that.
    """
    return _masked_BT(loss_BT, mask_BT).sum() / _safe(norm.num_seqs * norm.max_len)


def agg_loss(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, norm: AggNorm) -> torch.Tensor:
    """Aggregate a per-token loss [B,T] into a scalar with the mini-batch's global `norm`.

    mode: one of AGG_MODES (token_mean | seq_mean_token_mean | seq_mean_token_sum |
    constant_norm); a misspelled name raises with the valid names listed.
    Summing the results over micro-batches (all given the same `norm`) equals the full-batch value.
    """
    if loss_BT.shape != mask_BT.shape:
        raise ValueError(f"loss_BT {tuple(loss_BT.shape)} and mask_BT {tuple(mask_BT.shape)} differ")
    return AGG_MODES[mode](loss_BT, mask_BT, norm)
