"""The transformers backend's sampler: tether's own batched loop over a KV cache, returning the
log-probs of the distribution it sampled from.

Sampling is tether's own loop (not `model.generate`) so that:
- the returned log-probs are exactly those of the distribution sampled from (logits / T, after
  any top-k/top-p truncation) — tinker-feedback#148, tinker-cloud PR#26;
- no generation-config default (HF's top_k=50) silently filters the sampler (Golubev et al.);
- left padding gets correct position ids (OpenRLHF#217, trl#6800);
- finish reasons come from the sampled ids and the set of stop ids (several eos ids allowed,
  pad may equal eos — trl PR#7039, PR#6357).

The decode step is tether.policy.decode's lean Llama step where the model allows it, else
transformers' forward over a preallocated cache; the LM head is fp32 either way, as the trainer
scores (tether.policy.scoring.fp32_head_logits).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from tether.policy.config import SamplingConfig
from tether.phase import marks_phase
from tether.policy import kv_reuse
from tether.policy.base import HFPolicy
from tether.policy.scoring import _backbone_and_head, fp32_head_logits
from tether.types import Sample, StopReason


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


# drop finished rows from the lean decoder's batch once at most this share of its rows is still running
# (each drop copies the kept rows' cache: ~ one step's attention reads)
_COMPACT = 0.75


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
    if (store := kv_reuse.active(policy)) is not None:
        store.begin_call(policy)
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
            def __init__(self, capacity: int, past=None, index: int = 0) -> None:
                super().__init__()
                # past: a kv_reuse.SavedPrefix, the keys/values of the first positions (layer `index`)
                self.capacity, self.past, self.index = capacity, past, index
                self.length = 0 if past is None else past.length

            def lazy_initialization(self, key_states, value_states) -> None:
                self.device = key_states.device
                self._k = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
                self._v = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[-1]))
                if self.past is not None:  # tether.policy.kv_reuse: saved by an earlier turn
                    self.past.fill(self.index, self._k, self._v)
                    self.past = None
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


def _make_decode_cache(model, capacity: int, past=None):
    """transformers' DynamicCache with preallocated full-attention layers; any other layer kind
    (sliding window, linear attention, ...) keeps transformers' own class. `past` (a
    kv_reuse.SavedPrefix): the keys/values of the first positions; None is returned when the cache
    cannot take them."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=model.config)
    except (ImportError, TypeError, AttributeError):  # older transformers: the model makes its own cache
        return None
    if getattr(cache, "layers", None) and all(type(layer) is DynamicLayer for layer in cache.layers):
        cls = _preallocated_layer_class()
        if past is not None and past.layers != len(cache.layers):
            return None
        cache.layers = [cls(capacity, past, i) for i in range(len(cache.layers))]
    elif past is not None:
        return None
    return cache


