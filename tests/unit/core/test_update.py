"""The update: micro-batching never changes the gradient; non-finite steps are skipped and halt."""

import copy

import pytest
import torch

from tether.config import AlgoConfig, TinyModelConfig, TrainConfig
from tether.policy.hf import make_policy
from tether.policy.tiny import build_tiny_model, build_tokenizer
from tether.types import TrainBatch
from tether.train.update import TrainingHalted, UpdateContext, UpdateState, run_update


@pytest.fixture(scope="module")
def base_policy():
    tok = build_tokenizer([f"{a}+{b}={a + b}" for a in range(20) for b in range(20)], 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=0)
    return make_policy(model, tok)


def make_batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 12
    lengths = torch.tensor([12, 5, 9, 12, 7, 3])
    ids = torch.randint(0, vocab, (B, T), generator=g)
    attn = torch.arange(T)[None] < lengths[:, None]
    loss = (attn & (torch.arange(T)[None] >= 2)).float()
    adv = torch.randn(B, 1, generator=g).expand(B, T) * loss
    rollout = -torch.rand(B, T, generator=g) * loss
    return TrainBatch(ids, attn, loss, rollout, adv.contiguous(), torch.arange(B) // 2, torch.arange(B))


def one_update(policy, batch, budget, mode, kl=0.0, ent=0.0):
    pol = copy.deepcopy(policy)
    algo = AlgoConfig.model_validate({"agg": {"mode": mode}, "entropy_coef": ent})
    train = TrainConfig(micro_batch_tokens=budget, lr=1e-2, grad_clip=None)
    opt = torch.optim.SGD(pol.model.parameters(), lr=1e-2)
    m = run_update(UpdateContext(pol, opt, algo, train, state=UpdateState(kl_coef=kl), generator=torch.Generator().manual_seed(0),
                                 max_len=12), batch)
    return pol, m


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"])
def test_micro_batching_does_not_change_the_update(base_policy, mode):
    batch = make_batch(len(base_policy.tokenizer))
    whole, m1 = one_update(base_policy, batch, budget=10_000, mode=mode, ent=0.01)
    split, m2 = one_update(base_policy, batch, budget=12, mode=mode, ent=0.01)  # one row per micro-batch
    for (n, a), (_, b) in zip(whole.model.named_parameters(), split.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), n
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], rel=1e-4, abs=1e-7)


def test_entropy_bonus_moves_weights_only_when_weighted(base_policy):
    """entropy_coef=0 skips the entropy's backward (a metric only); any other value must still
    push the weights, and the metric is reported either way."""
    batch = make_batch(len(base_policy.tokenizer))
    none, m0 = one_update(base_policy, batch, 10_000, "token_mean", ent=0.0)
    bonus, m1 = one_update(base_policy, batch, 10_000, "token_mean", ent=0.5)
    assert m0["entropy"] == pytest.approx(m1["entropy"], rel=1e-6) and m0["entropy"] > 0
    assert abs(m1["grad_norm"] - m0["grad_norm"]) > 1e-3 * m0["grad_norm"]  # the bonus is in the gradient
    again, _ = one_update(base_policy, batch, 10_000, "token_mean", ent=0.0)
    moved = [float((a - b).detach().abs().max()) for a, b in zip(none.model.parameters(), bonus.model.parameters())]
    same = [float((a - b).detach().abs().max()) for a, b in zip(none.model.parameters(), again.model.parameters())]
    assert max(same) == 0.0 and max(moved) > 0.0


def test_fused_old_logprobs_give_ratio_one(base_policy):
    batch = make_batch(len(base_policy.tokenizer))
    _, m = one_update(base_policy, batch, 10_000, "token_mean")
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["clip_frac"] == 0.0
    assert m["logp_gap_mean"] > 0  # random "rollout" log-probs differ from the model's


def test_two_epochs_clip(base_policy):
    # with M > 1 the second pass sees ratio != 1 and clipping can fire (trl#3120)
    pol = copy.deepcopy(base_policy)
    batch = make_batch(len(pol.tokenizer))
    algo = AlgoConfig.model_validate({"epochs": 4, "policy_loss": {"clip_low": 0.01, "clip_high": 0.01}})
    opt = torch.optim.Adam(pol.model.parameters(), lr=1e-2)
    m = run_update(UpdateContext(pol, opt, algo, TrainConfig(grad_clip=None)), batch)
    assert m["clip_frac"] > 0 and m["optimizer_steps"] == 4


def test_nonfinite_steps_are_skipped_then_halt(base_policy):
    pol = copy.deepcopy(base_policy)
    batch = make_batch(len(pol.tokenizer))
    bad = TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT, batch.rollout_logp_BT,
                     torch.full_like(batch.advantages_BT, float("nan")), batch.seq_group_B, batch.seq_traj_B)
    before = [p.detach().clone() for p in pol.model.parameters()]
    opt = torch.optim.SGD(pol.model.parameters(), lr=1e-2)
    state = UpdateState()
    train = TrainConfig(max_bad_steps=2)
    m = run_update(UpdateContext(pol, opt, AlgoConfig(), train, state=state), bad)
    assert state.nonfinite_steps == 1 and m["nonfinite_steps"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, pol.model.parameters()))  # weights untouched
    with pytest.raises(TrainingHalted, match="non-finite"):
        run_update(UpdateContext(pol, opt, AlgoConfig(), train, state=state), bad)
    run_update(UpdateContext(pol, opt, AlgoConfig(), train), batch)  # a good batch still trains


@pytest.mark.parametrize("budget", [1000, 20])  # one micro-batch, or several: the probe rows are spread over them
def test_fused_probe_takes_its_before_from_the_training_forward(base_policy, budget):
    """One pass, one mini-batch: `update/logp_gain` reads the probe rows' log-probs before the update
    from the training forward (no second forward); it equals the gain two scoring passes give."""
    from tether.train.probes import choose_probe_rows, compute_logp_progress, probe_size
    from tether.train.update import compute_batch_logprobs

    batch = make_batch(len(base_policy.tokenizer), seed=3)
    pol = copy.deepcopy(base_policy)
    rows = choose_probe_rows(batch.advantages_BT, batch.loss_mask_BT, probe_size(batch.num_seqs))
    before = compute_batch_logprobs(pol, batch.select(rows), 1.0, budget)
    algo, train = AlgoConfig(), TrainConfig(micro_batch_tokens=budget, lr=1e-2, grad_clip=None)
    m = run_update(UpdateContext(pol, torch.optim.SGD(pol.model.parameters(), lr=1e-2), algo, train, max_len=12,
                                 probes=True), batch)
    after = compute_batch_logprobs(pol, batch.select(rows), 1.0, budget)
    want = compute_logp_progress(before, after, batch.select(rows).advantages_BT, batch.select(rows).loss_mask_BT)
    assert m["update/logp_gain"] == pytest.approx(want["update/logp_gain"], abs=1e-5)
    assert m["update/logp_change"] == pytest.approx(want["update/logp_change"], abs=1e-5)
