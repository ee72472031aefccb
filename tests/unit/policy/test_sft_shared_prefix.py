"""SFT computes the batch's common prefix (system prompt, tool schemas) once: the same loss and
the same update as padded rows (tether.recipes.sft._sft_step with train.share_prefix)."""

import copy

import torch

from tether.train.step import UpdateState

from tiny_policy_helpers import make_tiny_policy

import tether.recipes.sft as sft
from tether.train.batching import SeqRecord
from tether.config import load_config


def _records(vocab: int) -> list[SeqRecord]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(4, vocab, (24,), generator=g).tolist()  # shared by every demonstration
    out = []
    for i, n in enumerate((5, 9, 3, 12, 7, 6)):
        ids = system + torch.randint(4, vocab, (n,), generator=g).tolist()
        mask = [0] * (len(system) + 2) + [1] * (n - 2)
        out.append(SeqRecord(tuple(ids), tuple(mask), (0.0,) * len(ids), (0.0,) * len(ids), i, i, 0.0, True))
    return out


def test_sft_step_with_shared_prefix_equals_padded(monkeypatch):
    policy = make_tiny_policy(seed=5)
    records = _records(len(policy.tokenizer))
    positions, after = {}, {}
    for share in ("off", "on"):
        pol = copy.deepcopy(policy)
        cfg = load_config(None, [f"train.share_prefix='{share}'"])
        # plain SGD: the step is the (clipped) gradient itself; Adam's first step would amplify rounding
        opt = torch.optim.SGD(pol.model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        pol.trained_positions = 0
        loss = sft._sft_step(pol, opt, sched, records, cfg, UpdateState())
        positions[share] = pol.trained_positions
        after[share] = (loss, {n: p.detach().clone() for n, p in pol.model.named_parameters()})
    assert abs(after["off"][0] - after["on"][0]) < 1e-5
    for n, p in after["off"][1].items():
        assert torch.allclose(p, after["on"][1][n], atol=1e-5), n
    assert positions["on"] < positions["off"] - 4 * 24  # the 24-token prefix ran once, not 6 times
