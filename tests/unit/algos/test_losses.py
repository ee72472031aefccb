"""Policy losses and value loss: hand values, gradients, clip metrics, numerics."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import (
    POLICY_LOSSES,
    PolicyLossInputs,
    agg_loss,
    compute_agg_norm,
    compute_value_loss,
)
from tether.config import PolicyLossConfig
from tether.registry import UnknownNameError

NAN, INF = float("nan"), float("inf")
LN = math.log


def _inputs(ratios, advs, old=None, pad=True):
    """One sequence with the given per-token ratios; optionally a poisoned padded position."""
    old = old if old is not None else [-1.0] * len(ratios)
    logp = [o + LN(r) for o, r in zip(old, ratios)]
    mask = [1.0] * len(ratios)
    if pad:  # padding with absurd log-probs and a NaN advantage
        logp, old, advs, mask = logp + [1e4], old + [-1e4], list(advs) + [NAN], mask + [0.0]
    logp_BT = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    return PolicyLossInputs(
        logp_BT=logp_BT,
        old_logp_BT=torch.tensor([old], dtype=torch.float64),
        advantages_BT=torch.tensor([advs], dtype=torch.float64),
        mask_BT=torch.tensor([mask], dtype=torch.float64),
    )


def _run(name, inp, **cfg):
    return POLICY_LOSSES[name](inp, PolicyLossConfig(name=name, **cfg))


# ----------------------------------------------------------------------------- PPO clip


def test_ppo_clip_hand_values_clip_higher():
    # eps_low 0.2, eps_high 0.28 (DAPO); loss = max(-A r, -A clip(r, 0.8, 1.28))
    # t0: r 0.5, A +1: max(-0.5, -0.8) = -0.5   (low ratio with A>0 is not clipped)   grad -A r = -0.5
    # t1: r 1.1, A +1: max(-1.1, -1.1) = -1.1                                          grad -1.1
    # t2: r 1.5, A +1: max(-1.5, -1.28) = -1.28 (clipped high)                          grad 0
    # t3: r 0.7, A -1: max(0.7, 0.8) = 0.8      (clipped low)                           grad 0
    inp = _inputs([0.5, 1.1, 1.5, 0.7], [1, 1, 1, -1])
    loss_BT, m = _run("ppo_clip", inp, clip_low=0.2, clip_high=0.28)
    assert loss_BT[0].tolist() == pytest.approx([-0.5, -1.1, -1.28, 0.8, 0.0])
    loss_BT.sum().backward()
    assert inp.logp_BT.grad[0].tolist() == pytest.approx([-0.5, -1.1, 0.0, 0.0, 0.0])
    # metrics over the 4 masked tokens
    assert m["clip_frac"].item() == pytest.approx(0.5)
    assert m["clip_frac_low"].item() == pytest.approx(0.25)
    assert m["clip_frac_high"].item() == pytest.approx(0.25)
    assert m["ratio_mean"].item() == pytest.approx(3.8 / 4)  # (0.5+1.1+1.5+0.7)/4 = 0.95
    assert m["ratio_max"].item() == pytest.approx(1.5)  # the padded ratio exp(2e4) is not seen
    # approx_kl = mean(r - 1 - ln r): 0.193147 + 0.004690 + 0.094535 + 0.056675 = 0.349047 -> /4
    k3 = [r - 1 - LN(r) for r in (0.5, 1.1, 1.5, 0.7)]
    assert m["approx_kl"].item() == pytest.approx(sum(k3) / 4, rel=1e-5)
    assert "dual_clip_frac" not in m
    for v in m.values():
        assert v.dim() == 0 and not v.requires_grad


def test_ppo_clip_symmetric_default_clips_at_1_2():
    # default eps_high 0.2: r 1.25 with A 1 is clipped -> -1.2; with eps_high 0.28 it would not be
    inp = _inputs([1.25], [1.0], pad=False)
    loss_BT, m = _run("ppo_clip", inp)
    assert loss_BT.item() == pytest.approx(-1.2)
    assert m["clip_frac_high"].item() == 1.0


def test_ppo_dual_clip():
    # A = -1, c = 3:
    # t0: r 5 -> clipped surrogate max(5, 1.2) = 5 -> dual: min(5, 3) = 3, grad 0 (dual-clipped)
    # t1: r 2 -> max(2, 1.2) = 2 < 3 -> stays 2, grad -A r = 2
    inp = _inputs([5.0, 2.0], [-1.0, -1.0])
    loss_BT, m = _run("ppo_clip", inp, dual_clip_c=3.0)
    assert loss_BT[0, :2].tolist() == pytest.approx([3.0, 2.0])
    loss_BT.sum().backward()
    assert inp.logp_BT.grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    assert m["dual_clip_frac"].item() == pytest.approx(0.5)
    # without dual-clip the first token's loss is the unbounded 5
    assert _run("ppo_clip", _inputs([5.0], [-1.0]))[0][0, 0].item() == pytest.approx(5.0)


def test_ppo_log_ratio_clamped_before_exp():
    # log ratio 100 on a real token: clamped to 20 -> ratio e^20 (finite), loss from the clip
    # branch with A<0: max(-A e^20, ...) = e^20; the clamp zeroes the gradient there
    inp = PolicyLossInputs(
        logp_BT=torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True),
        old_logp_BT=torch.tensor([[-100.0]], dtype=torch.float64),
        advantages_BT=torch.tensor([[-1.0]], dtype=torch.float64),
        mask_BT=torch.tensor([[1.0]], dtype=torch.float64),
    )
    loss_BT, m = _run("ppo_clip", inp)
    assert loss_BT.item() == pytest.approx(math.exp(20.0))
    loss_BT.sum().backward()
    assert inp.logp_BT.grad.item() == 0.0
    assert m["ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-6)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_poisoned_padding_gives_finite_loss_and_zero_grad(name):
    # pad: logp 1e4, old -1e4 (log ratio 2e4), advantage NaN; plus an inf pad in a second row
    inp = _inputs([0.9, 1.1], [1.0, -1.0])
    loss_BT, metrics = _run(name, inp, dual_clip_c=3.0 if name == "ppo_clip" else None)
    norm = compute_agg_norm(inp.mask_BT)
    total = agg_loss(loss_BT, inp.mask_BT, "token_mean", norm)
    assert torch.isfinite(total)
    total.backward()
    grad = inp.logp_BT.grad
    assert torch.isfinite(grad).all()
    assert grad[0, 2].item() == 0.0
    assert grad[0, :2].abs().sum() > 0
    for v in metrics.values():
        assert torch.isfinite(v)


def test_ppo_clip_matches_plain_loop():
    gen = torch.Generator().manual_seed(11)
    B, T = 5, 7
    logp = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 1
    old = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=gen) > 0.25).to(torch.float64)
    inp = PolicyLossInputs(logp, old, adv, mask)
    loss_BT, m = _run("ppo_clip", inp, clip_low=0.2, clip_high=0.28, dual_clip_c=3.0)
    n_clip = n_tok = 0
    for i in range(B):
        for t in range(T):
            if mask[i, t] == 0:
                assert loss_BT[i, t].item() == 0.0
                continue
            r, a = math.exp(logp[i, t].item() - old[i, t].item()), adv[i, t].item()
            expected = max(-a * r, -a * min(max(r, 0.8), 1.28))
            if a < 0:
                expected = min(expected, -a * 3.0)
            assert loss_BT[i, t].item() == pytest.approx(expected, rel=1e-12)
            n_tok += 1
            n_clip += (r < 0.8 and a < 0) or (r > 1.28 and a > 0)
    assert m["clip_frac"].item() == pytest.approx(n_clip / n_tok)


# ----------------------------------------------------------------------------- GSPO


def test_gspo_hand_values():
    # token log ratios [0.1, 0.3] -> s = exp(mean) = exp(0.2) = 1.221403, A = 1
    # wide clip (0.5): loss per token -A s = -1.221403, gradient per token -A s = -1.221403
    inp = _inputs([math.exp(0.1), math.exp(0.3)], [1.0, 1.0])
    loss_BT, m = _run("gspo", inp, clip_low=0.5, clip_high=0.5)
    s = math.exp(0.2)
    assert loss_BT[0].tolist() == pytest.approx([-s, -s, 0.0])
    loss_BT.sum().backward()
    assert inp.logp_BT.grad[0].tolist() == pytest.approx([-s, -s, 0.0])
    assert m["ratio_mean"].item() == pytest.approx(s)
    assert m["clip_frac"].item() == 0.0


def test_gspo_paper_clip_range_clips_the_sequence():
    # paper clips 3e-4 / 4e-4: s = 1.221403 > 1.0004 with A = 1 -> loss -1.0004 per token, no gradient
    inp = _inputs([math.exp(0.1), math.exp(0.3)], [1.0, 1.0])
    loss_BT, m = _run("gspo", inp, clip_low=3e-4, clip_high=4e-4)
    assert loss_BT[0, :2].tolist() == pytest.approx([-1.0004, -1.0004])
    loss_BT.sum().backward()
    assert inp.logp_BT.grad.abs().sum().item() == 0.0
    assert m["clip_frac"].item() == 1.0 and m["clip_frac_high"].item() == 1.0


@pytest.mark.parametrize("clip", [(0.5, 0.5), (0.05, 0.08)])
def test_gspo_token_form_has_the_sequence_objective_gradient(clip):
    # Paper objective (arXiv 2507.18071 §4): -(1/G) sum_i min(s_i A_i, clip(s_i) A_i), with
    # s_i = exp(mean_t log r). GSPO-token aggregated by seq_mean_token_mean must have the same grad.
    gen = torch.Generator().manual_seed(5)
    B, T = 4, 6
    lengths = torch.tensor([6, 3, 1, 4])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) - 2
    base = old + 0.1 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv_B = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=torch.float64)
    adv_BT = adv_B[:, None] * mask

    logp_tok = base.clone().requires_grad_(True)
    loss_BT, _ = _run("gspo", PolicyLossInputs(logp_tok, old, adv_BT, mask), clip_low=clip[0], clip_high=clip[1])
    agg_loss(loss_BT, mask, "seq_mean_token_mean", compute_agg_norm(mask)).backward()

    logp_seq = base.clone().requires_grad_(True)
    s_B = torch.exp(((logp_seq - old) * mask).sum(-1) / lengths)
    obj_B = torch.minimum(s_B * adv_B, s_B.clamp(1 - clip[0], 1 + clip[1]) * adv_B)
    (-obj_B.mean()).backward()
    torch.testing.assert_close(logp_tok.grad, logp_seq.grad, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- CISPO


def test_cispo_hand_values():
    # r = [0.5, 1.0, 1.5], A = [1, -1, 2], logp = [-1, -2, -0.5], clip 0.2 / 0.28
    # w = clip(r, 0.8, 1.28) = [0.8, 1.0, 1.28] (detached)
    # loss = -w A logp = [-0.8*1*(-1), -1*(-1)*(-2), -1.28*2*(-0.5)] = [0.8, -2.0, 1.28]
    # grad wrt logp = -w A = [-0.8, 1.0, -2.56]: every token keeps a gradient
    ratios, logp = [0.5, 1.0, 1.5], [-1.0, -2.0, -0.5]
    old = [lp - LN(r) for lp, r in zip(logp, ratios)]
    inp = _inputs(ratios, [1.0, -1.0, 2.0], old=old)
    loss_BT, m = _run("cispo", inp, clip_low=0.2, clip_high=0.28)
    assert loss_BT[0].tolist() == pytest.approx([0.8, -2.0, 1.28, 0.0])
    loss_BT.sum().backward()
    assert inp.logp_BT.grad[0].tolist() == pytest.approx([-0.8, 1.0, -2.56, 0.0])
    assert m["clip_frac"].item() == pytest.approx(2 / 3)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 3)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 3)


def test_cispo_cap_is_one_plus_eps_high_not_absolute():
    # tether (verl convention): eps_high 0.28 caps at 1.28; TRL would cap at 0.28.
    # r = 3, A = 1, logp = -1: loss = -1.28 * 1 * (-1) = 1.28. clip_low >= 1 removes the floor:
    # r = 0.01 keeps w = 0.01 -> loss = -0.01 * 1 * (-1) = 0.01
    inp = _inputs([3.0, 0.01], [1.0, 1.0], old=[-1 - LN(3.0), -1 - LN(0.01)], pad=False)
    loss_BT, _ = _run("cispo", inp, clip_low=1.0, clip_high=0.28)
    assert loss_BT[0].tolist() == pytest.approx([1.28, 0.01])


# ----------------------------------------------------------------------------- value loss


def test_value_loss_hand_values():
    # eps_v 0.2.
    # t0: V 1.0, V_old 0.5, R 2.0: unclipped (1-2)^2 = 1; clipped V = 0.7: (0.7-2)^2 = 1.69
    #     -> 0.5 * 1.69 = 0.845; the clipped branch wins and has no gradient wrt V -> grad 0
    # t1: V 0.0, V_old 0.0, R 1.0: both (0-1)^2 = 1 -> 0.5; grad (V - R) = -1
    # t2: padding with NaN values -> 0, grad 0
    values = torch.tensor([[1.0, 0.0, NAN]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 0.0, INF]], dtype=torch.float64)
    ret = torch.tensor([[2.0, 1.0, NAN]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss_BT = compute_value_loss(values, old, ret, mask, clip=0.2)
    assert loss_BT[0].tolist() == pytest.approx([0.845, 0.5, 0.0])
    loss_BT.sum().backward()
    assert values.grad[0].tolist() == pytest.approx([0.0, -1.0, 0.0])


def test_value_loss_unclipped_branch_when_it_is_larger():
    # V 0.6, V_old 0.5, R 0.0, eps 0.2: clipped V = 0.6 (inside) -> both 0.36 -> 0.18
    # V 0.1, V_old 0.5, R 1.0: clipped V = 0.3 -> (0.3-1)^2 = 0.49; unclipped (0.1-1)^2 = 0.81 wins
    #     -> 0.405, grad V - R = -0.9
    values = torch.tensor([[0.6, 0.1]], dtype=torch.float64, requires_grad=True)
    loss_BT = compute_value_loss(values, torch.tensor([[0.5, 0.5]]), torch.tensor([[0.0, 1.0]]),
                                 torch.ones(1, 2), clip=0.2)
    assert loss_BT[0].tolist() == pytest.approx([0.18, 0.405])
    loss_BT.sum().backward()
    assert values.grad[0].tolist() == pytest.approx([0.6, -0.9])


def test_misspelled_loss_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        POLICY_LOSSES["ppo_clipp"]
    msg = str(err.value)
    assert "Did you mean 'ppo_clip'" in msg
    assert all(n in msg for n in ["cispo", "gspo", "ppo_clip"])


def test_cispo_matches_plain_loop():
    gen = torch.Generator().manual_seed(12)
    B, T = 4, 6
    logp = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 1
    old = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=gen) > 0.25).to(torch.float64)
    loss_BT, _ = _run("cispo", PolicyLossInputs(logp, old, adv, mask), clip_low=0.1, clip_high=0.28)
    for i in range(B):
        for t in range(T):
            lp, a = logp[i, t].item(), adv[i, t].item()
            w = min(max(math.exp(lp - old[i, t].item()), 0.9), 1.28)
            expected = -w * a * lp if mask[i, t] > 0 else 0.0
            assert loss_BT[i, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_value_loss_matches_plain_loop():
    gen = torch.Generator().manual_seed(13)
    v, old, ret = (torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(3, 5, generator=gen) > 0.3).to(torch.float64)
    loss_BT = compute_value_loss(v, old, ret, mask, clip=0.3)
    for i in range(3):
        for t in range(5):
            vi, oi, ri = v[i, t].item(), old[i, t].item(), ret[i, t].item()
            vc = oi + min(max(vi - oi, -0.3), 0.3)
            expected = 0.5 * max((vi - ri) ** 2, (vc - ri) ** 2) if mask[i, t] > 0 else 0.0
            assert loss_BT[i, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"])
def test_full_objective_gradient_invariant_to_micro_batching(mode):
    # policy loss + beta * KL - c * entropy, each through agg_loss with ONE global AggNorm, summed
    # over micro-batches (= gradient accumulation, or data-parallel ranks with all-reduced
    # counts): the gradient of a shared parameter is the same for 1 x 6, 6 x 1 and 3 + 1 + 2.
    from tether.algos import KL_ESTIMATORS, KLInputs
    from tether.config import KLConfig

    gen = torch.Generator().manual_seed(21)
    B, T, V = 6, 5, 4
    base_BTV = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
    tokens_BT = torch.randint(0, V, (B, T), generator=gen)
    old_BT = torch.log_softmax(base_BTV + 0.1 * torch.randn(B, T, V, generator=gen, dtype=torch.float64), -1)
    old_BT = old_BT.gather(-1, tokens_BT[..., None])[..., 0]
    ref_BT = old_BT - 0.2
    adv_BT = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask_BT = (torch.arange(T)[None] < torch.tensor([5, 2, 0, 4, 1, 3])[:, None]).to(torch.float64)
    norm = compute_agg_norm(mask_BT, max_len=8)

    def grad_for(splits):
        bias_V = torch.zeros(V, dtype=torch.float64, requires_grad=True)
        start = 0
        for size in splits:
            sl = slice(start, start + size)
            logprobs_BTV = torch.log_softmax(base_BTV[sl] + bias_V, -1)
            logp_BT = logprobs_BTV.gather(-1, tokens_BT[sl][..., None])[..., 0]
            entropy_BT = -(logprobs_BTV.exp() * logprobs_BTV).sum(-1)
            pg_BT, _ = _run("ppo_clip", PolicyLossInputs(logp_BT, old_BT[sl], adv_BT[sl], mask_BT[sl]))
            kl_BT = KL_ESTIMATORS["k3"](KLInputs(logp_BT, ref_BT[sl], old_BT[sl], mask_BT[sl]), KLConfig())
            m = mask_BT[sl]
            total = agg_loss(pg_BT, m, mode, norm) + 0.1 * agg_loss(kl_BT, m, mode, norm)
            total = total - 0.01 * agg_loss(entropy_BT, m, mode, norm)
            total.backward()
            start += size
        return bias_V.grad

    full = grad_for([6])
    assert full.abs().sum() > 0
    torch.testing.assert_close(grad_for([1] * 6), full, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_for([3, 1, 2]), full, rtol=1e-12, atol=1e-14)
