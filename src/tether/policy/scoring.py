"""The transformers backend's scorer: chunked log-prob / entropy of given tokens.

Scoring runs the backbone once and applies the LM head in chunks of positions, with activation
checkpointing per chunk when gradients are needed, so the B x T x V logits never exist at once
(pitfall 13: SkyRL PR#1610, trl PR#4013). The LM head runs in fp32 whatever autocast says, here
and in the sampler (fp32_head_logits).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tether.policy import cpu_gemm
from tether.policy.base import HFPolicy


def count_trained(policy: HFPolicy, positions: int) -> None:
    """Add `positions` (rows x width a backbone call ran) to the policy's counter when gradients
    are on: the update's hardware work, after packing, prefix sharing and padding."""
    if torch.is_grad_enabled():
        policy.trained_positions += int(positions)


def _backbone_and_head(model: torch.nn.Module):
    head = model.get_output_embeddings()
    if head is not None and (head._forward_hooks or head._forward_pre_hooks):
        # refused, not skipped: the head runs from its weight (fp32_head_logits), a hook on it would do nothing
        raise TypeError(f"{type(model).__name__}: forward hooks on the LM head are not run (tether applies the "
                        "head in fp32 from its weight, tether.policy.scoring.fp32_head_logits); hook the final "
                        "norm or a decoder layer instead")
    backbone = getattr(model, model.base_model_prefix, None) if hasattr(model, "base_model_prefix") else None
    if backbone is None or backbone is model:
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or backbone is None:
        raise TypeError(f"{type(model).__name__}: cannot find backbone and LM head for chunked scoring")
    return backbone, head


