"""Sequence packing for scoring and training: several sequences per row, no padding compute.

A right-padded [B, T] batch wastes the padding's share of every matmul. Packing places whole
sequences end to end in rows of the same width T (first-fit decreasing), restarts the position
ids at every sequence, and lets transformers build the block-diagonal causal mask from those
position ids (attention_mask=None, no cache: its packed-sequence path), so no token attends
across a boundary. The hidden states are gathered back into the [B, T] layout, so the caller's
log-prob, entropy and loss code is unchanged; padding positions get zero vectors.

Rows stay T wide, so attention cost per row is unchanged; only the number of rows drops. Tested
against the unpacked path (log-probs and gradients) in tests/unit/policy/test_packing.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackPlan:
    """Where each sequence goes: rows of sequence indices and each token's flat packed index."""

    rows: list[list[int]]
    width: int
    ids_RT: torch.Tensor  # packed token ids
    pos_RT: torch.Tensor  # position ids, restarting at every sequence (and at the padding tail)
    index_BT: torch.Tensor  # flat index into [R * width + 1] (the last entry: a zero vector for padding)


def compute_pack_rows(lengths_B: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: rows of sequence indices whose lengths sum to at most `width`."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths_B)), key=lambda i: -lengths_B[i]):
        L = lengths_B[i]
        for r, f in enumerate(free):
            if L <= f:
                rows[r].append(i)
                free[r] -= L
                break
        else:
            rows.append([i])
            free.append(width - L)
    return rows


def compute_pack_plan(ids_BT: torch.Tensor, lengths_B: list[int], pad_id: int) -> PackPlan:
    B, T = ids_BT.shape
    rows = compute_pack_rows(lengths_B, T)
    R = len(rows)
    ids = torch.full((R, T), pad_id, dtype=ids_BT.dtype)
    pos = torch.zeros((R, T), dtype=torch.long)
    index = torch.full((B, T), R * T, dtype=torch.long)  # -> the zero vector
    ar = torch.arange(T)
    src = ids_BT.cpu()
    for r, seqs in enumerate(rows):
        off = 0
        for b in seqs:
            L = lengths_B[b]
            ids[r, off:off + L] = src[b, :L]
            pos[r, off:off + L] = ar[:L]
            index[b, :L] = r * T + off + ar[:L]
            off += L
        pos[r, off:] = ar[: T - off]  # the padding tail is a sequence of its own
    dev = ids_BT.device
    return PackPlan(rows, T, ids.to(dev), pos.to(dev), index.to(dev))


def run_packed_backbone(backbone: torch.nn.Module, ids_BT: torch.Tensor, lengths_B: list[int], pad_id: int) -> torch.Tensor | None:
    """Hidden states [B, T, H] computed on packed rows; None when packing saves no row."""
    plan = compute_pack_plan(ids_BT, lengths_B, pad_id)
    if len(plan.rows) >= ids_BT.shape[0]:
        return None
    hidden = backbone(input_ids=plan.ids_RT, attention_mask=None, position_ids=plan.pos_RT, use_cache=False).last_hidden_state
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat = torch.cat([flat, flat.new_zeros((1, flat.shape[-1]))])
    return flat[plan.index_BT]


_PACKABLE = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3", "olmo2")


def supports_packing(model: torch.nn.Module) -> bool:
    """Models whose transformers forward builds its mask with `create_causal_mask` (which turns
    restarting position ids into a block-diagonal mask); anything else is never packed."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in _PACKABLE and not getattr(cfg, "use_sliding_window", False)
