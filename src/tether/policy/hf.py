"""The transformers backend: sampling with log-probs, and chunked log-prob / entropy scoring.

Sampling is tether's own loop over a KV cache (not `model.generate`) so that:
- the returned log-probs are exactly those of the distribution sampled from (logits / T, after
  any top-k/top-p truncation) — tinker-feedback#148, tinker-cloud PR#26;
- no generation-config default (HF's top_k=50) silently filters the sampler (Golubev et al.);
- left padding gets correct position ids (OpenRLHF#217, trl#6800);
- finish reasons come from the sampled ids and the set of stop ids (several eos ids allowed,
  pad may equal eos — trl PR#7039, PR#6357).

Scoring runs the backbone once and applies the LM head in chunks of positions, with activation
checkpointing per chunk when gradients are needed, so the B x T x V logits never exist at once
(pitfall 13: SkyRL PR#1610, trl PR#4013).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tether.config import SamplingConfig
from tether.phase import marks_phase
from tether.preflight import check_model_dir, load_pretrained
from tether.types import Sample, StopReason


@dataclass
class HFPolicy:
    """A causal LM with its tokenizer and the ids that end a generation."""

    model: torch.nn.Module
    tokenizer: object
    stop_ids: tuple[int, ...]
    pad_id: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    autocast_bf16: bool = False
    version: int = 0  # bumped by the recipe after every optimizer step
    lean_decode: bool = True  # tether.policy.decode for Llama-family models; False: transformers per token
    lean_train: str = "eager"  # tether.policy.lean_train for shared-prefix scoring: "eager", "compile" (train.compile), "off"
    trained_positions: int = 0  # token positions run forward+backward so far (padding included): see count_trained
    base_only: bool = False  # a LoRA model scored with its adapters off: the KL reference (tether.policy.lora)
    weight_feed: object = None  # tether.policy.inflight.WeightFeed: newer weights taken between decode steps

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))


def count_trained(policy: HFPolicy, positions: int) -> None:
    """Add `positions` (rows x width a backbone call ran) to the policy's counter when gradients
    are on: the update's hardware work, after packing, prefix sharing and padding."""
    if torch.is_grad_enabled():
        policy.trained_positions += int(positions)


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether transformers' activation (gradient) checkpointing is on for `model`."""
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (`model.gradient_checkpointing`): less memory, about one more forward of compute."""
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(f"model.gradient_checkpointing=true: {type(model).__name__} does not support activation checkpointing")
    enable()


def find_stop_ids(model: torch.nn.Module, tokenizer) -> tuple[int, ...]:
    """Every id that ends a generation: generation_config / config eos ids and the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("the model and tokenizer define no eos token id; generation could never stop")
    return tuple(sorted(ids))