def _sample_inverse_cdf(logp_BV: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from exp(logp_BV): the first token whose cumulative probability exceeds
    u ~ U[0, total). One uniform per row instead of multinomial's one exponential per vocabulary
    entry (the largest per-token sampling cost on CPU); float64 so that rounding never selects a
    zero-probability (filtered) token."""
    cdf = logp_BV.double().exp().cumsum(-1)
    # the uniforms come from the generator's own device (a run's generator is a CPU one: the same draws on a
    # CPU and a GPU run); drawing them on cdf.device with a CPU generator fails on cuda (gpu-check, 2026-12-04)
    where = generator.device if generator is not None else cdf.device
    u = torch.rand((cdf.shape[0], 1), generator=generator, dtype=torch.float64, device=where).to(cdf.device) * cdf[:, -1:]
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
    filtered = bool(sampling.top_k) or sampling.top_p < 1.0 or sampling.min_p > 0.0
    record = filtered and sampling.keep_mask and not greedy  # the sampling mask, for the trainer
    kept = torch.zeros((B, max_new), dtype=torch.int32, device=dev) if record else None
    logits, cache, lean = _prefill(policy, prompts, ids, mask, pos, W + max_new, lean_ok)
    store = kv_reuse.active(policy)
    key_bias = torch.zeros((B, W + max_new), dtype=torch.float32, device=dev).masked_fill_(full_mask == 0, float("-inf"))
    is_stop = torch.zeros(max(logits.shape[-1], max(policy.stop_ids) + 1), dtype=torch.bool, device=dev)
    is_stop[list(policy.stop_ids)] = True  # a lookup instead of torch.isin per token
    next_pos = pos[:, -1:] + 1
    # rows still decoded by the lean decoder (None: all B). Finished rows are dropped from its batch
    # once enough of them have finished (_COMPACT); their tokens are the pad from then on, as before,
    # and every row still draws its uniform each step, so the samples are those of the full batch
    # (up to a matmul kernel rounding differently at another row count, which can move a draw: seen
    # in 0.4% of rows with the 25M benchmark model in bf16; docs/performance.md).
    live, live_bias, all_logits = None, key_bias, None
    compact = lean is not None and policy.weight_feed is None
    for t in range(max_new):
        logits = logits.float()
        if live is not None:  # the decoder's rows into the whole batch (finished rows keep stale, finite logits)
            all_logits[live] = logits
            logits = all_logits
        tok, logp_V = _draw(logits, sampling, greedy, filtered, generator, None if kept is None else kept[:, t])
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
            if compact and (left := int(B - finished.sum())) < lean.batch and left <= _COMPACT * lean.batch:
                if live is None:
                    live, all_logits = torch.arange(B, device=dev), logits.clone()
                live, live_bias = _drop_finished(lean, live, finished, key_bias, None if store is None else (
                    lambda rows, at: kv_reuse.save_rows(store, lean.k, lean.v, rows, at, prompts, tokens, lengths, W)))
            if live is None:
                logits = lean.step(tok, next_pos[:, 0], key_bias)
            else:
                logits = lean.step(tok[live], next_pos[live, 0], live_bias)
        else:
            logits, cache = next_token_logits(model, tok[:, None], full_mask[:, :W + t + 1], next_pos, cache,
                                              policy.autocast_bf16)
        next_pos = next_pos + 1
    if store is not None and len(switches) == 1:
        _save_for_next_turn(store, lean, cache, live, prompts, tokens, lengths, W)
    return _to_samples(prompts, tokens.cpu(), logps.cpu(), lengths.cpu(), finished.cpu(),
                       kept.cpu() if kept is not None else None, switches)


def _draw(logits: torch.Tensor, sampling, greedy: bool, filtered: bool, generator, kept_B: torch.Tensor | None):
    """One token per row from fp32 logits [B, V] -> (tokens [B], log-probs over the vocabulary [B, V]) at
    the sampling temperature, after top-k/top-p/min-p filtering when `filtered`; `kept_B` (a column of
    the sampling-mask record, or None) receives how many tokens each row's filter kept."""
    if greedy:
        return logits.argmax(-1), torch.log_softmax(logits, -1)
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if filtered:
        logits = _filter_logits(logits, sampling.top_k, sampling.top_p, sampling.min_p)
        if kept_B is not None:
            kept_B.copy_(torch.isfinite(logits).sum(-1))
    logp_V = torch.log_softmax(logits, -1)
    return _sample_inverse_cdf(logp_V, generator), logp_V


def _drop_finished(lean, live: torch.Tensor, finished: torch.Tensor, key_bias: torch.Tensor, save=None):
    """Keep only the unfinished rows in the lean decoder: (the batch rows it now decodes, their key bias).
    `save(decoder rows, batch rows)` (optional) is called with the rows about to go."""
    if save:
        gone = finished[live].nonzero().squeeze(1)
        save(gone.tolist(), live[gone].tolist())
    keep = (~finished[live]).nonzero().squeeze(1)  # among the decoder's current rows
    lean.keep_rows(keep)
    live = live[keep]
    return live, key_bias.index_select(0, live)


def _prefill(policy, prompts, ids, mask, pos, capacity: int, lean_ok: bool):
    """Run the prompts: (fp32 logits of each row's next token [B, V], transformers' cache, the
    LeanDecoder over it or None: transformers' forward per token). The backbone under the policy's
    autocast, the LM head in fp32 (as the trainer scores); the lean decoder sets its own precision."""
    from tether.policy import decode

    B, W = ids.shape
    uniq, rows = _distinct_prompts(prompts, ids.device) if lean_ok else (None, None)
    if uniq is not None:  # each distinct prompt once (GRPO samples n per prompt); the lean decoder gathers its rows
        logits, cache = _run_prompts(policy, [prompts[i] for i in uniq.tolist()], ids[uniq], mask[uniq], pos[uniq],
                                     min(capacity, W + decode.LeanDecoder.GROW))
        lean = decode.make_lean_decoder(policy, B, capacity, cache, rows)
        if lean is not None:
            return logits[rows], cache, lean
    # transformers' step needs room for every new token; the lean decoder takes the cache's buffers
    # over when it can (LeanDecoder._adopt: room for its first steps, no copy)
    cap = min(capacity, W + decode.LeanDecoder.GROW) if lean_ok and uniq is None else capacity
    logits, cache = _run_prompts(policy, prompts, ids, mask, pos, cap)
    return logits, cache, decode.make_lean_decoder(policy, B, capacity, cache)


def _run_prompts(policy, prompts, ids, mask, pos, capacity: int):
    """One prefill forward: (logits of the last position, cache). With keys/values saved by an
    earlier turn (tether.policy.kv_reuse), only the positions they do not cover run."""
    model, W, store = policy.model, ids.shape[1], kv_reuse.active(policy)
    plan = store.plan(prompts, W) if store is not None else None
    if plan is not None:
        s, past = plan
        cache = _make_decode_cache(model, capacity, past)
        if cache is not None:
            return next_token_logits(model, ids[:, W - s:], mask, pos[:, W - s:], cache, policy.autocast_bf16)
    return next_token_logits(model, ids, mask, pos, _make_decode_cache(model, capacity), policy.autocast_bf16)


def _save_for_next_turn(store, lean, cache, live, prompts, tokens, lengths, W) -> None:
    """Every row's keys/values still in the decoder at the end of a call (tether.policy.kv_reuse): the
    entries refer to the decoder's last buffers, which nothing writes to from here on."""
    B = tokens.shape[0]
    if lean is not None:
        at = list(range(B)) if live is None else live.tolist()
        kv_reuse.save_rows(store, lean.k, lean.v, list(range(len(at))), at, prompts, tokens, lengths, W, copy=False)
    elif cache is not None and all(hasattr(layer, "_k") for layer in getattr(cache, "layers", [])):
        kv_reuse.save_rows(store, [la._k for la in cache.layers], [la._v for la in cache.layers], list(range(B)),
                           list(range(B)), prompts, tokens, lengths, W, copy=False)


def _distinct_prompts(prompts, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the first row of each distinct prompt, each row's index among them), or (None, None) when
    every prompt is distinct. The prefill then runs B_distinct rows instead of B: with GRPO's n
    samples per prompt, 1/n of the prompt tokens (TRL's generate runs all of them)."""
    slot: dict[tuple[int, ...], int] = {}
    first_rows: list[int] = []
    index = []
    for r, p in enumerate(prompts):
        key = tuple(p)
        if key not in slot:
            slot[key] = len(first_rows)
            first_rows.append(r)
        index.append(slot[key])
    if len(first_rows) == len(prompts):
        return None, None
    return (torch.tensor(first_rows, dtype=torch.long, device=device), torch.tensor(index, dtype=torch.long, device=device))


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
