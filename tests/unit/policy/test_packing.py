"""Sequence packing: the same log-probs and gradients as padded rows, and no attention across sequences."""

import copy

import pytest
import torch

from tiny_policy_helpers import make_tiny_policy

from tether.policy.hf import compute_logprobs
from tether.policy.packing import compute_pack_plan, compute_pack_rows, supports_packing


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(seed=2)


def _batch(vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(4, vocab, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return ids, mask


def test_first_fit_decreasing_rows():
    rows = compute_pack_rows([10, 3, 7, 2, 10, 5], 10)
    assert sorted(i for r in rows for i in r) == list(range(6))
    assert all(sum([10, 3, 7, 2, 10, 5][i] for i in r) <= 10 for r in rows)
    assert len(rows) == 4  # [10], [10], [7, 3], [5, 2]


def test_plan_restarts_positions_and_indexes_every_token():
    ids, mask = _batch(50, [6, 2, 3, 1])
    plan = compute_pack_plan(ids, [6, 2, 3, 1], pad_id=0)
    assert len(plan.rows) == 2
    flat = plan.ids_RT.reshape(-1)
    for b, L in enumerate([6, 2, 3, 1]):
        assert torch.equal(flat[plan.index_BT[b, :L]], ids[b, :L])
        assert torch.equal(plan.pos_RT.reshape(-1)[plan.index_BT[b, :L]], torch.arange(L))
        assert (plan.index_BT[b, L:] == plan.ids_RT.numel()).all()  # padding -> the zero vector


@pytest.mark.parametrize("bf16", [False, True])
def test_packed_logprobs_and_gradients_equal_padded(policy, bf16):
    assert supports_packing(policy.model)
    lengths = [16, 5, 9, 16, 3, 7, 11, 2]
    ids, mask = _batch(len(policy.tokenizer), lengths)
    out = []
    for pack in (False, True):
        pol = copy.deepcopy(policy)
        pol.autocast_bf16 = bf16
        lp, ent = compute_logprobs(pol, ids, mask, temperature=0.7, with_entropy=True, pack=pack)
        ((lp + 0.1 * ent) * mask).sum().backward()
        out.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in pol.model.named_parameters()}))
    keep = mask.clone()
    keep[:, 0] = False
    tol = 2e-2 if bf16 else 1e-5
    assert torch.allclose(out[0][0][keep], out[1][0][keep], atol=tol)
    assert torch.allclose(out[0][1][keep], out[1][1][keep], atol=tol)
    for n in out[0][2]:
        assert torch.allclose(out[0][2][n], out[1][2][n], atol=tol, rtol=1e-3 if not bf16 else 5e-2), n


def test_no_attention_across_packed_sequences(policy):
    # Sequences 1 and 2 share a packed row; changing sequence 2 leaves sequence 1's log-probs alone.
    lengths = [12, 6, 6]
    ids, mask = _batch(len(policy.tokenizer), lengths)
    assert len(compute_pack_rows(lengths, 12)) == 2
    with torch.no_grad():
        a, _ = compute_logprobs(policy, ids, mask, pack=True)
        ids2 = ids.clone()
        ids2[2, :6] = (ids2[2, :6] + 7) % len(policy.tokenizer)
        b, _ = compute_logprobs(policy, ids2, mask, pack=True)
    assert torch.equal(a[:2], b[:2]) and not torch.equal(a[2], b[2])
