"""Zero-advantage sequences run forward only (train.skip_zero_advantage): the same update, less work."""

import copy

import pytest
import torch
from test_update import base_policy  # noqa: F401  (the same tiny policy fixture)
from test_update_fast_paths import grouped_batch

from tether.algos import POLICY_LOSSES
from tether.algos.base import PolicyLossInputs
from tether.config import AlgoConfig, PolicyLossConfig, TrainConfig
from tether.types import TrainBatch
from tether.train.update import UpdateContext, UpdateState, can_skip_inert, run_update


def with_inert_groups(batch: TrainBatch, groups) -> TrainBatch:
    adv = batch.advantages_BT.clone()
    adv[torch.isin(batch.seq_group_B, torch.tensor(groups))] = 0.0
    return TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT, batch.rollout_logp_BT, adv,
                      batch.seq_group_B, batch.seq_traj_B)


def updates(policy, batches, skip, loss="ppo_clip", epochs=1, budget=64, share="on", ent=0.0, kl=0.0):
    """Successive updates of one AdamW run (Adam's moments carry across them); the policy and each metrics dict."""
    pol = copy.deepcopy(policy)
    algo = AlgoConfig.model_validate({"entropy_coef": ent, "epochs": epochs, "policy_loss": {"name": loss, "dual_clip_c": 3.0}})
    train = TrainConfig(micro_batch_tokens=budget, lr=1e-2, grad_clip=1.0, share_prefix=share, skip_zero_advantage=skip)
    opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-2, weight_decay=0.01)
    ctx = UpdateContext(pol, opt, algo, train, state=UpdateState(kl_coef=kl), generator=torch.Generator().manual_seed(0),
                        max_len=16)
    return pol, [run_update(ctx, b) for b in batches]


def assert_same_update(a, b, ma, mb):
    for (n, x), y in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.allclose(x, y, atol=1e-6, rtol=1e-5), n
    for step_a, step_b in zip(ma, mb):
        for k, v in step_a.items():
            if k not in ("positions", "no_grad_token_frac"):
                assert step_b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


LISTED = sorted(n for n in POLICY_LOSSES if POLICY_LOSSES.facts(n).zero_at_zero_advantage)


@pytest.mark.parametrize("loss", LISTED)
@pytest.mark.parametrize("epochs,budget,share,inert", [(1, 64, "on", [1]), (2, 64, "off", [0, 2]),
                                                        (1, 10_000, "on", [0, 2]), (1, 12, "off", [1])])
def test_skipping_zero_advantage_rows_keeps_the_update(base_policy, loss, epochs, budget, share, inert):  # noqa: F811
    batch = with_inert_groups(grouped_batch(len(base_policy.tokenizer)), inert)
    full, m_full = updates(base_policy, [batch], False, loss, epochs, budget, share)
    lean, m_lean = updates(base_policy, [batch], True, loss, epochs, budget, share)
    assert_same_update(full, lean, m_full, m_lean)
    assert "no_grad_token_frac" not in m_full[0]
    mask = batch.loss_mask_BT
    expected = float(mask[torch.isin(batch.seq_group_B, torch.tensor(inert))].sum() / mask.sum())
    assert m_lean[0]["no_grad_token_frac"] == pytest.approx(expected)
    assert m_lean[0]["positions"] < m_full[0]["positions"]  # the skipped rows ran no backward


def test_an_all_inert_update_still_steps_the_optimizer(base_policy):  # noqa: F811
    """No row has a gradient: the step must still run (Adam's moments move the weights), as without skipping."""
    first = grouped_batch(len(base_policy.tokenizer))
    silent = with_inert_groups(first, [0, 1, 2])
    full, m_full = updates(base_policy, [first, silent], False)
    lean, m_lean = updates(base_policy, [first, silent], True)
    assert_same_update(full, lean, m_full, m_lean)
    after_first, _ = updates(base_policy, [first], True)
    moved = [not torch.equal(x, y) for x, y in zip(after_first.model.parameters(), lean.model.parameters())]
    assert any(moved)  # the all-zero step changed the weights (momentum), so the comparison above means something
    assert m_lean[1]["no_grad_token_frac"] == 0.0  # run whole, with gradients


def test_skipping_is_off_when_the_loss_has_another_term(base_policy):  # noqa: F811
    def ctx(**algo):
        return UpdateContext(base_policy, None, AlgoConfig.model_validate(algo), TrainConfig())
    assert can_skip_inert(ctx(), kl_in_loss=False)
    assert not can_skip_inert(ctx(entropy_coef=0.01), kl_in_loss=False)
    assert not can_skip_inert(ctx(), kl_in_loss=True)
    off = UpdateContext(base_policy, None, AlgoConfig(), TrainConfig(skip_zero_advantage=False))
    assert not can_skip_inert(off, kl_in_loss=False)
    batch = with_inert_groups(grouped_batch(len(base_policy.tokenizer)), [1])
    _, m = updates(base_policy, [batch], True, ent=0.01)
    assert "no_grad_token_frac" not in m[0]


@pytest.mark.parametrize("loss", POLICY_LOSSES.names())
def test_listed_losses_vanish_at_zero_advantage(loss):
    """Every built-in policy loss is checked: one whose facts say so has exactly zero loss and gradient
    where A = 0; one whose facts say False must not vanish (no built-in says False today)."""
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 6, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    cfg = PolicyLossConfig(name=loss, dual_clip_c=3.0)
    loss_BT, _ = POLICY_LOSSES[loss](PolicyLossInputs(logp, old, torch.zeros(4, 6), mask), cfg)
    loss_BT.sum().backward()
    vanishes = bool((loss_BT == 0).all() and (logp.grad == 0).all())
    assert vanishes == POLICY_LOSSES.facts(loss).zero_at_zero_advantage, loss


def test_a_nonfinite_loss_in_a_skipped_row_still_skips_the_step(base_policy):  # noqa: F811
    """A NaN in a zero-advantage row (here its rollout log-prob, through the TIS weight) makes the loss
    non-finite; without skipping its NaN reaches the gradient and the step is skipped and counted
    (pitfall 5). Skipping runs that row without a backward, and must skip the step all the same."""
    batch = with_inert_groups(grouped_batch(len(base_policy.tokenizer)), [1])
    batch.rollout_logp_BT[4][batch.loss_mask_BT[4] > 0] = float("nan")
    results = {}
    for skip in (False, True):
        pol = copy.deepcopy(base_policy)
        algo = AlgoConfig.model_validate({"correction": {"mode": "truncate"}})
        opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-2)
        state = UpdateState()
        m = run_update(UpdateContext(pol, opt, algo, TrainConfig(micro_batch_tokens=64, skip_zero_advantage=skip),
                                     state=state, generator=torch.Generator().manual_seed(0)), batch)
        results[skip] = (m, state.nonfinite_steps, pol)
        assert m["pg_loss"] != m["pg_loss"]  # the loss is NaN either way
    assert results[False][1] == results[True][1] == 1
    assert results[True][0]["no_grad_token_frac"] > 0
    for x, y in zip(base_policy.model.parameters(), results[True][2].model.parameters()):
        assert torch.equal(x, y)  # no step taken
