"""A lean training forward for Llama-family models: the decoder layers as one pure function
over the flat tokens of a prefix-shared batch.

transformers' modules build masks, rotary tables and cache objects around every call and run
each element-wise step as its own kernel. For training on a CPU the element-wise passes over
the activations (RMSNorm, rotary, SiLU x up, casts, residual adds, and their backward) cost
about as much as the matmuls at hidden 256 (docs/performance.md). Here the layer stack is one
pure function of (token activations, every layer's weights, rotary tables, attention index
tensors), so that

- every token of the batch is one row of the projections and the MLP, each group's shared
  prefix once and no padding (`SharedLayout`): only attention sees padded rows, gathered per
  attention bucket (a prefix causally over itself; a suffix over its group's prefix keys and
  causally over its own) and scattered back. On the benchmark batch the padded layout ran 3692
  token positions for 3391 tokens;
- it runs eagerly with fewer ops than transformers' forward (no mask/cache objects), and
- `torch.compile` (`train.compile`) can fuse its element-wise work, forward and backward and
  across layer boundaries, into generated C++ kernels; the weights are arguments, not module
  attributes, and the token/row dims are marked dynamic, so one graph serves every batch (the
  compiled path attends the suffixes in one bucket, so the number of buckets never changes).

Used by prefix-shared scoring (tether.policy.prefix), on a CPU; the packed and padded paths
and GPUs use transformers' modules.

The math is transformers' under bf16 autocast: fp32 residual stream, norms and rotary; bf16
projections; attention as bf16 matmuls around an fp32 softmax (tether.policy.attention).
Equality of log-probs and gradients with transformers' forward: tests/unit/policy/test_lean_train.py
and test_prefix_sharing.py.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tether.policy import cpu_gemm, decode
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


def _rope(x: torch.Tensor, cos: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """transformers' x * cos + rotate_half(x) * sin with the halves as a dim of 2: x [.., 2, d/2]
    times cos [.., 1, d/2], plus the halves swapped times sin2 = (-sin, sin) [.., 2, d/2]. The same
    products and sums as transformers' (bit for bit), in two broadcast multiplies over contiguous
    memory instead of four over strided halves."""
    xx = x.unflatten(-1, (2, -1))
    return (xx * cos + xx.flip(-2) * sin2).flatten(-2)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary tables [N, d] (both halves equal) -> `_rope`'s ([N, 1, 1, d/2], [N, 1, 2, d/2])."""
    half = cos.shape[-1] // 2
    c, s = cos[:, None, None, :half].float(), sin[:, None, None, :half].float()
    return c, torch.cat([-s, s], dim=2)


def _attend(q, k, v, keep, groups: int):
    """q [R, heads, Wq, d] (fp32 after the rotary step), k/v [R, kv_heads, Wk, d], keep [R, 1, Wq, Wk]
    -> [R, heads, Wq, d]. bf16 (k/v in bf16): bf16 matmuls around an fp32 softmax (what
    transformers' eager attention does under autocast), above EAGER_MAX_SCORES fp32 SDPA, which
    never holds the score tensor. fp32: SDPA (what transformers' sdpa runs without autocast; on
    the demo's buckets 1.5x faster forward + backward than the matmul-softmax-matmul, docs/performance.md)."""
    kk, vv = _repeat_kv(k, groups), _repeat_kv(v, groups)  # grouped-query attention
    R, H, Wq, d = q.shape
    if kk.dtype != torch.float32 and R * H * Wq * kk.shape[2] <= EAGER_MAX_SCORES:
        scores = torch.matmul(q, kk.transpose(-1, -2)).float() * (d ** -0.5)
        scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
        return torch.matmul(torch.softmax(scores, dim=-1), vv)
    with torch.autocast(q.device.type, enabled=False):
        return F.scaled_dot_product_attention(q.float(), kk.float(), vv.float(), attn_mask=keep).to(vv.dtype)


