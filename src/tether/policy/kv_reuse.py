"""Keys and values carried from one turn of a multi-turn rollout to the next (the HF sampler).

Each turn of an agent episode samples from a context that extends the previous turn's context and
action (append-only contexts, tether.envs.context). Without reuse, every turn's prefill runs the
transformer over the whole context again: 44-47% of the demo's sampling time went there
(benchmarks/results/prefill_share_demo.json). While `carry_turn_kv(policy)` is open (the env
runner opens it around its turns), the sampler (tether.policy.sampling):

- saves each row's keys/values at the end of a generate call (and when the lean decoder drops a
  finished row): those of its prompt and of the sampled tokens it fed back (all but the last);
- at the next call, finds for each prompt the longest saved sequence that is a prefix of it, and
  runs the prefill over the last S positions only, S the longest uncached suffix in the batch; the
  positions before them come from the saved keys/values (a row whose cached part is longer than
  needed recomputes the rest of its window: the same values).

The result is a full prefill's up to rounding: the saved keys/values were computed by the decode
step in its precision (bf16 under autocast, as the lean decoder keeps its cache), a full prefill
recomputes them (tests/unit/policy/test_kv_reuse.py). vLLM does the same for the vLLM backend
(automatic prefix caching).

Saved entries belong to one set of weights. The store is tagged with the policy's version,
precision and model, and emptied when any of them changes; nothing is saved or reused while an
in-flight weight update can arrive (policy.weight_feed); entries not matched within two calls
are dropped (a summary call may sit between two turns), and the whole store when the runner's
scope closes. A row's saved keys/values cost what the decoder's cache held for it (the demo:
3 KB per token in fp32).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch

_BASE, _MOD = 1_000_003, (1 << 61) - 1
KEEP_CALLS = 2  # an entry not matched within this many generate calls is dropped


def _prefix_hashes(tokens: Sequence[int]) -> list[int]:
    """h[L]: a polynomial hash of tokens[:L], for every L (0..len)."""
    out, h = [0], 0
    for t in tokens:
        h = (h * _BASE + int(t) + 1) % _MOD
        out.append(h)
    return out


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2 (keys, values), kv_heads, len(tokens), head_dim]
    call: int


class TurnKV:
    """Saved keys/values by token sequence, for the next turn's prefill (see the module docstring)."""

    def __init__(self) -> None:
        self.by_len: dict[int, dict[int, _Entry]] = {}
        self.calls = 0
        self.tag: tuple | None = None
        self.stats = {"prefill_rows": 0, "reused_rows": 0, "prompt_positions": 0, "reused_positions": 0,
                      "run_positions": 0}

    def begin_call(self, policy) -> None:
        """A new generate call: empty the store if the weights may differ, drop stale entries."""
        tag = (int(policy.version), bool(policy.autocast_bf16), id(policy.model))
        if tag != self.tag:
            self.by_len.clear()
            self.tag = tag
        self.calls += 1
        for length in list(self.by_len):
            kept = {h: e for h, e in self.by_len[length].items() if e.call >= self.calls - KEEP_CALLS}
            if kept:
                self.by_len[length] = kept
            else:
                del self.by_len[length]

    def save(self, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        self.by_len.setdefault(len(tokens), {})[_prefix_hashes(tokens)[-1]] = _Entry(tokens, kv, self.calls)

    def lookup(self, prompt: Sequence[int]) -> _Entry | None:
        """The longest saved sequence that is a prefix of `prompt`, one token short of it at most
        (the prefill must run the prompt's last position for its logits)."""
        if not self.by_len:
            return None
        hashes = _prefix_hashes(prompt)
        for length in sorted(self.by_len, reverse=True):
            if length >= len(prompt):
                continue
            e = self.by_len[length].get(hashes[length])
            if e is not None and e.tokens == tuple(prompt[:length]):
                return e
        return None

    def plan(self, prompts: Sequence[Sequence[int]], width: int) -> tuple[int, torch.Tensor] | None:
        """For a prefill of `prompts` left-padded to `width`: (S, the keys/values of every row's first
        width - S positions [layers, 2, rows, kv_heads, width - S, head_dim]), or None when nothing
        is saved for them. Matched entries leave the store."""
        entries = [self.lookup(p) for p in prompts]
        s = max(len(p) - (len(e.tokens) if e is not None else 0) for p, e in zip(prompts, entries))
        self.stats["prefill_rows"] += len(prompts)
        self.stats["prompt_positions"] += len(prompts) * width
        if s >= width:
            self.stats["run_positions"] += len(prompts) * width
            return None
        first = next(e for e in entries if e is not None)
        layers, _, kvh, _, d = first.kv.shape
        past = first.kv.new_zeros((layers, 2, len(prompts), kvh, width - s, d))
        for r, (p, e) in enumerate(zip(prompts, entries)):
            keep = len(p) - s  # this row's positions before the window
            if e is not None and keep > 0:
                past[:, :, r, :, width - len(p):] = e.kv[:, :, :, :keep]
                self.stats["reused_rows"] += 1
                self.stats["reused_positions"] += keep
        for e in entries:
            if e is not None:
                self.by_len.get(len(e.tokens), {}).pop(_prefix_hashes(e.tokens)[-1], None)
        self.stats["run_positions"] += len(prompts) * s
        return s, past


def active(policy) -> TurnKV | None:
    """The policy's store, when the sampler may save to and reuse from it."""
    store = getattr(policy, "turn_kv", None)
    return store if store is not None and getattr(policy, "weight_feed", None) is None else None


@contextmanager
def carry_turn_kv(policy):
    """Keep keys/values from one generate call to the next while open (see the module docstring);
    yields the store (None when the policy does not take one: another backend, or reuse off)."""
    if not getattr(policy, "reuse_turn_kv", False) or getattr(policy, "turn_kv", None) is not None:
        yield None  # not an HF policy, reuse off, or a scope already open (its owner clears it)
        return
    policy.turn_kv = TurnKV()
    try:
        yield policy.turn_kv
    finally:
        policy.turn_kv = None


def save_rows(store: TurnKV, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], cache_rows: Sequence[int],
              batch_rows: Sequence[int], prompts, tokens: torch.Tensor, lengths: torch.Tensor, width: int) -> None:
    """Save rows of a decode cache (per layer [rows, kv_heads, positions, head_dim], prompts
    left-padded to `width`): row `cache_rows[i]` holds batch row `batch_rows[i]`, whose prompt and
    first lengths - 1 sampled tokens (the ones fed back) are saved."""
    if not len(batch_rows):
        return
    fed = (lengths[list(batch_rows)] - 1).tolist()
    sampled = tokens[list(batch_rows)].tolist()
    for cr, br, n, gen in zip(cache_rows, batch_rows, fed, sampled):
        p = prompts[br]
        a, b = width - len(p), width + n
        kv = torch.stack([torch.stack((k[cr, :, a:b], v[cr, :, a:b].to(k.dtype))) for k, v in zip(keys, values)])
        store.save((*map(int, p), *gen[:n]), kv)
