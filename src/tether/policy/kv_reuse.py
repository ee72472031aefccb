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
3 KB per token in fp32), so between two calls the store holds about one batch's cache; the next
prefill copies them row by row into its own cache, with no batch-sized copy in between.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

KEEP_CALLS = 2  # an entry not matched within this many generate calls is dropped
_WEIGHTS = np.zeros(0, dtype=np.uint64)  # the hash's per-position weights, grown on demand
_RNG = np.random.default_rng(0x7E7)


def _prefix_hashes(tokens: Sequence[int]) -> np.ndarray:
    """h[L-1]: a hash of tokens[:L] for every L >= 1 (sum of token x weight_position mod 2^64, random odd
    weights; a match is checked token by token, so a collision can cost a lookup, never a wrong answer)."""
    global _WEIGHTS
    n = len(tokens)
    if n > len(_WEIGHTS):
        more = _RNG.integers(0, 1 << 62, size=max(n, 2 * len(_WEIGHTS), 1024) - len(_WEIGHTS), dtype=np.uint64)
        _WEIGHTS = np.concatenate([_WEIGHTS, more * np.uint64(2) + np.uint64(1)])
    return np.cumsum(np.asarray(tokens, dtype=np.uint64) * _WEIGHTS[:n], dtype=np.uint64)


def _hash(tokens: Sequence[int]) -> int:
    return int(_prefix_hashes(tokens)[-1]) if len(tokens) else 0


@dataclass
class _Entry:
    """A saved sequence: its keys/values are row `row`, columns start..start + len(tokens), of the
    per-layer tensors `keys`/`values` [rows, kv_heads, positions, head_dim]."""

    tokens: tuple[int, ...]
    key: int  # its hash in the store
    keys: Sequence[torch.Tensor]
    values: Sequence[torch.Tensor]
    row: int
    start: int
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

    def save(self, tokens: tuple[int, ...], keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], row: int,
             start: int) -> None:
        key = _hash(tokens)
        self.by_len.setdefault(len(tokens), {})[key] = _Entry(tokens, key, keys, values, row, start, self.calls)

    def lookup(self, prompt: Sequence[int]) -> _Entry | None:
        """The longest saved sequence that is a prefix of `prompt`, one token short of it at most
        (the prefill must run the prompt's last position for its logits)."""
        if not self.by_len:
            return None
        hashes = _prefix_hashes(prompt)
        for length in sorted(self.by_len, reverse=True):
            if length >= len(prompt) or length == 0:
                continue
            e = self.by_len[length].get(int(hashes[length - 1]))
            if e is not None and e.tokens == tuple(prompt[:length]):
                return e
        return None

    def plan(self, prompts: Sequence[Sequence[int]], width: int) -> tuple[int, "SavedPrefix"] | None:
        """For a prefill of `prompts` left-padded to `width`: (S, the saved keys/values of every row's
        first width - S positions), or None when nothing is saved for them. Matched entries leave
        the store."""
        entries = [self.lookup(p) for p in prompts]
        s = max(len(p) - (len(e.tokens) if e is not None else 0) for p, e in zip(prompts, entries))
        self.stats["prefill_rows"] += len(prompts)
        self.stats["prompt_positions"] += len(prompts) * width
        if s >= width:
            self.stats["run_positions"] += len(prompts) * width
            return None
        rows = []  # (row, entry, first column, positions kept): a row's saved positions before the window
        for r, (p, e) in enumerate(zip(prompts, entries)):
            if e is not None and len(p) > s:
                rows.append((r, e, width - len(p), len(p) - s))
                self.stats["reused_rows"] += 1
                self.stats["reused_positions"] += len(p) - s
        for e in entries:
            if e is not None:
                self.by_len.get(len(e.tokens), {}).pop(e.key, None)
        self.stats["run_positions"] += len(prompts) * s
        return s, SavedPrefix(width - s, rows)


@dataclass
class SavedPrefix:
    """The keys/values of a prefill's first `length` positions, copied into a cache layer's buffers
    by `fill` (row by row from the saved entries: no batch-sized copy of its own). Positions
    no entry covers (padding) are zeros."""

    length: int
    rows: list[tuple[int, _Entry, int, int]]  # (row, entry, first column, positions kept)

    @property
    def layers(self) -> int:
        return len(self.rows[0][1].keys) if self.rows else 0

    def fill(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write into `keys`/`values` [rows, kv_heads, >= length, head_dim] (the first `length` columns)."""
        keys[:, :, :self.length].zero_()
        values[:, :, :self.length].zero_()
        for r, e, a, n in self.rows:
            keys[r, :, a:a + n] = e.keys[layer][e.row, :, e.start:e.start + n]
            values[r, :, a:a + n] = e.values[layer][e.row, :, e.start:e.start + n]


def active(policy) -> TurnKV | None:
    """The policy's store, when the sampler may save to and reuse from it."""
    store = getattr(policy, "turn_kv", None)
    return store if store is not None and getattr(policy, "weight_feed", None) is None else None


@contextmanager
def carry_turn_kv(policy, enabled: bool = True):
    """Keep keys/values from one generate call to the next while open (see the module docstring);
    yields the store (None when the policy does not take one: another backend, reuse off by
    `enabled` (env.reuse_kv) or `policy.reuse_turn_kv`)."""
    if not enabled or not getattr(policy, "reuse_turn_kv", False) or getattr(policy, "turn_kv", None) is not None:
        yield None  # not an HF policy, reuse off, or a scope already open (its owner clears it)
        return
    policy.turn_kv = TurnKV()
    try:
        yield policy.turn_kv
    finally:
        policy.turn_kv = None


def save_rows(store: TurnKV, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], cache_rows: Sequence[int],
              batch_rows: Sequence[int], prompts, tokens: torch.Tensor, lengths: torch.Tensor, width: int,
              copy: bool = True) -> None:
    """Save rows of a decode cache (per layer [rows, kv_heads, positions, head_dim], prompts
    left-padded to `width`): row `cache_rows[i]` holds batch row `batch_rows[i]`, whose prompt and
    first lengths - 1 sampled tokens (the ones fed back) are saved. `copy`: one gather per layer for
    all the rows, over the span of positions any of them covers (for rows about to leave a cache that
    lives on); else the entries refer to the cache itself (its last use: nothing copied)."""
    if not len(batch_rows):
        return
    fed = (lengths[list(batch_rows)] - 1).tolist()
    sampled = tokens[list(batch_rows)].tolist()
    starts = [width - len(prompts[br]) for br in batch_rows]
    a0 = 0
    if copy:
        a0, b1 = min(starts), width + max(fed)
        idx = torch.tensor(list(cache_rows), dtype=torch.long, device=keys[0].device)
        keys = [k[:, :, a0:b1].index_select(0, idx) for k in keys]
        values = [v[:, :, a0:b1].index_select(0, idx) for v in values]
        cache_rows = range(len(batch_rows))
    for cr, br, a, n, gen in zip(cache_rows, batch_rows, starts, fed, sampled):
        store.save((*prompts[br], *gen[:n]), keys, values, cr, a - a0)