@torch.library.custom_op("tether::take_rows", mutates_args=())
def take_rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t[idx]: rows of t [N, ...] at idx [R, W] -> [R, W, ...], as an embedding lookup. An opaque
    op, so that torch.compile calls PyTorch's kernels for it and its backward (a dense row
    accumulation) instead of generating a scatter-add loop, which measured ~5 ms per call."""
    return F.embedding(idx, t.reshape(t.shape[0], -1)).view(*idx.shape, *t.shape[1:])


@take_rows.register_fake
def _(t, idx):
    return t.new_empty((*idx.shape, *t.shape[1:]))


@torch.library.custom_op("tether::put_rows", mutates_args=())
def put_rows(grad: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """The backward of `take_rows`: grad [R, W, ...] summed into n rows -> [n, ...]."""
    g = torch.ops.aten.embedding_dense_backward(grad.reshape(*idx.shape, -1), idx, n, -1, False)
    return g.view(n, *grad.shape[idx.dim():])


@put_rows.register_fake
def _(grad, idx, n):
    return grad.new_empty((n, *grad.shape[idx.dim():]))


def _take_setup(ctx, inputs, output):
    t, idx = inputs
    ctx.save_for_backward(idx)
    ctx.n = t.shape[0]


def _take_backward(ctx, grad):
    (idx,) = ctx.saved_tensors
    return put_rows(grad, idx, ctx.n), None


take_rows.register_autograd(_take_backward, setup_context=_take_setup)


def _take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t[idx]; bf16 through `take_rows` (on a CPU a dense accumulation in the backward is several
    times faster than indexing's scatter, eager or compiled)."""
    return take_rows(t, idx) if t.dtype == torch.bfloat16 else t[idx]


