"""Prefix sharing: identical log-probs, entropies and gradients to the unshared path."""

import copy

import pytest
import torch

from tiny_policy_helpers import make_tiny_policy, right_pad

import tether.policy.prefix as prefix_mod
from tether.policy.hf import compute_logprobs, enable_checkpointing
from tether.policy.lean_train import padded_rows
from tether.policy.prefix import (
    compute_logprobs_shared,
    compute_shared_prefix_lengths,
    count_shared_tokens,
    plan_suffix_buckets,
    supports_prefix_sharing,
)


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(seed=3)


def _groups(vocab, seed=0):
    """Group 0: 4 sequences sharing 10 tokens (an earlier turn); group 1: 3 sharing 6; group 2: one."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(4, vocab, (n,), generator=g)  # noqa: E731
    p0, p1 = rand(10), rand(6)
    seqs = [torch.cat([p0, rand(n)]) for n in (5, 1, 8, 3)] + [torch.cat([p1, rand(n)]) for n in (4, 9, 2)] + [rand(7)]
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2])
    ids, mask = right_pad(seqs)
    return ids, mask, group


def test_prefix_lengths_and_token_count(policy):
    ids, mask, group = _groups(len(policy.tokenizer))
    lengths = mask.sum(-1).tolist()
    key, P = compute_shared_prefix_lengths(ids, lengths, group.tolist())
    assert key == group.tolist() and P[0] == 10 and P[1] == 6 and P[2] == 6  # a lone sequence keeps a suffix token
    unshared, shared = count_shared_tokens(lengths, key, P)
    assert unshared - shared == 10 * 3 + 6 * 2
    key, P = compute_shared_prefix_lengths(ids, lengths, [0] * len(ids))  # nothing in common: singletons
    assert len(set(key)) == len(ids) and set(P.values()) == {1}


@pytest.mark.parametrize("forward", ["transformers", "lean"])
@pytest.mark.parametrize("buckets", ["one", "per_length"])
@pytest.mark.parametrize("bf16", [False, True])
def test_shared_prefix_equals_unshared_logprobs_and_gradients(policy, bf16, buckets, forward, monkeypatch):
    assert supports_prefix_sharing(policy.model)
    if buckets == "per_length":  # every distinct suffix length its own suffix forward (8 of them)
        monkeypatch.setattr(prefix_mod, "MIN_BUCKET_ROWS", 1)
        monkeypatch.setattr(prefix_mod, "BUCKET_OVERHEAD_TOKENS", 0)
        assert len(prefix_mod.plan_suffix_buckets([5, 1, 8, 3, 4, 9, 2, 1])) == 7
    ids, mask, group = _groups(len(policy.tokenizer))
    w = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    out = []
    for shared in (False, True):
        pol = copy.deepcopy(policy)
        pol.autocast_bf16 = bf16
        pol.lean_train = "eager" if forward == "lean" else "off"  # tether.policy.lean_train or transformers' modules
        if shared:
            lp, ent = compute_logprobs_shared(pol, ids, mask, group, temperature=0.9, with_entropy=True, chunk_size=4)
        else:
            lp, ent = compute_logprobs(pol, ids, mask, temperature=0.9, with_entropy=True)
        ((lp + 0.1 * ent) * w).sum().backward()
        out.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in pol.model.named_parameters()}))
    keep = mask.clone()
    keep[:, 0] = False
    tol = 3e-2 if bf16 else 1e-5
    assert torch.allclose(out[0][0][keep], out[1][0][keep], atol=tol)
    assert torch.allclose(out[0][1][keep], out[1][1][keep], atol=tol)
    assert (out[1][0][~keep] == 0).all()
    for n in out[0][2]:
        assert torch.allclose(out[0][2][n], out[1][2][n], atol=tol, rtol=1e-4 if not bf16 else 5e-2), n


def test_wrong_grouping_costs_speed_not_correctness(policy):
    ids, mask, _ = _groups(len(policy.tokenizer))
    everyone = torch.zeros(len(ids), dtype=torch.long)  # claims all share: real common prefix is measured
    with torch.no_grad():
        a, _ = compute_logprobs(policy, ids, mask)
        b, _ = compute_logprobs_shared(policy, ids, mask, everyone)
    keep = mask.clone()
    keep[:, 0] = False
    assert torch.allclose(a[keep], b[keep], atol=1e-5)


def test_auto_shares_only_when_it_runs_fewer_positions(policy):
    from tether.policy.prefix import _shared_is_cheaper

    ids, mask, group = _groups(len(policy.tokenizer))
    lengths = mask.sum(-1).tolist()
    assert _shared_is_cheaper(ids, lengths, group, pack=True)  # 10- and 6-token prefixes, short suffixes
    g = torch.Generator().manual_seed(5)
    unrelated = torch.randint(4, len(policy.tokenizer), (6, 12), generator=g)
    assert not _shared_is_cheaper(unrelated, [12] * 6, torch.zeros(6, dtype=torch.long), pack=True)


def test_suffix_buckets_minimise_padded_positions():
    lengths = [64] * 20 + [10] * 20 + [40] * 24
    buckets = plan_suffix_buckets(lengths, overhead=64, min_rows=8)
    assert sorted(i for b in buckets for i in b) == list(range(64))  # every row exactly once
    assert [sorted({lengths[i] for i in b}) for b in buckets] == [[10], [40], [64]]  # one length per bucket
    assert sum(len(b) * max(lengths[i] for i in b) for b in buckets) == 20 * 64 + 20 * 10 + 24 * 40
    assert plan_suffix_buckets([5, 6, 7], min_rows=8) == [[0, 1, 2]]  # too few rows to split
    assert len(plan_suffix_buckets([10] * 30 + [11] * 30, overhead=64)) == 1  # a split would save less than it costs
    assert plan_suffix_buckets([]) == []


def test_trained_positions_count_what_each_path_runs(policy):
    """train/positions: the positions a grad-enabled scoring call ran (padding included)."""
    ids, mask, group = _groups(len(policy.tokenizer))
    pol = copy.deepcopy(policy)
    with torch.no_grad():
        compute_logprobs(pol, ids, mask)
    assert pol.trained_positions == 0  # scoring without gradients is not training work
    compute_logprobs(pol, ids, mask)
    assert pol.trained_positions == ids.numel()  # padded: rows x width
    lengths = mask.sum(-1).tolist()
    key, P = compute_shared_prefix_lengths(ids, lengths, group.tolist())
    suffix = [L - P[k] for L, k in zip(lengths, key)]
    buckets = plan_suffix_buckets(suffix)
    pol.trained_positions, pol.lean_train = 0, "off"  # transformers' forward: padded prefixes and buckets
    compute_logprobs_shared(pol, ids, mask, group)
    padded = len(P) * max(P.values()) + sum(len(b) * max(suffix[i] for i in b) for b in buckets)
    assert pol.trained_positions == padded < ids.numel()
    pol.trained_positions, pol.lean_train = 0, "eager"  # the lean forward: every token once, spare rows to a grid
    compute_logprobs_shared(pol, ids, mask, group)
    tokens = count_shared_tokens(lengths, key, P)[1]
    assert tokens <= pol.trained_positions == padded_rows(tokens) < padded


def test_activation_checkpointing_turns_sharing_off_and_keeps_the_result(policy, tmp_path):
    """Under checkpointing transformers drops the KV cache the suffixes need, so sharing must not
    be used; `model.gradient_checkpointing=true` switches it on for training."""
    from tether.config import load_config
    from tether.policy.hf import is_checkpointing
    from tether.policy.prefix import compute_sequence_logprobs
    from tether.train.setup import setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus

    ids, mask, group = _groups(len(policy.tokenizer))
    out = []
    for ckpt in (False, True):
        pol = copy.deepcopy(policy)
        pol.model.train()
        if ckpt:
            enable_checkpointing(pol.model)
            assert is_checkpointing(pol.model) and not supports_prefix_sharing(pol.model)
        lp, _ = compute_sequence_logprobs(pol, ids, mask, group, share="on")
        (lp * mask).sum().backward()
        out.append((lp.detach(), {n: p.grad.clone() for n, p in pol.model.named_parameters()}))
    keep = mask.clone()
    keep[:, 0] = False  # column 0 is never scored; padding is never in a loss
    assert torch.allclose(out[0][0][keep], out[1][0][keep], atol=1e-5)
    for n in out[0][1]:
        assert torch.allclose(out[0][1][n], out[1][1][n], atol=1e-5, rtol=1e-4), n
    cfg = load_config(None, ["data.task=arith", "data.train_size=20", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
                             "model.tiny.intermediate_size=64", "model.gradient_checkpointing=true"])
    train, _ = setup_problems(cfg.data)
    assert is_checkpointing(setup_policy(cfg.model, cfg.run.seed, tmp_path, lambda: compute_tokenizer_corpus(cfg.data.task, train)).model)
