"""The trainer group: micro-batch shards cover the batch once, and two gloo ranks that sum their
gradients take exactly the optimizer steps one process takes (losses use global denominators)."""

import pickle

import pytest
import torch

from dist_helpers import make_random_batch
from tether.dist.trainer import compute_rank_shards, find_free_port


def test_shards_are_disjoint_complete_and_balanced():
    micro = [[0, 1], [2], [3, 4, 5], [6], [7, 8]]
    lengths = [10, 10, 40, 5, 5, 5, 30, 8, 8]
    shards = compute_rank_shards(micro, lengths, 2)
    flat = sorted(i for s in shards for mb in s for i in mb)
    assert flat == list(range(9))
    load = [sum(lengths[i] for mb in s for i in mb) for s in shards]
    assert max(load) - min(load) <= 40  # largest-first onto the least loaded rank
    assert compute_rank_shards(micro[:1], lengths, 3)[1:] == [[], []]  # more ranks than micro-batches


def _setup(bundle):
    from tether.config import load_config
    from tether.dist.weights import build_policy_from_bundle
    from tether.optim import build_optimizer

    cfg = load_config(None, ["algo.epochs=2", "algo.mini_batches=2", "train.micro_batch_tokens=24", "train.lr=1e-2"])
    policy = build_policy_from_bundle(bundle)
    policy.model.train()
    opt = build_optimizer(list(policy.model.parameters()), cfg.train.lr, cfg.train.weight_decay, cfg.train.betas)
    return cfg, policy, opt


def _update(bundle, batch, dp=None):
    from tether.update import UpdateContext, run_update

    cfg, policy, opt = _setup(bundle)
    gen = torch.Generator().manual_seed(0) if dp is None or dp.rank == 0 else torch.Generator()
    m = run_update(UpdateContext(policy, opt, cfg.algo, cfg.train, generator=gen, max_len=8, dp=dp), batch)
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}, m


def _rank_main(rank, path, port):
    torch.set_num_threads(1)
    import torch.distributed as tdist

    from tether.dist.trainer import do_init_group

    with open(path, "rb") as fh:
        bundle, batch = pickle.load(fh)
    dp = do_init_group(rank, 2, "127.0.0.1", port, "gloo", 120)
    state, m = _update(bundle, batch if rank == 0 else None, dp)
    if rank == 0:
        torch.save((state, m), str(path) + ".out")
    tdist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tiny, tmp_path):
    import torch.multiprocessing as mp

    from tether.dist.weights import make_model_bundle

    _, _, policy = tiny
    batch = make_random_batch(policy)
    bundle = make_model_bundle(policy)
    one, m1 = _update(bundle, batch)
    path = tmp_path / "job.pkl"
    with open(path, "wb") as fh:
        pickle.dump((bundle, batch), fh)
    mp.spawn(_rank_main, args=(path, find_free_port()), nprocs=2, join=True)
    two, m2 = torch.load(str(path) + ".out")
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-6, rtol=1e-5), k
    assert not torch.equal(one["model.embed_tokens.weight"], bundle_weight(bundle))  # the update did something
    for k in ("pg_loss", "entropy", "grad_norm", "optimizer_steps"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


def bundle_weight(bundle):
    from tether.dist.weights import from_numpy_state

    return from_numpy_state(bundle["arrays"])["model.embed_tokens.weight"]
