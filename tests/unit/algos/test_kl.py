"""KL estimators: hand values, gradients vs float64 autograd references, numerics, controller."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    KLInputs,
    agg_loss,
    compute_agg_norm,
    compute_kl_in_reward,
)
from tether.config import KLConfig
from tether.registry import UnknownNameError

NAN, INF = float("nan"), float("inf")
LN = math.log
ESTIMATORS = ["k1", "k2", "k3", "k3_iw"]


def _kl(name, inp, clamp=20.0):
    return KL_ESTIMATORS[name](inp, KLConfig(coef=0.1, estimator=name, clamp=clamp))


def test_registry_names():
    assert KL_ESTIMATORS.names() == ESTIMATORS


@pytest.mark.parametrize(
    "name, expected",
    [
        # pi_theta 0.5, pi_ref 0.25: log rho = ln(0.25/0.5) = -0.693147
        ("k1", LN(2)),  # -log rho = 0.693147
        ("k2", 0.5 * LN(2) ** 2),  # 0.5 * 0.480453 = 0.240227
        ("k3", 0.5 - 1 + LN(2)),  # rho - 1 - log rho = 0.5 - 1 + 0.693147 = 0.193147
        ("k3_iw", (0.5 / 0.4) * (0.5 - 1 + LN(2))),  # w = 0.5/0.4 = 1.25 -> 0.241434
    ],
)
def test_hand_values(name, expected):
    inp = KLInputs(
        logp_BT=torch.tensor([[LN(0.5), 3.0]]),
        ref_logp_BT=torch.tensor([[LN(0.25), -INF]]),
        old_logp_BT=torch.tensor([[LN(0.4), INF]]),
        mask_BT=torch.tensor([[1.0, 0.0]]),
    )
    kl_BT = _kl(name, inp)
    assert kl_BT[0, 0].item() == pytest.approx(expected, rel=1e-6)
    assert kl_BT[0, 1].item() == 0.0


def _reference_kl(name, logp, ref, old):
    """The exact formulas, float64, no clamp and no where: used on clean inputs only."""
    log_rho = ref - logp
    if name == "k1":
        return logp - ref
    if name == "k2":
        return 0.5 * (logp - ref) ** 2
    k3 = torch.exp(log_rho) - 1 - log_rho
    return k3 if name == "k3" else torch.exp(logp - old) * k3


def _analytic_dkl_dlogp(name, logp, ref, old):
    """d k / d logp per token (hand derivation): k1 -> 1; k2 -> logp - ref; k3 -> 1 - rho;
    k3_iw -> w k3 + w (1 - rho) with w = exp(logp - old), rho = exp(ref - logp)."""
    rho = torch.exp(ref - logp)
    if name == "k1":
        return torch.ones_like(logp)
    if name == "k2":
        return logp - ref
    if name == "k3":
        return 1 - rho
    w = torch.exp(logp - old)
    return w * (rho - 1 - (ref - logp)) + w * (1 - rho)


def _logit_setup(seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, T, V = 3, 5, 7
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    def sampled_logp(logits_BTV):
        return torch.log_softmax(logits_BTV, -1).gather(-1, tokens[..., None])[..., 0]

    ref = sampled_logp(torch.randn(B, T, V, generator=gen, dtype=torch.float64))
    old = sampled_logp(torch.randn(B, T, V, generator=gen, dtype=torch.float64))
    mask = (torch.arange(T)[None] < torch.tensor([5, 3, 1])[:, None]).to(torch.float64)
    return logits, tokens, ref, old, mask


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_gradient_wrt_logits_matches_float64_reference(name, mode):
    logits, tokens, ref, old, mask = _logit_setup()
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    norm = compute_agg_norm(mask)
    agg_loss(_kl(name, KLInputs(logp, ref, old, mask)), mask, mode, norm).backward()
    ours = logits.grad.clone()

    logits.grad = None
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    per_tok = _reference_kl(name, logp, ref, old) * mask
    if mode == "token_mean":
        ref_loss = per_tok.sum() / mask.sum()
    else:
        ref_loss = (per_tok.sum(-1) / mask.sum(-1)).mean()
    ref_loss.backward()
    torch.testing.assert_close(ours, logits.grad, rtol=1e-10, atol=1e-12)
    assert ours.abs().sum() > 0
    # padded tokens (rows 1 and 2 beyond their lengths) get no gradient at all
    assert (ours[1, 3:] == 0).all() and (ours[2, 1:] == 0).all()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_gradient_wrt_logp_matches_hand_derivation(name):
    _, _, ref, old, mask = _logit_setup(seed=1)
    logp = (ref + 0.3 * torch.randn(ref.shape, dtype=torch.float64)).requires_grad_(True)
    _kl(name, KLInputs(logp, ref, old, mask)).sum().backward()
    expected = _analytic_dkl_dlogp(name, logp.detach(), ref, old) * mask
    torch.testing.assert_close(logp.grad, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("beta", [0.001, 0.04, 1.0])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_kl_gradient_nonzero_whenever_beta_positive(name, beta):
    # docs/design.md, correctness rule 23 (SkyRL PR#1353: a no_grad around the KL loss): grad of beta * agg(kl) is
    # non-zero and scales linearly with beta
    logits, tokens, ref, old, mask = _logit_setup(seed=2)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    kl = _kl(name, KLInputs(logp, ref, old, mask))
    assert kl.requires_grad
    (g_beta,) = torch.autograd.grad(beta * agg_loss(kl, mask, "token_mean", compute_agg_norm(mask)), logits,
                                    retain_graph=True)
    (g_one,) = torch.autograd.grad(agg_loss(kl, mask, "token_mean", compute_agg_norm(mask)), logits)
    assert g_beta.abs().sum() > 0
    torch.testing.assert_close(g_beta, beta * g_one)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "constant_norm"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_extreme_logps_at_padding_finite_loss_zero_grad(name, mode):
    # one real token per row, then padding with +-1e4, +-inf and NaN in logp / ref / old
    logp = torch.tensor([[LN(0.5), 1e4, -1e4, INF], [LN(0.3), -INF, NAN, 1e4]], dtype=torch.float64,
                        requires_grad=True)
    ref = torch.tensor([[LN(0.25), -1e4, 1e4, -INF], [LN(0.2), INF, 1e4, NAN]], dtype=torch.float64)
    old = torch.tensor([[LN(0.4), -INF, INF, 1e4], [LN(0.3), 1e4, -1e4, INF]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]], dtype=torch.float64)
    kl = _kl(name, KLInputs(logp, ref, old, mask))
    loss = agg_loss(kl, mask, mode, compute_agg_norm(mask, max_len=4))
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[:, 1:] == 0).all()
    assert (logp.grad[:, 0] != 0).all()


def test_k3_clamp_binds_and_zeroes_gradient():
    # log rho = ref - logp = 30 on a REAL token: clamped to 20 -> k3 = e^20 - 1 - 20, finite;
    # the clamp has no gradient where it binds (documented trade-off)
    logp = torch.tensor([[-30.0]], dtype=torch.float64, requires_grad=True)
    inp = KLInputs(logp, torch.tensor([[0.0]], dtype=torch.float64), torch.tensor([[-30.0]], dtype=torch.float64),
                   torch.ones(1, 1, dtype=torch.float64))
    kl = _kl("k3", inp)
    assert kl.item() == pytest.approx(math.exp(20) - 21)
    kl.sum().backward()
    assert logp.grad.item() == 0.0


def test_kl_in_reward_hand_values():
    # old 0.5 / ref 0.25 -> k1 = ln 2 = 0.693147 on token 0; old == ref on token 1 -> 0
    # rewards [0, 1] - 0.1 * [0.693147, 0] = [-0.0693147, 1.0]; the padded reward (5) is untouched
    rewards = torch.tensor([[0.0, 1.0, 5.0]])
    old = torch.tensor([[LN(0.5), LN(0.5), NAN]])
    ref = torch.tensor([[LN(0.25), LN(0.5), -INF]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    new, kl = compute_kl_in_reward(rewards, old, ref, mask, coef=0.1, estimator="k1")
    assert new[0].tolist() == pytest.approx([-0.1 * LN(2), 1.0, 5.0], rel=1e-6)
    assert kl[0].tolist() == pytest.approx([LN(2), 0.0, 0.0], rel=1e-6)
    # k3 estimator: 0.193147 * 0.1
    new3, _ = compute_kl_in_reward(rewards, old, ref, mask, coef=0.1, estimator="k3")
    assert new3[0, 0].item() == pytest.approx(-0.1 * (0.5 - 1 + LN(2)), rel=1e-6)
    with pytest.raises(UnknownNameError, match="k3_iw"):
        compute_kl_in_reward(rewards, old, ref, mask, coef=0.1, estimator="k4")


def test_adaptive_kl_controller_hand_values_and_state():
    # Ziegler et al.: e = clip(KL/target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1, horizon=100)
    # KL 0.2: e = clip(1.0) = 0.2 -> 0.1 * (1 + 0.2*10/100) = 0.102
    assert ctl.update(0.2, n_steps=10) == pytest.approx(0.102)
    # KL = target: e = 0 -> unchanged
    assert ctl.update(0.1, n_steps=10) == pytest.approx(0.102)
    # KL 0.09: e = -0.1 -> 0.102 * (1 - 0.1*10/100) = 0.102 * 0.99 = 0.10098
    assert ctl.update(0.09, n_steps=10) == pytest.approx(0.10098)
    state = ctl.state_dict()
    other = AdaptiveKLController(init_coef=1.0, target=1.0, horizon=1)
    other.load_state_dict(state)
    assert other.state_dict() == state
    # KL 0.0: e = clip(-1) = -0.2 -> 0.10098 * 0.98 on both
    assert other.update(0.0, 10) == pytest.approx(ctl.update(0.0, 10)) == pytest.approx(0.10098 * 0.98)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


def test_misspelled_estimator_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        KL_ESTIMATORS["k33"]
    assert all(n in str(err.value) for n in ESTIMATORS)
