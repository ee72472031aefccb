"""Prefix sharing (MiniMax Forge, "prefix tree merging"): score and train sequences that share a
prefix without recomputing the shared part.

The sequences of a group (the n rollouts of one prompt; the turns of an agent episode that
share earlier turns) start with the same tokens. Padded scoring runs the transformer over that
prefix once per sequence. Here each group's prefix is run once, its keys/values are handed to
every sequence of the group as a KV cache, and only the suffixes are run on top of it:

    prefix forward   [G, P]    -> hidden_P, keys/values per layer
    suffix forward   [B, S]    with cache = keys/values[group_B]   -> hidden_S
    log-probs        prefix positions from hidden_P (once per group), suffix positions from hidden_S

With the lean forward (tether.policy.lean_train, Llama-family models on a CPU) the prefixes and
suffixes run as one forward over the flat tokens instead: same keys/values, same result, no
padding outside attention.

Gradients flow through the cache into the prefix computation (autograd sums the B copies), so
loss and gradients equal the unshared computation up to rounding
(tests/unit/policy/test_prefix_sharing.py). The token saving is sum(P_g * (n_g - 1)): large for
multi-turn groups with long shared contexts, small for short prompts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tether.policy.base import HFPolicy, is_checkpointing
from tether.policy.sampling import _cache_kwarg
from tether.policy.scoring import _backbone_and_head, compute_head_logprobs, count_trained


def compute_shared_prefix_lengths(ids_BT: torch.Tensor, lengths_B: list[int], group_B: list[int]) -> tuple[list[int], dict[int, int]]:
    """Sharing groups and their prefix lengths: (key_B, prefix[key]).

    Within a group the prefix is the longest common prefix of its sequences, at most (shortest
    length - 1) so that every sequence keeps a suffix token. A group whose sequences share no
    first token is split into singletons (a singleton's "prefix" is its own first token)."""
    key_B = list(group_B)
    prefix: dict[int, int] = {}
    fresh = max(group_B, default=0) + 1
    for g in sorted(set(group_B)):
        rows = [b for b, x in enumerate(group_B) if x == g]
        limit = max(1, min(lengths_B[b] for b in rows) - 1)
        first = ids_BT[rows[0], :limit]
        P = limit
        for b in rows[1:]:
            diff = (ids_BT[b, :limit] != first).nonzero()
            if len(diff):
                P = min(P, int(diff[0]))
        if P >= 1:
            prefix[g] = P
            continue
        for b in rows:  # nothing in common: no sharing
            key_B[b], prefix[fresh] = fresh, 1
            fresh += 1
    return key_B, prefix


BUCKET_OVERHEAD_TOKENS = 64  # one more suffix forward costs about as much as this many token positions
MIN_BUCKET_ROWS = 8  # below this the matmuls lose efficiency


def plan_suffix_buckets(lengths_B: list[int], overhead: int | None = None, min_rows: int | None = None) -> list[list[int]]:
    """Rows grouped into buckets of similar length, each padded only to its own longest row:
    the split of the length-sorted rows that minimises sum(rows x longest) + overhead per bucket
    (exact, by dynamic programming over the sorted order)."""
    overhead = BUCKET_OVERHEAD_TOKENS if overhead is None else overhead
    min_rows = MIN_BUCKET_ROWS if min_rows is None else min_rows
    order = sorted(range(len(lengths_B)), key=lambda b: lengths_B[b])
    n = len(order)
    if n == 0:
        return []
    L = [lengths_B[b] for b in order]
    best = [0.0] + [float("inf")] * n  # best[j]: cost of rows order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            if j - i < min_rows and not (i == 0 and j == n):
                continue
            c = best[i] + (j - i) * L[j - 1] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    if best[n] == float("inf"):  # fewer rows than min_rows
        return [order]
    out, j = [], n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


def padded_bucket_positions(lengths_B: list[int]) -> int:
    """Token positions the bucketed suffix forward runs (padding included)."""
    return sum(len(b) * max(lengths_B[i] for i in b) for b in plan_suffix_buckets(lengths_B))


def count_shared_tokens(lengths_B: list[int], group_B: list[int], prefix: dict[int, int]) -> tuple[int, int]:
    """(tokens the unshared path runs, tokens the shared path runs): no padding counted."""
    shared = sum(prefix.values()) + sum(L - prefix[g] for L, g in zip(lengths_B, group_B))
    return sum(lengths_B), shared


def supports_prefix_sharing(model: torch.nn.Module) -> bool:
    """Full-attention transformers models with the Cache API (sliding windows would change the math),
    without activation checkpointing (under it transformers drops the cache the suffixes need)."""
    if is_checkpointing(model):
        return False
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        layers = DynamicCache(config=model.config).layers
    except (ImportError, TypeError, AttributeError):
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _pad_rows(rows: list[torch.Tensor], pad, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return out, mask


def compute_logprobs_shared(
    policy: HFPolicy,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    group_B: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 256,
    kept_BT: torch.Tensor | None = None,
    needed_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`compute_logprobs` with each group's shared prefix computed once (same [B, T] outputs).

    Sequences are right-padded; `group_B` says which sequences may share (their actual common
    prefix is measured here, so a wrong grouping costs speed, never correctness)."""
    model, dev = policy.model, policy.device
    backbone, _ = _backbone_and_head(model)
    ids = input_ids_BT.cpu()
    lengths = attention_mask_BT.long().sum(-1).tolist()
    groups, prefix = compute_shared_prefix_lengths(ids, lengths, [int(g) for g in group_B.tolist()])
    order = sorted(prefix)
    gi = {g: i for i, g in enumerate(order)}
    row_g = torch.tensor([gi[g] for g in groups])
    P_B = torch.tensor([prefix[g] for g in groups])
    rep = {g: groups.index(g) for g in order}
    p_ids, p_mask = _pad_rows([ids[rep[g], :prefix[g]] for g in order], policy.pad_id, ids.dtype)
    s_ids, s_mask = _pad_rows([ids[b, int(P_B[b]):lengths[b]] for b in range(len(lengths))], policy.pad_id, ids.dtype)
    p_kept = s_kept = None
    if kept_BT is not None:  # the sampling mask, laid out like the ids (a shared prefix has one context per position)
        kept = kept_BT.cpu()
        p_kept = _pad_rows([kept[rep[g], :prefix[g]] for g in order], 0, kept.dtype)[0][:, 1:].to(dev)
        s_kept = _pad_rows([kept[b, int(P_B[b]):lengths[b]] for b in range(len(lengths))], 0, kept.dtype)[0]
    p_need = s_need = None
    if needed_BT is not None:  # a prefix position is needed when any of its group's sequences needs it
        need = needed_BT.cpu().bool()
        p_need = _pad_rows([need[[b for b, gb in enumerate(groups) if gb == g], :prefix[g]].any(0) for g in order],
                           False, torch.bool)[0][:, 1:].to(dev)
        s_need = _pad_rows([need[b, int(P_B[b]):lengths[b]] for b in range(len(lengths))], False, torch.bool)[0]
    Pmax, Smax = p_ids.shape[1], s_ids.shape[1]
    S_B = s_mask.sum(-1).tolist()
    buckets = plan_suffix_buckets(S_B)
    lean = _lean_net(policy)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=policy.autocast_bf16):
        if lean is not None:
            hidden_P, suffix = _lean_hidden(policy, lean, p_ids, p_mask, s_ids, s_mask, row_g, P_B, buckets)
        else:
            hidden_P, suffix = _hf_hidden(policy, backbone, p_ids, p_mask, s_ids, s_mask, row_g, P_B, buckets)
    lp_P, ent_P = compute_head_logprobs(model, hidden_P[:, :-1], p_ids[:, 1:].to(dev), temperature, with_entropy, chunk_size,
                                        p_kept, p_need)
    lps, ents = [], []
    for r, W, h, idx in suffix:
        last_P = hidden_P[idx, (P_B[r] - 1).to(dev)][:, None]  # predicts each sequence's first suffix token
        lp_b, ent_b = compute_head_logprobs(model, torch.cat([last_P, h[:, :-1]], dim=1), s_ids[r, :W].to(dev),
                                            temperature, with_entropy, chunk_size,
                                            None if s_kept is None else s_kept[r, :W].to(dev),
                                            None if s_need is None else s_need[r, :W].to(dev))
        lps.append(F.pad(lp_b, (0, Smax - W)))
        ents.append(F.pad(ent_b, (0, Smax - W)))
    inv = torch.argsort(torch.cat([r for r, *_ in suffix])).to(dev)  # bucket order -> row order
    lp_S, ent_S = torch.cat(lps)[inv], torch.cat(ents)[inv]
    index = _assemble_index(lengths, P_B.tolist(), row_g.tolist(), Pmax, Smax, ids.shape[1])
    zero = lp_S.new_zeros(1)
    lp = torch.cat([lp_P.reshape(-1), lp_S.reshape(-1), zero])[index.to(dev)]
    ent = torch.cat([ent_P.reshape(-1), ent_S.reshape(-1), zero])[index.to(dev)]
    return lp, ent


def _hf_hidden(policy, backbone, p_ids, p_mask, s_ids, s_mask, row_g, P_B, buckets):
    """transformers' forward: each group's prefix once into a DynamicCache, then each suffix bucket
    on top of its rows' prefixes. -> (hidden_P [G, Pmax, H], [(rows, W, hidden [rows, W, H], group rows)])."""
    from transformers import DynamicCache

    dev, kw, config = policy.device, _cache_kwarg(backbone), policy.model.config
    Pmax = p_ids.shape[1]
    cache = DynamicCache(config=config)
    p_pos = torch.arange(Pmax)[None].expand(len(p_ids), -1)
    hidden_P = backbone(input_ids=p_ids.to(dev), attention_mask=p_mask.to(dev), position_ids=p_pos.to(dev),
                        use_cache=True, **{kw: cache}).last_hidden_state  # [G, Pmax, H]
    count_trained(policy, hidden_P.shape[0] * Pmax)
    suffix = []
    for r, W in _bucket_rows(buckets, s_mask):  # rows of similar suffix length: little padding
        idx = row_g[r].to(dev)
        rows_cache = DynamicCache(config=config)
        for layer, src in zip(rows_cache.layers, cache.layers):
            layer.update(src.keys[idx], src.values[idx])  # each sequence sees its group's prefix
        s_pos = P_B[r, None] + torch.arange(W)[None]
        mask = torch.cat([p_mask[row_g[r]], s_mask[r, :W]], dim=1)
        h = backbone(input_ids=s_ids[r, :W].to(dev), attention_mask=mask.to(dev), position_ids=s_pos.to(dev),
                     use_cache=True, **{kw: rows_cache}).last_hidden_state  # [rows, W, H]
        count_trained(policy, len(r) * W)
        suffix.append((r, W, h, idx))
    return hidden_P, suffix


def _bucket_rows(buckets: list[list[int]], s_mask: torch.Tensor):
    """(rows, width) of each suffix bucket: its row indices and its longest suffix."""
    S_B = s_mask.sum(-1)
    for rows_b in buckets:
        r = torch.tensor(rows_b)
        yield r, int(S_B[r].max())


def _lean_net(policy: HFPolicy):
    """tether.policy.lean_train.LeanShared, or None when off or the model is not supported."""
    from tether.policy import lean_train

    if policy.lean_train == "off" or not lean_train.supports(policy.model, policy.device):
        return None
    return lean_train.LeanShared(policy.model, policy.autocast_bf16, compile=policy.lean_train == "compile")


def _lean_hidden(policy, net, p_ids, p_mask, s_ids, s_mask, row_g, P_B, buckets):
    """The same hidden states from the lean forward over the flat tokens (no padding in the
    projections and the MLP), gathered into the padded prefix and `buckets` layouts. Compiled, the
    suffixes attend in one bucket, so that one graph serves every batch."""
    from tether.policy.lean_train import shared_layout

    attn_buckets = [list(range(len(s_ids)))] if net.compiled else buckets
    layout = shared_layout(p_ids, p_mask, s_ids, s_mask, row_g, P_B, attn_buckets, net.min_extent)
    h = net(layout)  # [N + 1, H]; row N is zeros (padding)
    count_trained(policy, h.shape[0] - 1)
    dev = h.device
    suffix = [(r, W, h[layout.s_index[r, :W].to(dev)], row_g[r].to(dev)) for r, W in _bucket_rows(buckets, s_mask)]
    return h[layout.p_index.to(dev)], suffix


def _assemble_index(lengths, P_B, row_g, Pmax, Smax, T) -> torch.Tensor:
    """[B, T] positions into cat(lp_P [G, Pmax-1], lp_S [B, Smax], [0]): column t scores token t."""
    G = max(row_g) + 1
    n_P, n_S = G * (Pmax - 1), len(lengths) * Smax
    t = torch.arange(T)[None]
    L, P, g = (torch.tensor(x)[:, None] for x in (lengths, P_B, row_g))
    b = torch.arange(len(lengths))[:, None]
    index = torch.full((len(lengths), T), n_P + n_S, dtype=torch.long)  # column 0 and padding -> 0
    index = torch.where((t >= 1) & (t < P), g * (Pmax - 1) + t - 1, index)  # scored from the group's prefix
    index = torch.where((t >= P) & (t < L), n_P + b * Smax + t - P, index)  # scored from the sequence's suffix
    return index


def compute_sequence_logprobs(
    policy: HFPolicy,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    group_B: torch.Tensor | None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    pack: bool = True,
    share: str = "auto",
    kept_BT: torch.Tensor | None = None,
    needed_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The update's scorer: prefix sharing ("on"; "auto": when it runs fewer token positions than
    the packed or padded alternative), else `compute_logprobs`. Same outputs either way.
    `kept_BT`: the sampler's truncation per token (`tether.policy.hf.apply_sampling_mask`);
    `needed_BT`: the positions whose log-prob is read (a loss mask); the others are 0, without the
    LM head's work (`compute_head_logprobs`)."""
    from tether.policy.scoring import compute_logprobs

    sharded = getattr(policy.model, "tether_sharded_call", None)
    if sharded is not None:  # FSDP2 (tether.dist.fsdp): under the root unit's unshard, one backbone pass per call
        return sharded(lambda: compute_logprobs(policy, input_ids_BT, attention_mask_BT, temperature,
                                                with_entropy=with_entropy, pack=pack, kept_BT=kept_BT,
                                                needed_BT=needed_BT))
    if share != "off" and group_B is not None and supports_prefix_sharing(policy.model):
        lengths = attention_mask_BT.long().sum(-1).tolist()
        if share == "on" or _shared_is_cheaper(input_ids_BT, lengths, group_B, pack):
            return compute_logprobs_shared(policy, input_ids_BT, attention_mask_BT, group_B, temperature, with_entropy,
                                           kept_BT=kept_BT, needed_BT=needed_BT)
    return compute_logprobs(policy, input_ids_BT, attention_mask_BT, temperature, with_entropy=with_entropy, pack=pack,
                            kept_BT=kept_BT, needed_BT=needed_BT)


def _shared_is_cheaper(ids_BT: torch.Tensor, lengths_B: list[int], group_B: torch.Tensor, pack: bool) -> bool:
    """Token positions each path runs (padding included): groups x longest prefix + the suffix
    buckets' rows x longest, against packed rows x width (or sequences x width)."""
    from tether.policy.packing import compute_pack_rows

    if min(lengths_B, default=0) < 2:
        return False
    key, prefix = compute_shared_prefix_lengths(ids_BT.cpu(), lengths_B, [int(g) for g in group_B.tolist()])
    shared = len(prefix) * max(prefix.values()) + padded_bucket_positions([L - prefix[k] for L, k in zip(lengths_B, key)])
    T = max(lengths_B)
    other = (len(compute_pack_rows(lengths_B, T)) if pack else len(lengths_B)) * T
    return shared < other
