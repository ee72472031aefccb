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


def _setup(bundle, overrides=()):
    from tether.config import load_config
    from tether.policy.weights import build_policy_from_bundle
    from tether.optim import build_optimizer

    cfg = load_config(None, ["algo.epochs=2", "algo.mini_batches=2", "train.micro_batch_tokens=24", "train.lr=1e-2",
                             *overrides])
    policy = build_policy_from_bundle(bundle)
    policy.model.train()
    opt = build_optimizer(list(policy.model.parameters()), cfg.train.lr, cfg.train.weight_decay, cfg.train.betas)
    return cfg, policy, opt


def _update(bundle, batch, dp=None, overrides=()):
    from tether.train.update import UpdateContext, run_update

    cfg, policy, opt = _setup(bundle, overrides)
    gen = torch.Generator().manual_seed(0) if dp is None or dp.rank == 0 else torch.Generator()
    m = run_update(UpdateContext(policy, opt, cfg.algo, cfg.train, generator=gen, max_len=8, dp=dp), batch)
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}, m


def _rank_main(rank, path, port):
    torch.set_num_threads(1)
    import torch.distributed as tdist

    from tether.dist.trainer import do_init_group

    with open(path, "rb") as fh:
        bundle, batch, overrides = pickle.load(fh)
    dp = do_init_group(rank, 2, "127.0.0.1", port, "gloo", 120)
    state, m = _update(bundle, batch if rank == 0 else None, dp, overrides)
    torch.save((state, m), f"{path}.out{rank}")
    # both ranks done before either tears gloo down: a rank that exits while its peer still talks to it can
    # abort in gloo's threads ("terminate called without an active exception", seen once on a loaded machine)
    tdist.barrier()
    tdist.destroy_process_group()


# "inert": groups 0 and 2 at zero advantage run forward only (train.skip_zero_advantage); "inert_nan": and a
# NaN in one of those rows (through the TIS weight): every rank must skip the step, as one process does
CASES = {"plain": ((), None), "inert": ((), [0, 2]), "inert_nan": (("algo.correction.mode=truncate",), [0, 2])}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_gloo_ranks_equal_one_process(tiny, tmp_path, case):
    import torch.multiprocessing as mp

    from tether.policy.weights import make_model_bundle

    _, _, policy = tiny
    overrides, inert = CASES[case]
    batch = make_random_batch(policy)
    if inert:
        batch.advantages_BT[torch.isin(batch.seq_group_B, torch.tensor(inert))] = 0.0
    if case == "inert_nan":
        batch.rollout_logp_BT[0][batch.loss_mask_BT[0] > 0] = float("nan")
    bundle = make_model_bundle(policy)
    one, m1 = _update(bundle, batch, overrides=overrides)
    path = tmp_path / "job.pkl"
    with open(path, "wb") as fh:
        pickle.dump((bundle, batch, overrides), fh)
    mp.spawn(_rank_main, args=(path, find_free_port()), nprocs=2, join=True)
    (two, m2), (other, _) = (torch.load(f"{path}.out{r}") for r in (0, 1))
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-6, rtol=1e-5), k
        assert torch.equal(two[k], other[k]), k  # the ranks stay in step
    assert not torch.equal(one["model.embed_tokens.weight"], bundle_weight(bundle))  # the update did something
    # inert_nan: the NaN row's mini-batch is skipped in each of the 2 epochs, the other mini-batch steps
    assert m2["nonfinite_steps"] == m1["nonfinite_steps"] == (2 if case == "inert_nan" else 0)
    if inert:
        assert m2["no_grad_token_frac"] == pytest.approx(m1["no_grad_token_frac"]) and m1["no_grad_token_frac"] > 0
    for k in ("pg_loss", "entropy", "grad_norm", "optimizer_steps"):
        if m1[k] != m1[k]:  # NaN (the loss of the NaN row's mini-batches)
            assert m2[k] != m2[k], k
        else:
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


def bundle_weight(bundle):
    from tether.policy.weights import from_numpy_state

    return from_numpy_state(bundle["arrays"])["model.embed_tokens.weight"]
