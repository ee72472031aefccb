"""Preference losses (DPO, IPO, SimPO), the reverse-KL distillation advantage and weight merging,
against values computed by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos.distill import compute_reverse_kl_advantages
from tether.algos.merge import compute_linear_merge, compute_task_arithmetic
from tether.algos.preference import PREFERENCE_LOSSES, PreferenceInputs, compute_sequence_logps, needs_reference
from tether.config import DPOConfig
from tether.registry import UnknownNameError


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _two_pairs():
    # pair 0: policy (c, r) = (-2, -3), ref (-2.5, -2.5): h = (0.5) - (-0.5) = 1.0
    # pair 1: policy (c, r) = (-4, -1), ref (-3, -2):     h = (-1) - (1)     = -2.0
    c = torch.tensor([-2.0, -4.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([-3.0, -1.0], dtype=torch.float64, requires_grad=True)
    ref_c = torch.tensor([-2.5, -3.0], dtype=torch.float64)
    ref_r = torch.tensor([-2.5, -2.0], dtype=torch.float64)
    return c, r, PreferenceInputs(c, r, ref_c, ref_r)


def test_dpo_loss_and_gradient_on_two_pairs():
    c, r, inp = _two_pairs()
    loss_P, m = PREFERENCE_LOSSES["sigmoid"](inp, DPOConfig(beta=0.5))
    # beta h = 0.5 and -1.0: loss = -log sigma(0.5) = 0.474077, -log sigma(-1) = 1.313262
    assert loss_P.tolist() == pytest.approx([0.4740770, 1.3132617], abs=1e-6)
    loss_P.mean().backward()
    # d/dc of mean_p -log sigma(beta h_p) = -(1/P) beta sigma(-beta h_p); d/dr = +(1/P) beta sigma(-beta h_p)
    # pair 0: 0.5 * 0.5 * sigma(-0.5) = 0.25 * 0.377541 = 0.094385; pair 1: 0.25 * sigma(1) = 0.25 * 0.731059 = 0.182765
    assert c.grad.tolist() == pytest.approx([-0.0943852, -0.1827646], abs=1e-6)
    assert r.grad.tolist() == pytest.approx([0.0943852, 0.1827646], abs=1e-6)
    assert float(m["accuracy"]) == 0.5 and float(m["reward_margin"]) == pytest.approx(-0.5)
    # chosen rewards beta * (0.5, -1) = (0.25, -0.5) -> mean -0.125; rejected beta * (-0.5, 1) -> 0.125
    assert float(m["chosen_reward"]) == pytest.approx(-0.125) and float(m["rejected_reward"]) == pytest.approx(0.125)


def test_ipo_loss_and_gradient_on_two_pairs():
    c, r, inp = _two_pairs()
    loss_P, _ = PREFERENCE_LOSSES["ipo"](inp, DPOConfig(beta=0.5))
    # target 1/(2 beta) = 1: (1 - 1)^2 = 0, (-2 - 1)^2 = 9
    assert loss_P.tolist() == pytest.approx([0.0, 9.0])
    loss_P.mean().backward()
    # d/dc = (1/P) 2 (h - 1) = (0, -3); d/dr = -(that) = (0, 3)
    assert c.grad.tolist() == pytest.approx([0.0, -3.0]) and r.grad.tolist() == pytest.approx([0.0, 3.0])


def test_simpo_is_reference_free_and_length_normalised():
    c = torch.tensor([-2.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([-6.0], dtype=torch.float64, requires_grad=True)
    inp = PreferenceInputs(c, r, chosen_len_P=torch.tensor([2.0]), rejected_len_P=torch.tensor([3.0]))
    loss_P, m = PREFERENCE_LOSSES["simpo"](inp, DPOConfig(beta=2.0, simpo_gamma=0.5))
    # avg logp: -1 and -2; z = 2 * (1) - 0.5 = 1.5; loss = -log sigma(1.5) = 0.201413
    assert float(loss_P[0].detach()) == pytest.approx(-math.log(_sig(1.5)), abs=1e-9)
    loss_P.sum().backward()
    # d/dc = -sigma(-1.5) * beta / |y_w| = -0.182426 * 1.0
    assert float(c.grad[0]) == pytest.approx(-_sig(-1.5) * 2.0 / 2.0, abs=1e-9)
    assert float(r.grad[0]) == pytest.approx(_sig(-1.5) * 2.0 / 3.0, abs=1e-9)
    assert not needs_reference("simpo") and needs_reference("sigmoid") and needs_reference("ipo")
    with pytest.raises(ValueError, match="reference log-probs"):
        PREFERENCE_LOSSES["sigmoid"](PreferenceInputs(c, r), DPOConfig())


def test_unknown_preference_loss_names_the_nearest():
    with pytest.raises(UnknownNameError, match="Did you mean 'ipo'"):
        PREFERENCE_LOSSES["ipoo"]


def test_sequence_logps_sum_masked_tokens_per_owner():
    logp = torch.tensor([[0.0, -1.0, -2.0, -9.0], [0.0, -0.5, -9.0, -9.0], [0.0, -3.0, -9.0, -9.0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.float32)
    # sequences 0 and 2 belong to side 0 (a multi-turn side split in two), sequence 1 to side 1
    lp, n = compute_sequence_logps(logp, mask, torch.tensor([0, 1, 0]), 2)
    assert lp.tolist() == [-6.0, -0.5] and n.tolist() == [3.0, 1.0]


def test_reverse_kl_advantage_on_three_tokens():
    # student sampled 3 tokens with probabilities 0.5, 0.25, 0.8; the teacher gives 0.25, 0.5, 0.8
    # A_t = log p_T - log p_s = log(0.5), log(2), 0; the 4th position is padding (masked)
    s = torch.log(torch.tensor([[0.5, 0.25, 0.8, 0.9]]))
    t = torch.log(torch.tensor([[0.25, 0.5, 0.8, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = compute_reverse_kl_advantages(s, t, mask)
    assert adv[0].tolist() == pytest.approx([math.log(0.5), math.log(2.0), 0.0, 0.0], abs=1e-6)
    # the mean of -A over the tokens is the sampled reverse-KL estimate: (log 2 - log 2 + 0) / 3 = 0
    assert float(-(adv * mask).sum() / 3) == pytest.approx(0.0, abs=1e-6)
    assert compute_reverse_kl_advantages(s, t, mask, kl_coef=0.5)[0, 1] == pytest.approx(0.5 * math.log(2.0), abs=1e-6)


def test_merge_two_state_dicts_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0]), "n": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0]), "n": torch.tensor([7])}
    lin = compute_linear_merge([a, b])
    assert lin["w"].tolist() == [2.0, 4.0] and lin["b"].tolist() == [2.0] and lin["n"].tolist() == [3]
    assert compute_linear_merge([a, b], [0.25, 0.75])["w"].tolist() == [2.5, 5.0]
    # task arithmetic from base a: a + 0.5 (b - a) = [2, 4]; lambda 2 extrapolates: a + 2 (b - a) = [5, 10]
    assert compute_task_arithmetic(a, [b], [0.5])["w"].tolist() == [2.0, 4.0]
    assert compute_task_arithmetic(a, [b], [2.0])["w"].tolist() == [5.0, 10.0]
    with pytest.raises(ValueError, match="sum to 1"):
        compute_linear_merge([a, b], [1.0, 1.0])
    with pytest.raises(ValueError, match="different tensors"):
        compute_linear_merge([a, {"w": b["w"]}])
    bf = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in a.items()}
    assert compute_linear_merge([bf, bf])["w"].dtype == torch.bfloat16
