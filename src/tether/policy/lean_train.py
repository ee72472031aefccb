"""A lean training forward for Llama-family models: the decoder layers as one pure function.

transformers' modules build masks, rotary tables and cache objects around every call and run
each element-wise step as its own kernel. For training on a CPU the element-wise passes over
the activations (RMSNorm, rotary, SiLU x up, casts, residual adds, and their backward) cost
about as much as the matmuls at hidden 256 (docs/performance.md). Here the layer stack is one
pure function of (activations, every layer's weights, rotary tables, a key mask, an optional
prefix KV), so that

- it runs eagerly with fewer ops than transformers' forward (no mask/cache objects), and
- `torch.compile` (`train.compile`) can fuse its element-wise work, forward and backward and
  across layer boundaries, into generated C++ kernels; the weights are arguments, not module
  attributes, and the batch/sequence dims are marked dynamic, so one graph serves every batch
  shape (two in all: with and without a prefix KV).

Used by prefix-shared scoring (tether.policy.prefix), on a CPU; the packed and padded paths
and GPUs use transformers' modules.

The math is transformers' under bf16 autocast: fp32 residual stream, norms and rotary; bf16
projections; attention as bf16 matmuls around an fp32 softmax (tether.policy.attention).
Equality of log-probs and gradients with transformers' forward: tests/unit/policy/test_lean_train.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tether.policy import decode
from tether.policy.attention import EAGER_MAX_SCORES, _repeat_kv
from tether.policy.decode import rms_norm
from tether.policy.hf import is_checkpointing


def supports(model: torch.nn.Module, device: torch.device | str = "cpu") -> bool:
    """Plain Llama-family decoders on a CPU: the ones the lean decode step reproduces exactly,
    with plain `nn.Linear` projections (no adapters or quantised layers), no attention dropout and
    no gradient checkpointing (this forward would silently skip either). On a GPU transformers'
    SDPA kernels are the better path."""
    if torch.device(device).type != "cpu" or not decode.supports(model):
        return False
    cfg = model.config
    if getattr(cfg, "attention_dropout", 0.0) or is_checkpointing(model):
        return False
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if any(type(x) is not torch.nn.Linear for x in linears) or a.o_proj.bias is not None:
            return False
        if any(getattr(x, "bias", None) is not None for x in (m.gate_proj, m.up_proj, m.down_proj)):
            return False
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(not hasattr(n, "variance_epsilon") or set(dict(n.named_parameters())) != {"weight"} for n in norms):
            return False
    return True


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' x * cos + rotate_half(x) * sin, with cos/sin given for one half ([.., d/2]):
    both halves of transformers' tables are the same."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def layer_forward(x, ln1, wq, bq, wk, bk, wv, bv, wo, ln2, wg, wu, wd, cos, sin, keep, past_k, past_v,
                  heads: int, kv_heads: int, eps1: float, eps2: float, bf16: bool):
    """One decoder layer. x [B, S, H] fp32; cos/sin [B, 1, S, d/2]; keep [B, 1, S, P + S] (bool:
    which keys each query sees); past_k/past_v [B, kv_heads, P, d] or None. Returns the new x and
    this layer's keys/values over all P + S positions (for the suffixes that share this prefix)."""
    B, S, _ = x.shape
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        h = rms_norm(x, ln1, eps1)
        q = F.linear(h, wq, bq).view(B, S, heads, -1).transpose(1, 2)
        k = F.linear(h, wk, bk).view(B, S, kv_heads, -1).transpose(1, 2)
        v = F.linear(h, wv, bv).view(B, S, kv_heads, -1).transpose(1, 2)
        q, k = _rope(q.float(), cos, sin), _rope(k.float(), cos, sin)
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        d = q.shape[-1]
        kk, vv = _repeat_kv(k, heads // kv_heads), _repeat_kv(v, heads // kv_heads)  # grouped-query attention
        if B * heads * S * kk.shape[2] <= EAGER_MAX_SCORES:
            scores = torch.matmul(q, kk.transpose(-1, -2)).float() * (d ** -0.5)
            scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
            o = torch.matmul(torch.softmax(scores, dim=-1), vv)
        else:  # long sequences: fp32 SDPA, which never holds the whole score tensor
            with torch.autocast(x.device.type, enabled=False):
                o = F.scaled_dot_product_attention(q.float(), kk.float(), vv.float(), attn_mask=keep).to(vv.dtype)
        o = o.transpose(1, 2).reshape(B, S, heads * d)
        x = x + F.linear(o, wo).float()
        h = rms_norm(x, ln2, eps2)
        x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd).float()
    return x, k, v


