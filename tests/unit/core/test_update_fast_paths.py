"""The update's speed paths (packing, prefix sharing) give the same update as padded rows."""

import copy

import pytest
import torch
from test_update import base_policy  # noqa: F401  (the same tiny policy fixture)

from tether.config import AlgoConfig, TrainConfig
from tether.types import TrainBatch
from tether.train.update import UpdateContext, run_update


def grouped_batch(vocab, seed=0):
    """3 groups of 3 sequences; each group shares its prompt (5-7 tokens), completions differ in length."""
    g = torch.Generator().manual_seed(seed)
    rows, loss_rows = [], []
    for p in (5, 7, 6):
        prompt = torch.randint(4, vocab, (p,), generator=g)
        for n in (3, 8, 5):
            rows.append(torch.cat([prompt, torch.randint(4, vocab, (n,), generator=g)]))
            loss_rows.append(torch.cat([torch.zeros(p), torch.ones(n)]))
    T = max(len(r) for r in rows)
    B = len(rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    loss = torch.zeros(B, T)
    for i, (r, lm) in enumerate(zip(rows, loss_rows)):
        ids[i, :len(r)], attn[i, :len(r)], loss[i, :len(r)] = r, True, lm
    adv = torch.randn(B, 1, generator=g).expand(B, T) * loss
    rollout = -torch.rand(B, T, generator=g) * loss
    return TrainBatch(ids, attn, loss, rollout, adv.contiguous(), torch.arange(B) // 3, torch.arange(B))


def one_update(policy, batch, pack, share, epochs=1):
    pol = copy.deepcopy(policy)
    algo = AlgoConfig.model_validate({"entropy_coef": 0.01, "epochs": epochs})
    train = TrainConfig(micro_batch_tokens=64, lr=1e-2, grad_clip=None, pack_sequences=pack, share_prefix=share)
    opt = torch.optim.SGD(pol.model.parameters(), lr=1e-2)
    m = run_update(UpdateContext(pol, opt, algo, train, generator=torch.Generator().manual_seed(0), max_len=16), batch)
    return pol, m


@pytest.mark.parametrize("epochs", [1, 2])
def test_packing_and_prefix_sharing_do_not_change_the_update(base_policy, epochs):  # noqa: F811
    batch = grouped_batch(len(base_policy.tokenizer))
    ref, m_ref = one_update(base_policy, batch, pack=False, share="off", epochs=epochs)
    for pack, share in ((True, "off"), (False, "on"), (True, "auto")):
        pol, m = one_update(base_policy, batch, pack, share, epochs)
        for (n, a), b in zip(ref.model.named_parameters(), pol.model.parameters()):
            assert torch.allclose(a, b, atol=1e-6), (pack, share, n)
        assert abs(m["pg_loss"] - m_ref["pg_loss"]) < 1e-5