def layer_forward(x, ln1, wq, bq, wk, bk, wv, bv, wo, ln2, wg, wu, wd, cos, sin, buckets, inv,
                  heads: int, kv_heads: int, eps1: float, eps2: float, bf16: bool):
    """One decoder layer over the flat tokens. x [N, H] fp32 (every token once, no padding);
    cos/sin: `rope_tables`; `buckets`: attention rows as (q_idx [R, Wq], k_idx [R, Wk], keep
    [R, 1, Wq, Wk]) of flat token indices (N: a padding slot, a zero row); `inv` [N]: where each
    token's query sits in the buckets' concatenated outputs. Projections, norms, rotary and MLP run
    on the N tokens; only attention sees the padded rows."""
    N = x.shape[0]
    lin = F.linear if bf16 else cpu_gemm.linear  # by the flag: traced code must not ask autocast which it is
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        h = rms_norm(x, ln1, eps1)
        q = lin(h, wq, bq).view(N, heads, -1)
        k = lin(h, wk, bk).view(N, kv_heads, -1)
        v = lin(h, wv, bv).view(N, kv_heads, -1)
        q, k = _rope(q.float(), cos, sin), _rope(k.float(), cos, sin)
        if bf16:  # the bf16 the score matmul would round them to, gathered at half the bytes
            q, k = q.to(torch.bfloat16), k.to(torch.bfloat16)
        q, k, v = (torch.cat([t, t.new_zeros((1, *t.shape[1:]))]) for t in (q, k, v))  # row N: padding
        outs = []
        for q_idx, k_idx, keep in buckets:
            o = _attend(_take(q, q_idx).transpose(1, 2), _take(k, k_idx).transpose(1, 2),
                        _take(v, k_idx).transpose(1, 2), keep, heads // kv_heads)
            outs.append(o.transpose(1, 2).reshape(-1, q.shape[1] * q.shape[2]))
        o = _take(torch.cat([*outs, outs[0].new_zeros((1, outs[0].shape[1]))]), inv)
        x = x + lin(o, wo).float()
        h = rms_norm(x, ln2, eps2)
        x = x + lin(F.silu(lin(h, wg)) * lin(h, wu), wd).float()
    return x


def stack_forward(x, weights, cos, sin, buckets, inv, heads: int, kv_heads: int, eps, norm_w, norm_eps: float,
                  bf16: bool):
    """Every decoder layer and the final norm: x [N, H] fp32 -> normed hidden [N, H].
    `weights[i]`: layer i's 12 tensors in `layer_forward`'s order; `eps[i]`: its two norms' epsilons."""
    for w, (e1, e2) in zip(weights, eps):
        x = layer_forward(x, *w, cos, sin, buckets, inv, heads, kv_heads, e1, e2, bf16)
    return rms_norm(x, norm_w, norm_eps)


_COMPILED = {}


def _mark_dynamic(t: torch.Tensor, dims) -> None:
    for dim in dims:
        torch._dynamo.maybe_mark_dynamic(t, dim)


def _compiled_stack():
    """`stack_forward` through torch.compile: one graph for all layers (fusion across layer
    boundaries, one call instead of one per layer), with the token and row dimensions dynamic and
    the weights' static (dynamic=True would make the hidden size symbolic too, and the generated
    element-wise kernels lose their vectorisation: no faster than eager). One graph per number of
    attention buckets: the compiled path is given two (prefixes, suffixes). LeanShared calls it
    with gradients on only (see there)."""
    fn = _COMPILED.get("stack")
    if fn is None:
        compiled = torch.compile(stack_forward, dynamic=None)

        def fn(x, weights, cos, sin, buckets, inv, *rest):
            for t in (x, cos, sin, inv):
                _mark_dynamic(t, (0,))
            for q_idx, k_idx, keep in buckets:
                _mark_dynamic(q_idx, (0, 1))
                _mark_dynamic(k_idx, (0, 1))
                _mark_dynamic(keep, (0, 2, 3))
            return compiled(x, weights, cos, sin, buckets, inv, *rest)

        _COMPILED["stack"] = fn
    return fn


@dataclass
class SharedLayout:
    """Where every token of a prefix-shared batch sits. Flat order: each group's prefix tokens,
    then each sequence's suffix tokens, then spare rows up to N = `padded_rows(tokens)`; index N is
    padding. p_index [G, Pmax] / s_index [B, Smax]: the flat index of prefix token t of group g /
    suffix token t of sequence b; `buckets` and `inv`: as `layer_forward` takes them."""

    ids: torch.Tensor  # [N]
    pos: torch.Tensor  # [N] position in its sequence
    p_index: torch.Tensor
    s_index: torch.Tensor
    buckets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    inv: torch.Tensor  # [N]


def shared_layout(p_ids, p_mask, s_ids, s_mask, row_g, P_B, suffix_buckets, min_extent: int = 1) -> SharedLayout:
    """The flat tokens of (prefixes [G, Pmax], suffixes [B, Smax]), one attention bucket for the
    prefixes (causal within each) and one per suffix bucket (a suffix attends to its group's prefix
    and causally to itself). `min_extent`: buckets of fewer rows, or narrower, are padded to it
    (`_pad_bucket`; outputs unused; `LeanShared.min_extent`)."""
    P_G, S_B = p_mask.sum(-1), s_mask.sum(-1)
    NP = int(P_G.sum())
    n_real = NP + int(S_B.sum())
    N = padded_rows(n_real)
    offP = torch.cumsum(P_G, 0) - P_G
    offS = NP + torch.cumsum(S_B, 0) - S_B
    p_index = torch.where(p_mask.bool(), offP[:, None] + torch.arange(p_mask.shape[1]), N)
    s_index = torch.where(s_mask.bool(), offS[:, None] + torch.arange(s_mask.shape[1]), N)
    flat = lambda x, m: x[m.bool()]  # noqa: E731  (row-major: the flat order above)
    fill = torch.zeros(N - n_real, dtype=torch.long)  # spare rows: token 0 at position 0, attending nowhere
    ids = torch.cat([flat(p_ids, p_mask), flat(s_ids, s_mask), fill.to(p_ids.dtype)])
    pos = torch.cat([flat(torch.arange(p_mask.shape[1]).expand_as(p_mask), p_mask),
                     flat(P_B[:, None] + torch.arange(s_mask.shape[1]), s_mask), fill])
    buckets = [(p_index, p_index, causal_keep(p_mask, p_mask.shape[1])[:, None])]
    for rows in suffix_buckets:
        r = torch.tensor(rows)
        W = int(S_B[r].max())
        k_idx = torch.cat([p_index[row_g[r]], s_index[r, :W]], dim=1)
        key_mask = torch.cat([p_mask[row_g[r]], s_mask[r, :W]], dim=1)
        buckets.append((s_index[r, :W], k_idx, causal_keep(key_mask, W)[:, None]))
    buckets = [_pad_bucket(b, min_extent, N) for b in buckets]
    q_flat = torch.cat([q.reshape(-1) for q, _, _ in buckets])
    real = q_flat < N
    inv = torch.full((N + 1,), len(q_flat), dtype=torch.long)  # spare rows: the zero row after the outputs
    inv[q_flat[real]] = torch.arange(len(q_flat))[real]
    return SharedLayout(ids, pos, p_index, s_index, buckets, inv[:N])


def _pad_bucket(bucket, least: int, N: int):
    """`bucket` with its rows and widths padded up to `least`: the added query and key slots are the
    padding slot N; an added row or query column attends to its row's first key only (never an empty
    softmax, so never NaN). Nothing reads their outputs (`inv`), so no gradient flows from them."""
    q_idx, k_idx, keep = bucket
    (R, Wq), Wk = q_idx.shape, k_idx.shape[1]
    R2, Wq2, Wk2 = max(R, least), max(Wq, least), max(Wk, least)
    if (R2, Wq2, Wk2) == (R, Wq, Wk):
        return bucket
    q = q_idx.new_full((R2, Wq2), N)
    q[:R, :Wq] = q_idx
    k = q  # the prefix bucket's one index tensor stays one (torch.compile guards on the aliasing)
    if k_idx is not q_idx:
        k = k_idx.new_full((R2, Wk2), N)
        k[:R, :Wk] = k_idx
    kept = torch.zeros((R2, keep.shape[1], Wq2, Wk2), dtype=keep.dtype)
    kept[:R, :, :Wq, :Wk] = keep
    kept[R:, :, :, 0] = True
    kept[:, :, Wq:, 0] = True
    return q, k, kept


def padded_rows(n: int) -> int:
    """n tokens rounded up to a multiple of 1/16-1/32 of n (128 at 3000 tokens; <= 6% extra rows).
    oneDNN builds a bf16 matmul kernel for every new shape it sees (measured ~0.45 ms per call at
    [3000, 256] x [256, 688]: ~30 ms per update when every step's token count is new); on this grid
    the shapes of later steps repeat and the kernels are reused."""
    return -(-n // (g := 1 << max(0, n.bit_length() - 5))) * g


class LeanShared:
    """`net(layout)` -> final-normed hidden [N + 1, H] of the flat tokens (row N: zeros, for padding)."""

    def __init__(self, model: torch.nn.Module, bf16: bool, compile: bool = False) -> None:
        cfg, self.inner = model.config, model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.bf16, self.compiled = bf16, compile
        # the smallest rows and widths of an attention bucket (`shared_layout`): torch.compile specialises a
        # dimension of size 1 (a second graph in mid-run when a micro-batch holds one group, or only one-token suffixes)
        self.min_extent = 2 if compile else 1
        self.stack_fn = _compiled_stack() if compile else stack_forward

    def _weights(self, layer) -> tuple:
        a, m = layer.self_attn, layer.mlp
        return (layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, layer.post_attention_layernorm.weight,
                m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)

    def __call__(self, layout: SharedLayout) -> torch.Tensor:
        if self.compiled and not torch.is_grad_enabled():
            # One compiled graph for both grad modes: torch.compile guards on the grad mode (and on
            # whether `x` requires grad), and a second, no-grad graph for the zero-advantage rows of
            # `train.skip_zero_advantage` or the scoring passes cost 15 s of compilation on its first
            # call (small benchmark model, bf16, 2-core CPU, empty inductor cache), no faster per
            # call (benchmarks/archive/zero_adv_skip.py --first-step; benchmarks/results/zero_adv_first_step.json).
            # The activations the grad graph keeps are freed with its detached output.
            with torch.enable_grad():
                return self._forward(layout).detach()
        return self._forward(layout)

    def _forward(self, layout: SharedLayout) -> torch.Tensor:
        dev = self.inner.embed_tokens.weight.device
        x = self.inner.embed_tokens(layout.ids.to(dev)).float()
        cos, sin = rope_tables(*(t[0] for t in self.inner.rotary_emb(x, layout.pos.to(dev)[None])))
        layers = self.inner.layers
        weights = tuple(self._weights(layer) for layer in layers)
        eps = tuple((layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
                    for layer in layers)
        buckets = [tuple(t.to(dev) for t in b) for b in layout.buckets]
        norm = self.inner.norm
        args = (x, weights, cos, sin, buckets, layout.inv.to(dev), self.heads, self.kv_heads, eps,
                norm.weight, norm.variance_epsilon, self.bf16)
        if self.compiled and "failed" not in _COMPILED:
            try:
                h = self.stack_fn(*args)
            except Exception as e:  # a compiler failure must not end the run: the same math, eager
                _COMPILED["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
                warnings.warn(f"train.compile: compiling the training forward failed ({_COMPILED['failed']}); "
                              "this process trains eagerly from now on", stacklevel=2)
                h = stack_forward(*args)
        else:
            h = stack_forward(*args)
        return torch.cat([h, h.new_zeros((1, h.shape[1]))])


def causal_keep(key_mask_BK: torch.Tensor, S: int) -> torch.Tensor:
    """[B, S, K] bool: query s (the last S of the K key positions) sees key j when j is not padding
    and j <= its own position."""
    K = key_mask_BK.shape[1]
    q = torch.arange(K - S, K, device=key_mask_BK.device)[:, None]
    j = torch.arange(K, device=key_mask_BK.device)[None]
    return (j <= q)[None] & key_mask_BK.bool()[:, None, :]
