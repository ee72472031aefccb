"""Shared inputs for the trainer-rank tests (replicated and FSDP2)."""

import torch


def make_random_batch(policy):
    """A 6-row TrainBatch of random ids with ragged lengths, the first 3 positions masked out of
    the loss, rollout log-probs from `policy` and random per-row advantages (2 rows per group)."""
    from tether.policy.hf import compute_logprobs
    from tether.types import TrainBatch

    g = torch.Generator().manual_seed(1)
    B, T = 6, 9
    ids = torch.randint(5, 200, (B, T), generator=g)
    lengths = torch.tensor([9, 7, 9, 5, 8, 6])
    am = (torch.arange(T)[None] < lengths[:, None]).long()
    loss = am.clone().float()
    loss[:, :3] = 0
    with torch.no_grad():
        rollout = compute_logprobs(policy, ids, am, 1.0)[0] * loss
    adv = torch.randn(B, generator=g)[:, None].expand(B, T) * loss
    return TrainBatch(ids, am.bool(), loss, rollout, adv.contiguous(), torch.arange(B) // 2, torch.arange(B))
