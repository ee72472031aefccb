"""The LM head runs only where a log-prob is read (`needed_BT`, the loss mask): the same log-probs,
entropies and gradients there, zeros elsewhere, fewer positions through the head."""

import copy

import pytest
import torch
from test_update import base_policy  # noqa: F401  (the same tiny policy fixture)
from test_update_fast_paths import grouped_batch

import tether.policy.scoring as scoring
from tether.policy.prefix import compute_sequence_logprobs


def score(policy, batch, pack, share, needed):
    pol = copy.deepcopy(policy)
    rows = []
    head = scoring.fp32_head_logits

    def counting(h, *a, **k):
        rows.append(h.shape[:-1].numel())
        return head(h, *a, **k)

    scoring.fp32_head_logits = counting
    try:
        lp, ent = compute_sequence_logprobs(pol, batch.input_ids_BT, batch.attention_mask_BT, batch.seq_group_B, 1.0,
                                            with_entropy=True, pack=pack, share=share,
                                            needed_BT=batch.loss_mask_BT > 0 if needed else None)
    finally:
        scoring.fp32_head_logits = head
    mask = batch.loss_mask_BT
    ((lp * mask).sum() + (ent * mask).sum()).backward()
    grads = [p.grad.clone() for p in pol.model.parameters()]
    return lp.detach(), ent.detach(), grads, sum(rows)


@pytest.mark.parametrize("pack,share", [(False, "off"), (True, "off"), (False, "on")])
def test_needed_positions_only(base_policy, pack, share):  # noqa: F811
    batch = grouped_batch(len(base_policy.tokenizer))
    mask = batch.loss_mask_BT > 0
    lp_all, ent_all, g_all, rows_all = score(base_policy, batch, pack, share, needed=False)
    lp, ent, g, rows = score(base_policy, batch, pack, share, needed=True)
    assert torch.allclose(lp[mask], lp_all[mask], atol=1e-5) and torch.allclose(ent[mask], ent_all[mask], atol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    for a, b in zip(g_all, g):
        assert torch.allclose(a, b, atol=1e-5)
    assert rows == int(mask[:, 1:].sum()) < rows_all  # only the loss positions went through the head


def test_a_shared_prefix_position_is_scored_when_any_sequence_needs_it(base_policy):  # noqa: F811
    """The shared prefix of a group can reach into generated tokens (samples that began alike):
    a prefix position one sequence trains on is scored for all of them."""
    batch = grouped_batch(len(base_policy.tokenizer))
    batch.loss_mask_BT[0, 3] = 1.0  # inside group 0's shared prompt, for its first sequence only
    mask = batch.loss_mask_BT > 0
    lp_all, _, _, _ = score(base_policy, batch, False, "on", needed=False)
    lp, _, _, _ = score(base_policy, batch, False, "on", needed=True)
    assert lp[0, 3] != 0 and torch.allclose(lp[mask], lp_all[mask], atol=1e-5)