def load_policy(path: str | Path, device: str = "cpu", dtype: str = "float32", autocast_bf16: bool | str = False) -> HFPolicy:
    """Load any local causal-LM directory with `from_pretrained` (offline)."""
    p = Path(path)
    if p.is_dir() and (p / "adapter_config.json").is_file():  # a LoRA checkpoint: its base with the adapter merged in
        return _load_adapter_policy(p, device, dtype, autocast_bf16)
    check_model_dir(p)  # InputError (one line): no such directory, no config.json
    model, tokenizer = load_pretrained(p, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    return make_policy(model, tokenizer, device=device, autocast_bf16=autocast_bf16)


def _load_adapter_policy(p: Path, device: str, dtype: str, autocast_bf16: bool | str) -> HFPolicy:
    from transformers import AutoTokenizer

    from tether.policy.lora import adapter_base_path, load_adapter_merged

    model = load_adapter_merged(p, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    tok_dir = p if (p / "tokenizer_config.json").is_file() else adapter_base_path(p)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    return make_policy(model, tokenizer, device=device, autocast_bf16=autocast_bf16)


def make_policy(model, tokenizer, device: str = "cpu", autocast_bf16: bool | str = False) -> HFPolicy:
    """`autocast_bf16`: true, false or "auto" (bf16 only where `device` does it natively: tether.hardware)."""
    from tether.hardware import resolve_autocast

    autocast_bf16 = resolve_autocast(autocast_bf16, device)
    stop_ids = find_stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id
    if pad is None:  # common for base models: pad with eos; masks never look at token values
        pad = stop_ids[0]
    dev = torch.device(device)
    model.to(dev)
    if autocast_bf16 and dev.type == "cpu":  # CPU bf16 flash attention is slow (tether.policy.attention)
        from tether.policy.attention import use_fast_cpu_attention

        use_fast_cpu_attention(model)
    return HFPolicy(model=model, tokenizer=tokenizer, stop_ids=stop_ids, pad_id=int(pad), device=dev, autocast_bf16=autocast_bf16)


# ----------------------------------------------------------------------------- sampling


def _filter_logits(logits_BV: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0) -> torch.Tensor:
    """Top-k, then nucleus, then min-p truncation (arXiv 2407.01082); removed entries become -inf.
    Every filter keeps the highest logits, so the kept set is described by its size alone."""
    if top_k and top_k < logits_BV.shape[-1]:
        kth = torch.topk(logits_BV, top_k, dim=-1).values[..., -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits_BV, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, idx, drop_sorted)
        logits_BV = logits_BV.masked_fill(drop, float("-inf"))
    if min_p > 0.0:  # keep p >= min_p * p_max, i.e. logit >= max logit + log(min_p)
        floor = logits_BV.max(-1, keepdim=True).values + math.log(min_p)
        logits_BV = logits_BV.masked_fill(logits_BV < floor, float("-inf"))
    return logits_BV


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


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@marks_phase("generate")
@torch.inference_mode()
def run_generate(
    policy: HFPolicy,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
    greedy: bool = False,
) -> list[Sample]:
    """Sample one continuation per prompt (batched, KV cache). See module docstring.

    Another backend (tether.policy.vllm.VLLMPolicy) is any object with this method: it generates.
    """
    if not isinstance(policy, HFPolicy) and hasattr(policy, "generate"):
        return policy.generate(prompts, sampling, generator, batch_size=batch_size, greedy=greedy)
    out: list[Sample] = []
    for start in range(0, len(prompts), batch_size):
        out.extend(_generate_batch(policy, prompts[start:start + batch_size], sampling, generator, greedy))
    return out


def _cache_kwarg(model) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache` (the old name warns)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


_PREALLOCATED_LAYER = None


def _preallocated_layer_class():
    """A transformers `DynamicLayer` that writes keys/values into a preallocated buffer.

    `DynamicLayer` concatenates the whole cache with every new token (O(T^2) copies; half of a
    decode step on CPU). This layer copies only the new token and returns views of the buffer.
    """
    global _PREALLOCATED_LAYER
    if _PREALLOCATED_LAYER is None:
        from transformers.cache_utils import DynamicLayer

        class PreallocatedLayer(DynamicLayer):
            def __init__(self, capacity: int) -> None:
                super().__init__()
                self.capacity, self.length = capacity, 0

            def lazy_initialization(self, key_states, value_states) -> None:
                self.device = key_states.device
                self._k = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
                self._v = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[-1]))
                self.is_initialized = True

            def update(self, key_states, value_states, *args, **kwargs):
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                n, s = self.length, key_states.shape[-2]
                if n + s > self._k.shape[-2]:  # more than announced: grow (never silently wrong)
                    extra = max(n + s, 2 * self._k.shape[-2]) - self._k.shape[-2]
                    self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:2], extra, self._k.shape[-1]))], 2)
                    self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:2], extra, self._v.shape[-1]))], 2)
                self._k[:, :, n:n + s] = key_states
                self._v[:, :, n:n + s] = value_states
                self.length = n + s
                self.keys, self.values = self._k[:, :, :n + s], self._v[:, :, :n + s]
                return self.keys, self.values

            def get_seq_length(self) -> int:
                return self.length

        _PREALLOCATED_LAYER = PreallocatedLayer
    return _PREALLOCATED_LAYER


def _make_decode_cache(model, capacity: int):
    """transformers' DynamicCache with preallocated full-attention layers; any other layer kind
    (sliding window, linear attention, ...) keeps transformers' own class."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=model.config)
    except (ImportError, TypeError, AttributeError):  # older transformers: the model makes its own cache
        return None
    if getattr(cache, "layers", None) and all(type(layer) is DynamicLayer for layer in cache.layers):
        cls = _preallocated_layer_class()
        cache.layers = [cls(capacity) for _ in cache.layers]
    return cache


def _sample_inverse_cdf(logp_BV: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from exp(logp_BV): the first token whose cumulative probability exceeds
    u ~ U[0, total). One uniform per row instead of multinomial's one exponential per vocabulary
    entry (the largest per-token sampling cost on CPU); float64 so that rounding never selects a
    zero-probability (filtered) token."""
    cdf = logp_BV.double().exp().cumsum(-1)
    u = torch.rand((cdf.shape[0], 1), generator=generator, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return torch.where(tok < cdf.shape[-1], tok, logp_BV.argmax(-1))  # u rounded up to the total: the mode


def _generate_batch(policy, prompts, sampling, generator, greedy) -> list[Sample]:
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")
    model, dev = policy.model, policy.device
    ids, mask = _left_pad(prompts, policy.pad_id, dev)
    B, W = ids.shape
    max_new = min(sampling.max_new_tokens, policy.max_positions - W)
    if max_new <= 0:
        raise ValueError(f"prompt of {W} tokens leaves no room in the model's {policy.max_positions} positions")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens = torch.full((B, max_new), policy.pad_id, dtype=torch.long, device=dev)
    logps = torch.zeros((B, max_new), dtype=torch.float32, device=dev)
    lengths = torch.full((B,), max_new, dtype=torch.long, device=dev)
    finished = torch.zeros(B, dtype=torch.bool, device=dev)
    pad = torch.full((B,), policy.pad_id, dtype=torch.long, device=dev)
    full_mask = torch.ones((B, W + max_new), dtype=mask.dtype, device=dev)  # sliced per step: no cat
    full_mask[:, :W] = mask
    from tether.policy import decode, inflight

    lean_ok, switches = policy.lean_decode and decode.supports(model), [(0, policy.version)]
    cache = _make_decode_cache(model, W if lean_ok else W + max_new)  # the lean decoder keeps its own
    filtered = bool(sampling.top_k) or sampling.top_p < 1.0 or sampling.min_p > 0.0
    record = filtered and sampling.keep_mask and not greedy  # the sampling mask, for the trainer
    kept = torch.zeros((B, max_new), dtype=torch.int32, device=dev) if record else None
    # the backbone under the policy's autocast, the LM head in fp32 (as the trainer scores); the lean
    # decoder sets its own precision per op
    logits, cache = next_token_logits(model, ids, mask, pos, cache, policy.autocast_bf16)
    lean = decode.make_lean_decoder(policy, B, W + max_new, cache)  # None: transformers' forward per token
    key_bias = torch.zeros((B, W + max_new), dtype=torch.float32, device=dev).masked_fill_(full_mask == 0, float("-inf"))
    is_stop = torch.zeros(max(logits.shape[-1], max(policy.stop_ids) + 1), dtype=torch.bool, device=dev)
    is_stop[list(policy.stop_ids)] = True  # a lookup instead of torch.isin per token
    next_pos = pos[:, -1:] + 1
    for t in range(max_new):
        logits = logits.float()
        if greedy:
            logp_V = torch.log_softmax(logits, -1)
            tok = logits.argmax(-1)
        else:
            if sampling.temperature != 1.0:
                logits = logits / sampling.temperature
            if filtered:
                logits = _filter_logits(logits, sampling.top_k, sampling.top_p, sampling.min_p)
                if kept is not None:
                    kept[:, t] = torch.isfinite(logits).sum(-1)
            logp_V = torch.log_softmax(logits, -1)
            tok = _sample_inverse_cdf(logp_V, generator)
        tok = torch.where(finished, pad, tok)
        tokens[:, t] = tok
        logps[:, t] = logp_V.gather(-1, tok[:, None]).squeeze(-1)
        newly = is_stop[tok] & ~finished
        lengths.masked_fill_(newly, t + 1)
        finished |= newly
        if t == max_new - 1 or bool(finished.all()):
            break
        if policy.weight_feed is not None and (update := policy.weight_feed.take()) is not None:
            logits, cache, lean = inflight.switch_weights(policy, update, torch.cat([ids, tokens[:, :t + 1]], 1),
                                                          full_mask[:, :W + t + 1], W + max_new, lean_ok)
            switches.append((t + 1, policy.version))  # in-flight update (tether.policy.inflight)
        elif lean is not None:
            logits = lean.step(tok, next_pos[:, 0], key_bias)
        else:
            logits, cache = next_token_logits(model, tok[:, None], full_mask[:, :W + t + 1], next_pos, cache,
                                              policy.autocast_bf16)
        next_pos = next_pos + 1
    return _to_samples(prompts, tokens.cpu(), logps.cpu(), lengths.cpu(), finished.cpu(),
                       kept.cpu() if kept is not None else None, switches)


def _to_samples(prompts, tokens, logps, lengths, finished, kept, switches) -> list[Sample]:
    from tether.policy.inflight import expand_versions

    samples = []
    for i in range(len(prompts)):
        n = int(lengths[i])
        samples.append(Sample(
            prompt_ids=tuple(prompts[i]),
            token_ids=tuple(tokens[i, :n].tolist()),
            logprobs=tuple(logps[i, :n].tolist()),
            finish=StopReason.EOS if bool(finished[i]) else StopReason.LENGTH,
            policy_version=switches[0][1],
            kept=tuple(kept[i, :n].tolist()) if kept is not None else (),
            token_versions=expand_versions(switches, n) if len(switches) > 1 else (),
        ))
    return samples


# ----------------------------------------------------------------------------- scoring


def _backbone_and_head(model: torch.nn.Module):
    head = model.get_output_embeddings()
    backbone = getattr(model, model.base_model_prefix, None) if hasattr(model, "base_model_prefix") else None
    if backbone is None or backbone is model:
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or backbone is None:
        raise TypeError(f"{type(model).__name__}: cannot find backbone and LM head for chunked scoring")
    return backbone, head


def fp32_head_logits(h_BH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                     softcap: float | None) -> torch.Tensor:
    """The LM head in fp32 whatever autocast says (ScaleRL: FP32 logits matter). The trainer's
    scorer and the sampler both use this, so the log-probs the sampler records and the ones the
    trainer recomputes differ only by the backbone's own rounding."""
    with torch.autocast(h_BH.device.type, enabled=False):
        logits = F.linear(h_BH.float(), weight_VH.float(), None if bias_V is None else bias_V.float())
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def next_token_logits(model, ids_BT: torch.Tensor, mask_BT: torch.Tensor, pos_BT: torch.Tensor, cache,
                      autocast_bf16: bool):
    """(fp32 logits of the last position [B, V], the updated cache): the backbone under the policy's
    autocast, the LM head in fp32 (fp32_head_logits), as the trainer scores."""
    backbone, head = _backbone_and_head(model)
    kw = _cache_kwarg(backbone)
    with torch.autocast(ids_BT.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        out = backbone(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT, use_cache=True, **{kw: cache})
    cache = out[kw]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    return fp32_head_logits(out.last_hidden_state[:, -1], head.weight, getattr(head, "bias", None), softcap), cache


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (and entropies) of `input_ids_BT` under the policy at `temperature`
    (and under the sampler's truncation where `kept_BT`, aligned with the ids, is > 0).

    Returns logp_BT, entropy_BT: [B,T]; entry t scores token t given tokens < t; column 0 is 0.
    Sequences are right-padded (positions are 0..L-1 for real tokens). Gradients flow when
    enabled by the caller; each chunk of positions is checkpointed so only hidden states are kept.
    `pack`: run the backbone on packed rows (tether.policy.packing) when the model supports it.
    """
    from tether.policy.packing import run_packed_backbone, supports_packing

    model = policy.model
    backbone, _ = _backbone_and_head(model)
    ids = input_ids_BT.to(policy.device)
    am = attention_mask_BT.to(policy.device).long()
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    hidden = None
    with torch.autocast(policy.device.type, dtype=torch.bfloat16, enabled=policy.autocast_bf16):
        if pack and supports_packing(model):
            hidden = run_packed_backbone(backbone, ids, am.sum(-1).tolist(), policy.pad_id)
        if hidden is None:  # no cache: transformers would otherwise copy every layer's keys/values into one
            hidden = backbone(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).last_hidden_state
    count_trained(policy, hidden.shape[0] * hidden.shape[1])
    kept = None if kept_BT is None else kept_BT[:, 1:].to(ids.device)
    lp, ent = compute_head_logprobs(model, hidden[:, :-1], ids[:, 1:], temperature, with_entropy, chunk_size, kept)
    zero = torch.zeros((ids.shape[0], 1), dtype=torch.float32, device=ids.device)
    return torch.cat([zero, lp], dim=1), torch.cat([zero, ent], dim=1)


def compute_head_logprobs(model, h_BTH: torch.Tensor, targets_BT: torch.Tensor, temperature: float = 1.0,
                          with_entropy: bool = False, chunk_size: int = 256,
                          kept_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets_BT[:, t] | h_BTH[:, t]) and entropies via the LM head, in chunks of positions
    (checkpointed under grad), so the B x T x V logits never exist at once."""
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


class ValueModel(torch.nn.Module):
    """A critic for PPO/GAE: the policy's backbone architecture with a scalar head.

    values_BT[:, t] = V(s_t), the value of the state in which token t is chosen (prefix < t),
    aligned with `compute_logprobs`.
    """

    def __init__(self, policy_model: torch.nn.Module) -> None:
        super().__init__()
        import copy

        backbone, _ = _backbone_and_head(policy_model)
        self.backbone = copy.deepcopy(backbone)
        hidden = policy_model.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        am = attention_mask_BT.long()
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(input_ids=input_ids_BT, attention_mask=am, position_ids=pos).last_hidden_state
        v = self.head(hidden.float()).squeeze(-1)  # v[:, t] = value after reading token t
        zero = torch.zeros_like(v[:, :1])
        return torch.cat([zero, v[:, :-1]], dim=1)
