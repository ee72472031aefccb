"""Attention for bf16 autocast on CPU: fp32 softmax, bf16 matmuls, never the bf16 flash kernel.

Under CPU autocast, `scaled_dot_product_attention` runs PyTorch's bf16 flash kernel, which is
2-4x slower (forward + backward) than the same attention computed as two bf16 matmuls around an
fp32 softmax, and slower even than the fp32 kernel (measured on the 2-core machine, B=64, T=80:
171 ms vs 62 ms per layer for 4 heads; 326 ms vs 91 ms for 8). `tether_attention` is registered
with transformers' AttentionInterface under the name "tether_sdpa" (with sdpa's mask function):

- short sequences (the B x heads x T x T score tensor under `EAGER_MAX_SCORES`): explicit
  matmul-softmax-matmul (what transformers' `eager` does under autocast);
- longer ones: the SDPA kernel in fp32 (memory-efficient, still faster than its bf16 version);
- no autocast, a GPU, or a single query (decoding): transformers' own sdpa, unchanged.

`use_fast_cpu_attention(model)` switches a model to it; the math is the same attention, so only
rounding differs (tests/unit/policy/test_fast_paths.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "tether_sdpa"
EAGER_MAX_SCORES = 1 << 24  # fp32 elements of B x heads x Tq x Tk (64 MB) before falling back to fp32 SDPA
_registered = False


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def tether_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention signature: q/k/v [B, heads, T, d] -> ([B, T, heads, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dev = query.device.type
    if dev != "cpu" or not torch.is_autocast_enabled(dev) or query.shape[2] == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    B, H, Tq, d = query.shape
    Tk = key.shape[2]
    scale = scaling if scaling is not None else d ** -0.5
    if attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        attention_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril(Tk - Tq)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2  # additive -> keep-mask
    drop = dropout if module.training else 0.0
    if B * H * Tq * Tk <= EAGER_MAX_SCORES:
        scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale  # bf16 matmul, fp32 scores
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
        probs = F.dropout(torch.softmax(scores, dim=-1), p=drop, training=drop > 0)
        out = torch.matmul(probs, value)  # autocast: bf16 matmul
    else:
        with torch.autocast(dev, enabled=False):
            out = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=attention_mask,
                                                 dropout_p=drop, scale=scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, tether_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    _registered = True


def use_fast_cpu_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model from "sdpa" to "tether_sdpa"; False (unchanged) when it cannot."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    try:
        register()
        model.set_attn_implementation(NAME)
    except (ImportError, ValueError, TypeError, AttributeError):
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
