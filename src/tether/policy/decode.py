"""A lean decode step for Llama-family models: fewer ops and no per-token Python overhead.

On a CPU, one decode step of a small model through transformers' modules costs ~400 aten calls
(mask construction, rotary tables, cache objects, module hooks) around a few small matmuls; the
calls, not the FLOPs, set the speed (docs/performance.md, "The sampler"). `LeanDecoder` runs the same
math with the model's own weights in about a third of the calls:

- q/k/v and gate/up projections fused into one matmul each (weights concatenated once per
  generation call, so they are never stale after an optimizer step);
- rotary cos/sin computed once for every position by the model's own rotary module and indexed;
- a KV cache written in place, kept contiguous and attended over whole: it starts a little longer
  than the prompt and doubles when full (the positions not yet written are zeros under a -inf
  bias). Batched matmuls over a slice of a longer buffer copy the slice first; over the whole
  buffer they do not (bf16 attention of the benchmark's small model at 60 of 84 positions:
  0.86 ms as a slice vs 0.37 ms for all 84, machine of 2026-12-02);
- grouped-query attention without repeating keys (queries are grouped instead);
- with bf16 autocast: bf16 weight copies made once per call (under inference mode autocast
  re-casts every weight at every token) and a bf16 KV cache; the step runs with autocast off and
  sets each op's precision itself: the projections and the two attention matmuls in bf16 (what
  autocast and the trainer's attention, tether.policy.attention, do), the residual stream, norms,
  rotary and softmax in fp32, and the LM head in fp32 as the trainer scores (scoring.fp32_head_logits).
  Until 2026-12-02 the step ran inside autocast: the LM head ran in bf16 (the sampler's log-probs
  then differed from the trainer's fp32-head ones) and autocast re-cast the whole fp32 cache to
  bf16 at every token (a third of the decode time on the benchmark's small model).

The prompt (prefill) still runs through transformers, once per distinct prompt (GRPO's n samples
of a prompt share its keys and values: `load_prefill(rows=...)`), and its preallocated buffers become
the decoder's cache where they fit (`_adopt`: no copy); only the per-token step is replaced. Models
it does not recognise exactly (`supports` is strict) use transformers' forward: no silent drift.
Tests: tests/unit/policy/test_fast_paths.py (logits equal to transformers' forward at every step).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from tether.policy import cpu_gemm
from tether.policy.scoring import fp32_head_logits

_FAMILIES = ("llama", "qwen2", "mistral")


def has_forward_hooks(model: torch.nn.Module) -> bool:
    """Whether module forward hooks (a fault's, a user's probe) sit on `model` or any submodule, or
    globally: the lean paths read raw weights and would skip them, so they step aside (logged once)."""
    from torch.nn.modules import module as nn_module

    hooked = bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks) or any(
        m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    if hooked and not getattr(model, "_tether_hooks_warned", False):
        warnings.warn("module forward hooks on the model: the lean training/decoding paths are off for it "
                      "(transformers' forward runs the hooks)", stacklevel=3)
        try:
            model._tether_hooks_warned = True
        except AttributeError:
            pass
    return hooked


def supports(model: torch.nn.Module) -> bool:
    """True when `model` is a plain Llama-family decoder this module reproduces exactly, with no
    module forward hooks (`has_forward_hooks`: the lean step would bypass them)."""
    if has_forward_hooks(model):
        return False
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _FAMILIES:
        return False
    rope = getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type != "default" or getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)):
        return False
    if getattr(cfg, "mlp_bias", False) or getattr(cfg, "final_logit_softcapping", None):
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return False
    attn, mlp = layers[0].self_attn, layers[0].mlp
    expected = {"q_proj", "k_proj", "v_proj", "o_proj"}
    extra = {n for n, _ in attn.named_children()} - expected
    if extra or not {n for n, _ in mlp.named_children()} >= {"gate_proj", "up_proj", "down_proj"}:
        return False
    # plain nn.Linear projections only: a LoRA layer (peft) exposes its base weight as `.weight`, so
    # reading raw weights would silently decode with the adapters left out
    projections = [getattr(attn, n) for n in sorted(expected)] + [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return all(type(x) is torch.nn.Linear for x in projections)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm on an fp32 input, bit for bit, as PyTorch's fused kernel
    (forward+backward at [3200, 256]: 4.7 ms vs 8.6 ms for the five separate ops)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


class LeanDecoder:
    """Decode steps of `model` for `batch` rows, up to `capacity` positions (prompt included)."""

    GROW = 32  # the first window's room past the prompt, and the rounding of every window

    def __init__(self, model: torch.nn.Module, batch: int, capacity: int, bf16: bool, compiled: bool = False) -> None:
        cfg, inner = model.config, model.model
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.compiled = compiled  # the step through torch.compile (`rollout.compile`): see compiled_step
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.embed = inner.embed_tokens.weight
        self.norm_w, self.eps = inner.norm.weight, inner.norm.variance_epsilon
        dev = self.embed.device
        # the projections' weights laid out once for oneDNN (tether.policy.cpu_gemm): ~25% faster
        # matmuls at a few dozen rows than re-laying them out at every token
        self.packed = dev.type == "cpu" and cpu_gemm.can_pack(self.dtype)
        self.rows = batch
        head_b = getattr(model.lm_head, "bias", None)
        self.head_w = cpu_gemm.pack(model.lm_head.weight.detach().float(), batch) if self.packed else model.lm_head.weight
        self.head_b = None if head_b is None else head_b.detach().float() if self.packed else head_b
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.layers = [self._pack(layer) for layer in inner.layers]
        d, kvh = self.head_dim, self.kv_heads
        # the cache in the attention matmuls' precision: no per-token cast of the whole cache
        self.batch, self.capacity, self.window = batch, capacity, 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._bias: torch.Tensor | None = None  # [B, window]: the padding bias, -inf past the length
        pos = torch.arange(capacity, device=dev)[None]
        cos, sin = inner.rotary_emb(torch.zeros((), dtype=torch.float32, device=dev), pos)
        half = d // 2
        sign = torch.cat([-torch.ones(half, device=dev), torch.ones(d - half, device=dev)])
        self.cos, self.sin = cos[0].float(), (sin[0] * sign).float()  # [capacity, d], fp32 as in transformers
        self.length = 0

    def _cast(self, w: torch.Tensor | None) -> torch.Tensor | None:
        return None if w is None else w.detach().to(self.dtype)

    def _pack_w(self, w: torch.Tensor) -> torch.Tensor:
        """A projection's weight in the decode precision, packed for oneDNN when `self.packed`."""
        w = self._cast(w)
        return cpu_gemm.pack(w, self.rows) if self.packed else w

    def _lin(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return cpu_gemm.packed_linear(x, w, b) if self.packed else F.linear(x, w, b)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return fp32_head_logits(h, self.head_w, self.head_b, self.softcap, packed=self.packed)

    def _pack(self, layer) -> dict:
        a, m = layer.self_attn, layer.mlp
        qkv_b = None
        if a.q_proj.bias is not None:
            qkv_b = self._cast(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        return {
            "ln1": layer.input_layernorm.weight, "eps1": layer.input_layernorm.variance_epsilon,
            "qkv": self._pack_w(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])), "qkv_b": qkv_b,
            "o": self._pack_w(a.o_proj.weight), "o_b": self._cast(a.o_proj.bias),
            "ln2": layer.post_attention_layernorm.weight, "eps2": layer.post_attention_layernorm.variance_epsilon,
            "gate_up": self._pack_w(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
            "down": self._pack_w(m.down_proj.weight),
        }

    def _grow(self, need: int) -> None:
        """Make the window hold `need` positions: round up to GROW, at least double, at most capacity."""
        size = min(self.capacity, max(2 * self.window, -(-need // self.GROW) * self.GROW))
        if size < need:
            raise ValueError(f"decode past the cache's capacity of {self.capacity} positions")
        dev, n = self.embed.device, self.length
        shape = (self.batch, self.kv_heads, size, self.head_dim)
        for cache in (self.k, self.v):
            for i in range(len(self.layers)):
                new = torch.empty(shape, dtype=self.dtype, device=dev)
                new[:, :, n:].zero_()  # only what is not copied (a zero fill of the whole was 5% of a small model's generation)
                if i < len(cache):
                    new[:, :, :n] = cache[i][:, :, :n]
                    cache[i] = new
                else:
                    cache.append(new)
        self.window, self._bias = size, None

    def load_prefill(self, cache, rows: torch.Tensor | None = None) -> None:
        """Copy the prompt's keys/values from transformers' cache (after the prefill forward);
        `rows`: the cache row of each decoded row (a shared prefill), else one row each."""
        n = cache.layers[0].keys.shape[-2]
        if self._adopt(cache, n, rows):
            return
        self._grow(min(self.capacity, n + self.GROW))
        for i, layer in enumerate(cache.layers):
            self.k[i][:, :, :n] = layer.keys if rows is None else layer.keys[rows]
            self.v[i][:, :, :n] = layer.values if rows is None else layer.values[rows]
        self.length = n


    def _adopt(self, cache, n: int, rows: torch.Tensor | None) -> bool:
        """Take transformers' preallocated buffers over as this decoder's cache when they fit (this
        precision, contiguous, room past the prompt): no copy of the prompt's keys/values, or with
        `rows` one gather of them (instead of a gather, then a copy into a window)."""
        bufs = [(getattr(layer, "_k", None), getattr(layer, "_v", None)) for layer in cache.layers]
        if len(bufs) != len(self.layers) or not all(
                k is not None and v is not None and k.dtype == v.dtype == self.dtype and k.shape == v.shape
                and (rows is not None or k.shape[0] == self.batch) and n < k.shape[2] <= self.capacity
                and k.is_contiguous() and v.is_contiguous() for k, v in bufs):
            return False
        if rows is None:
            self.k, self.v = [k for k, _ in bufs], [v for _, v in bufs]
        else:
            self.k, self.v = [k.index_select(0, rows) for k, _ in bufs], [v.index_select(0, rows) for _, v in bufs]
        for t in (*self.k, *self.v):
            t[:, :, n:].zero_()  # never written: zeros under the -inf bias (uninitialised memory may hold NaN)
        self.window, self.length, self._bias = int(self.k[0].shape[2]), n, None
        return True

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every row not in `rows` (indices into the current batch, in order): the cache, the
        padding bias and the batch shrink, so that finished rows cost nothing in later steps."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        if self._bias is not None:
            self._bias = self._bias.index_select(0, rows)
        self.batch = int(rows.shape[0])

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        swapped = x.view(*x.shape[:-1], 2, d // 2).flip(-2).reshape(x.shape)  # [x2, x1]; the sign is in `sin`
        return x * cos + swapped * sin

    @torch.inference_mode()
    def step(self, tok_B: torch.Tensor, pos_B: torch.Tensor, key_bias_BL: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] (fp32) for one new token per row at positions `pos_B`; `key_bias_BL` is the
        additive fp32 mask over the cached positions (0, or -inf for padding).

        Numerics follow the trainer under autocast: the residual stream, norms, rotary and softmax
        in fp32; the projections and the attention matmuls in `self.dtype`; the LM head in fp32."""
        B, n, dt = tok_B.shape[0], self.length, self.dtype
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        if n + 1 > self.window:
            self._grow(n + 1)
        if self._bias is None:  # the padding bias over the window, -inf where nothing is written yet
            self._bias = key_bias_BL[:, : self.window].clone()
            self._bias[:, n:] = float("-inf")
        if self.compiled and B > 1:  # one row: eagerly, as torch.compile would specialise a batch of 1 (a second
            return self._compiled_step(tok_B, pos_B, key_bias_BL)  # graph compiled in mid-run for one row's tail)
        self._bias[:, n] = key_bias_BL[:, n]
        with torch.autocast(tok_B.device.type, enabled=False):
            x = F.embedding(tok_B, self.embed)  # [B, H] fp32
            cos, sin = self.cos[pos_B][:, None], self.sin[pos_B][:, None]  # [B, 1, d]
            bias = self._bias[:, None, None]  # [B, 1, 1, window]
            for i, p in enumerate(self.layers):
                qkv = self._lin(rms_norm(x, p["ln1"], p["eps1"]).to(dt), p["qkv"], p["qkv_b"]).view(B, h + 2 * kvh, d)
                qk = self._rope(qkv[:, : h + kvh].float(), cos, sin).to(dt)
                self.k[i][:, :, n] = qk[:, h:]
                self.v[i][:, :, n] = qkv[:, h + kvh:]
                q = qk[:, :h].reshape(B, kvh, h // kvh, d)  # grouped queries share their key head
                scores = torch.matmul(q, self.k[i].transpose(-1, -2)) * self.scale + bias
                att = torch.softmax(scores, dim=-1).to(dt)
                o = torch.matmul(att, self.v[i]).reshape(B, h * d)
                x = x + self._lin(o, p["o"], p["o_b"]).float()
                gu = self._lin(rms_norm(x, p["ln2"], p["eps2"]).to(dt), p["gate_up"], None)
                g, u = gu.chunk(2, dim=-1)
                x = x + self._lin(F.silu(g) * u, p["down"], None).float()
            self.length = n + 1
            return self._head(rms_norm(x, self.norm_w, self.eps))


    def _compiled_step(self, tok_B: torch.Tensor, pos_B: torch.Tensor, key_bias_BL: torch.Tensor) -> torch.Tensor:
        """`step` through torch.compile: the new token attends to the cache (position n still under
        -inf) and to its own key separately, and its keys/values are written after the call, so the
        compiled function mutates nothing. Batch and window dimensions are dynamic: one graph for
        every step, row drop and cache growth."""
        n = self.length
        x = F.embedding(tok_B, self.embed)
        cos, sin = self.cos[pos_B][:, None], self.sin[pos_B][:, None]
        bias = self._bias[:, None, None]
        for t in (x, cos, sin, bias, *self.k, *self.v):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        for t in (*self.k, *self.v):
            torch._dynamo.maybe_mark_dynamic(t, 2)
        torch._dynamo.maybe_mark_dynamic(bias, 3)
        layers = tuple((p["ln1"], p["eps1"], p["qkv"], p["qkv_b"], p["o"], p["o_b"], p["ln2"], p["eps2"],
                        p["gate_up"], p["down"]) for p in self.layers)
        args = (x, cos, sin, bias, tuple(self.k), tuple(self.v), layers, (self.norm_w, self.eps),
                (self.head_w, self.head_b, self.softcap), (self.heads, self.kv_heads, self.head_dim, self.scale, self.packed))
        with torch.autocast(tok_B.device.type, enabled=False):
            try:
                logits, new_k, new_v = compiled_step()(*args)
            except Exception as e:  # a compiler failure must not end the run: the same math, eager
                _COMPILED["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
                warnings.warn(f"rollout.compile: compiling the decode step failed ({_COMPILED['failed']}); "
                              "this process decodes eagerly from now on", stacklevel=2)
                self.compiled = False
                logits, new_k, new_v = step_math(*args)
        for i in range(len(self.layers)):
            self.k[i][:, :, n] = new_k[i]
            self.v[i][:, :, n] = new_v[i]
        self._bias[:, n] = key_bias_BL[:, n]
        self.length = n + 1
        return logits


def step_math(x, cos, sin, bias, ks, vs, layers, norm, head, shape):
    """One decode step as a pure function (what `compiled_step` compiles): (fp32 logits [B, V], each
    layer's new keys and values [B, kv_heads, d]). `bias` [B, 1, 1, W] is -inf at the new token's own
    position, which is attended through its key directly. The same precision per op as
    `LeanDecoder.step`; under compilation the fused element-wise kernels round differently (bf16:
    log-probs within a few 1e-3 of the eager step's; tests/unit/policy/test_fast_paths.py)."""
    h, kvh, d, scale, packed = shape
    lin = cpu_gemm.packed_linear if packed else F.linear  # packed: the weights came through cpu_gemm.pack
    B, W = x.shape[0], ks[0].shape[2]
    new_k, new_v = [], []
    for K, V, (ln1, eps1, qkv_w, qkv_b, o_w, o_b, ln2, eps2, gu_w, down_w) in zip(ks, vs, layers):
        dt = K.dtype
        qkv = lin(rms_norm(x, ln1, eps1).to(dt), qkv_w, qkv_b).view(B, h + 2 * kvh, d)
        xq = qkv[:, : h + kvh].float()
        swapped = xq.view(B, h + kvh, 2, d // 2).flip(-2).reshape(xq.shape)
        qk = (xq * cos + swapped * sin).to(dt)
        q = qk[:, :h].reshape(B, kvh, h // kvh, d)
        k_new, v_new = qk[:, h:], qkv[:, h + kvh:]
        s_cache = torch.matmul(q, K.transpose(-1, -2)) * scale + bias  # [B, kvh, g, W]
        s_self = ((q * k_new[:, :, None]).sum(-1, keepdim=True) * scale).float()  # [B, kvh, g, 1]
        att = torch.softmax(torch.cat([s_cache, s_self], -1), dim=-1).to(dt)
        o = torch.matmul(att[..., :W], V).float() + att[..., W:].float() * v_new[:, :, None].float()
        x = x + lin(o.to(dt).reshape(B, h * d), o_w, o_b).float()
        g, u = lin(rms_norm(x, ln2, eps2).to(dt), gu_w, None).chunk(2, dim=-1)
        x = x + lin(F.silu(g) * u, down_w, None).float()
        new_k.append(k_new)
        new_v.append(v_new)
    return fp32_head_logits(rms_norm(x, *norm), *head, packed=packed), new_k, new_v


_COMPILED: dict = {}


def compiled_step():
    """`step_math` through torch.compile (inductor), made once per process: the element-wise work
    of every layer (norms, rotary, casts, softmax, SiLU x up, residuals) fused into generated
    kernels, the matmuls left to PyTorch's. The first call compiles (25-28 s on a 2-core CPU in a
    fresh inductor cache, less from a warm one); docs/performance.md has the measurements."""
    fn = _COMPILED.get("step")
    if fn is None:
        fn = _COMPILED["step"] = torch.compile(step_math, dynamic=None)
    return fn


def make_lean_decoder(policy, batch: int, capacity: int, cache, rows: torch.Tensor | None = None):
    """A LeanDecoder over the prefilled `cache`, when the model is one it reproduces (else None:
    transformers' forward per token). `rows` [batch]: the cache row of each decoded row, when the
    prefill ran each distinct prompt once (tether.policy.sampling)."""
    if not policy.lean_decode or cache is None or not supports(policy.model):
        return None
    if not all(getattr(layer, "keys", None) is not None for layer in getattr(cache, "layers", [])):
        return None
    compiled = policy.compile_decode and "failed" not in _COMPILED
    lean = LeanDecoder(policy.model, batch, capacity, policy.autocast_bf16, compiled=compiled)
    lean.load_prefill(cache, rows)
    return lean