def stack_forward(x, weights, cos, sin, keep, past_k, past_v, heads: int, kv_heads: int, eps, norm_w, norm_eps: float,
                  bf16: bool):
    """Every decoder layer and the final norm: x [B, S, H] fp32 -> (normed hidden, keys, values per
    layer). `weights[i]`: layer i's 12 tensors in `layer_forward`'s order; `eps[i]`: its two norms'
    epsilons; past_k/past_v: per-layer prefix keys/values, or None."""
    keys, values = [], []
    for i, (w, (e1, e2)) in enumerate(zip(weights, eps)):
        pk = None if past_k is None else past_k[i]
        pv = None if past_v is None else past_v[i]
        x, k, v = layer_forward(x, *w, cos, sin, keep, pk, pv, heads, kv_heads, e1, e2, bf16)
        keys.append(k)
        values.append(v)
    return rms_norm(x, norm_w, norm_eps), keys, values


_COMPILED = {}


def _mark_dynamic(t: torch.Tensor | None) -> None:
    """Batch and sequence dims (and a mask's key dim) dynamic; the hidden/head dims stay static."""
    if isinstance(t, torch.Tensor):
        for dim in (0, t.dim() - 2, t.dim() - 1) if t.dtype == torch.bool else (0, t.dim() - 2):
            torch._dynamo.maybe_mark_dynamic(t, dim)


def _compiled_stack():
    """`stack_forward` through torch.compile: one graph for all layers (fusion across layer
    boundaries, one call instead of one per layer), with the batch and sequence dimensions of the
    activations dynamic and the weights' static (dynamic=True would make the hidden size symbolic
    too, and the generated element-wise kernels lose their vectorisation: no faster than eager)."""
    fn = _COMPILED.get("stack")
    if fn is None:
        compiled = torch.compile(stack_forward, dynamic=None)

        def fn(x, weights, cos, sin, keep, past_k, past_v, *rest):
            for t in (x, cos, sin, keep, *(past_k or ()), *(past_v or ())):
                _mark_dynamic(t)
            return compiled(x, weights, cos, sin, keep, past_k, past_v, *rest)

        _COMPILED["stack"] = fn
    return fn


@dataclass
class PrefixKV:
    """Per-layer keys/values of a prefix forward: lists of [G, kv_heads, P, d]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def select(self, idx: torch.Tensor) -> "PrefixKV":
        return PrefixKV([k[idx] for k in self.keys], [v[idx] for v in self.values])


class LeanBackbone:
    """`backbone(ids, positions, keep, past)` -> (final-normed hidden [B, S, H], PrefixKV)."""

    def __init__(self, model: torch.nn.Module, bf16: bool, compile: bool = False) -> None:
        cfg, self.inner = model.config, model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.bf16 = bf16
        self.stack_fn = _compiled_stack() if compile else stack_forward

    def _weights(self, layer) -> tuple:
        a, m = layer.self_attn, layer.mlp
        return (layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, layer.post_attention_layernorm.weight,
                m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)

    def rotary(self, pos_BS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.inner.rotary_emb(torch.zeros((), dtype=torch.float32, device=pos_BS.device), pos_BS)
        half = cos.shape[-1] // 2
        return cos[:, None, :, :half].float(), sin[:, None, :, :half].float()

    def __call__(self, ids_BS: torch.Tensor, pos_BS: torch.Tensor, keep_BSK: torch.Tensor,
                 past: PrefixKV | None = None) -> tuple[torch.Tensor, PrefixKV]:
        x = self.inner.embed_tokens(ids_BS).float()
        cos, sin = self.rotary(pos_BS)
        layers = self.inner.layers
        weights = tuple(self._weights(layer) for layer in layers)
        eps = tuple((layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
                    for layer in layers)
        norm = self.inner.norm
        h, keys, values = self.stack_fn(x, weights, cos, sin, keep_BSK[:, None], None if past is None else past.keys,
                                        None if past is None else past.values, self.heads, self.kv_heads, eps,
                                        norm.weight, norm.variance_epsilon, self.bf16)
        return h, PrefixKV(list(keys), list(values))


def causal_keep(key_mask_BK: torch.Tensor, S: int) -> torch.Tensor:
    """[B, S, K] bool: query s (the last S of the K key positions) sees key j when j is not padding
    and j <= its own position."""
    K = key_mask_BK.shape[1]
    q = torch.arange(K - S, K, device=key_mask_BK.device)[:, None]
    j = torch.arange(K, device=key_mask_BK.device)[None]
    return (j <= q)[None] & key_mask_BK.bool()[:, None, :]