def fp32_head_logits(h_BH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                     softcap: float | None, packed: bool = False) -> torch.Tensor:
    """The LM head in fp32 whatever autocast says (ScaleRL: FP32 logits matter). The trainer's
    scorer and the sampler both use this, so the log-probs the sampler records and the ones the
    trainer recomputes differ only by the backbone's own rounding. On a CPU through oneDNN
    (tether.policy.cpu_gemm.linear); `packed`: an fp32 weight from `cpu_gemm.pack` (the decoder's)."""
    with torch.autocast(h_BH.device.type, enabled=False):
        b = None if bias_V is None else bias_V.float()
        logits = (cpu_gemm.packed_linear(h_BH.float(), weight_VH, b) if packed
                  else cpu_gemm.linear(h_BH.float(), weight_VH.float(), b))
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def apply_sampling_mask(logits_BTV: torch.Tensor, kept_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """The distribution the sampler drew from (DeepSeek-V3.2, arXiv 2512.02556, "Keep Sampling
    Mask"): at each position with kept count k > 0 only the k highest logits stay, so a softmax
    renormalises over the truncated set; k = 0 keeps the full vocabulary. The sampled target is
    never masked (a logit that moved across the boundary between two forwards costs a little
    mass, not an infinite log-ratio)."""
    k_max = int(kept_BT.max())
    if k_max <= 0:
        return logits_BTV
    k_max = min(k_max, logits_BTV.shape[-1])
    top = torch.topk(logits_BTV.detach(), k_max, dim=-1).values  # [B, T, k_max]
    thr = top.gather(-1, (kept_BT.clamp(1, k_max) - 1)[..., None])  # the k-th largest logit
    drop = (logits_BTV.detach() < thr) & (kept_BT > 0)[..., None]
    drop = drop.scatter(-1, targets_BT[..., None], False)
    return logits_BTV.masked_fill(drop, float("-inf"))


def _chunk_logp_entropy(h_BCH, weight_VH, bias_V, targets_BC, inv_temp: float, softcap: float | None, with_entropy: bool,
                        kept_BC=None):
    logits = fp32_head_logits(h_BCH, weight_VH, bias_V, softcap) * inv_temp
    if kept_BC is not None:  # score under the truncated distribution the sampler drew from
        logits = apply_sampling_mask(logits, kept_BC, targets_BC)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets_BC[..., None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    if kept_BC is None:
        return logp, lse - (logits.softmax(-1) * logits).sum(-1)
    probs = logits.softmax(-1)
    return logp, lse - (probs * logits.masked_fill(probs == 0, 0.0)).sum(-1)  # 0 * -inf = 0 where masked


def compute_logprobs(
    policy: HFPolicy,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 256,
    pack: bool = False,
    kept_BT: torch.Tensor | None = None,
    needed_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (and entropies) of `input_ids_BT` under the policy at `temperature`
    (and under the sampler's truncation where `kept_BT`, aligned with the ids, is > 0); where
    `needed_BT` (aligned with the ids) is False, 0 without the LM head's work.

    Returns logp_BT, entropy_BT: [B,T]; entry t scores token t given tokens < t; column 0 is 0.
    Sequences are right-padded (positions are 0..L-1 for real tokens). Gradients flow when
    enabled by the caller; each chunk of positions is checkpointed so only hidden states are kept.
    `pack`: run the backbone on packed rows (tether.policy.packing) when the model supports it.
    """
    model = policy.model
    ids = input_ids_BT.to(policy.device)
    hidden = compute_hidden(policy, ids, attention_mask_BT, pack)
    kept = None if kept_BT is None else kept_BT[:, 1:].to(ids.device)
    need = None if needed_BT is None else needed_BT[:, 1:].bool()
    lp, ent = compute_head_logprobs(model, hidden[:, :-1], ids[:, 1:], temperature, with_entropy, chunk_size, kept, need)
    zero = torch.zeros((ids.shape[0], 1), dtype=torch.float32, device=ids.device)
    return torch.cat([zero, lp], dim=1), torch.cat([zero, ent], dim=1)


def compute_hidden(policy: HFPolicy, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                   pack: bool = False) -> torch.Tensor:
    """The backbone's last hidden states [B, T, H] of right-padded rows (positions 0..L-1 for real
    tokens), counted in `policy.trained_positions` under grad; `pack`: packed rows where supported."""
    from tether.policy.packing import run_packed_backbone, supports_packing

    backbone, _ = _backbone_and_head(policy.model)
    ids = input_ids_BT.to(policy.device)
    am = attention_mask_BT.to(policy.device).long()
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    hidden = None
    with torch.autocast(policy.device.type, dtype=torch.bfloat16, enabled=policy.autocast_bf16):
        if pack and supports_packing(policy.model):
            hidden = run_packed_backbone(backbone, ids, am.sum(-1).tolist(), policy.pad_id)
        if hidden is None:  # no cache: transformers would otherwise copy every layer's keys/values into one
            hidden = backbone(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).last_hidden_state
    count_trained(policy, hidden.shape[0] * hidden.shape[1])
    return hidden


def compute_head_logprobs(model, h_BTH: torch.Tensor, targets_BT: torch.Tensor, temperature: float = 1.0,
                          with_entropy: bool = False, chunk_size: int = 256,
                          kept_BT: torch.Tensor | None = None,
                          needed_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets_BT[:, t] | h_BTH[:, t]) and entropies via the LM head, in chunks of positions
    (checkpointed under grad), so the B x T x V logits never exist at once. `needed_BT` (bool):
    only those positions go through the head (a loss mask: prompts, tool outputs and padding need
    none); the others come back 0."""
    if needed_BT is not None and not bool(needed_BT.all()):
        return _needed_only(model, h_BTH, targets_BT, temperature, with_entropy, chunk_size, kept_BT, needed_BT)
    _, head = _backbone_and_head(model)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    weight, bias = head.weight, getattr(head, "bias", None)
    lps, ents = [], []
    for s in range(0, h_BTH.shape[1], chunk_size):
        args = (h_BTH[:, s:s + chunk_size], weight, bias, targets_BT[:, s:s + chunk_size], 1.0 / temperature, softcap, with_entropy,
                None if kept_BT is None else kept_BT[:, s:s + chunk_size])
        if torch.is_grad_enabled() and h_BTH.shape[1] > chunk_size:
            lp, en = checkpoint(_chunk_logp_entropy, *args, use_reentrant=False)
        else:
            lp, en = _chunk_logp_entropy(*args)
        lps.append(lp)
        ents.append(en)
    if not lps:
        empty = h_BTH.new_zeros(h_BTH.shape[:2], dtype=torch.float32)
        return empty, empty
    return torch.cat(lps, dim=1), torch.cat(ents, dim=1)


def _needed_only(model, h_BTH, targets_BT, temperature, with_entropy, chunk_size, kept_BT, needed_BT):
    """`compute_head_logprobs` on the needed positions as one row of M positions (chunks of as many
    positions as a chunk of B rows holds), scattered back into zeros [B, T]."""
    idx = needed_BT.to(h_BTH.device).nonzero(as_tuple=True)
    B, T = targets_BT.shape
    out = h_BTH.new_zeros((B, T), dtype=torch.float32), h_BTH.new_zeros((B, T), dtype=torch.float32)
    if len(idx[0]) == 0:
        return out
    lp, ent = compute_head_logprobs(model, h_BTH[idx][None], targets_BT.to(h_BTH.device)[idx][None], temperature,
                                    with_entropy, chunk_size * B, None if kept_BT is None else kept_BT[idx][None])
    return out[0].index_put(idx, lp[0].float()), out[1].index_put(idx, ent[0].float())
