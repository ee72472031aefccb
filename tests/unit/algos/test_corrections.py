"""IS corrections, mismatch metrics, off-policy masking, dynamic sampling, compact filtering."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import (
    GROUP_FILTERS,
    IS_CORRECTIONS,
    ISInputs,
    compute_mismatch_metrics,
    compute_off_policy_mask,
    compute_overlong_penalty,
    compute_stop_reason_weights,
    select_groups,
)
from tether.config import DynamicSamplingConfig, ISCorrectionConfig
from tether.registry import UnknownNameError
from tether.types import StopReason

NAN, INF = float("nan"), float("inf")
LN = math.log


def _is_inputs(log_ratios_rows, lengths, T=None):
    """old - rollout = the given log ratios; padded positions poisoned with +-inf."""
    T = T or max(lengths) + 1
    old, roll, mask = [], [], []
    for row, n in zip(log_ratios_rows, lengths):
        o = [-1.0 + x for x in row[:n]] + [INF] * (T - n)
        r = [-1.0] * n + [-INF] * (T - n)
        old.append(o)
        roll.append(r)
        mask.append([1.0] * n + [0.0] * (T - n))
    old_t = torch.tensor(old, requires_grad=True)
    return ISInputs(old_logp_BT=old_t, rollout_logp_BT=torch.tensor(roll), mask_BT=torch.tensor(mask))


def _correct(mode, inp, **cfg):
    return IS_CORRECTIONS[mode](inp, ISCorrectionConfig(mode=mode, **cfg))


def test_token_truncate_hand_values():
    # w = pi_old/mu = [3, 0.5, 1]; threshold 2 -> [2, 0.5, 1]; 1 of 3 tokens truncated
    # is_weight_mean = (2 + 0.5 + 1)/3 = 1.166667
    inp = _is_inputs([[LN(3), LN(0.5), 0.0]], [3])
    w, m = _correct("truncate", inp, threshold_high=2.0)
    assert w[0].tolist() == pytest.approx([2.0, 0.5, 1.0, 0.0])
    assert not w.requires_grad
    assert m["is_trunc_frac"].item() == pytest.approx(1 / 3)
    assert m["is_weight_mean"].item() == pytest.approx(3.5 / 3)


def test_sequence_truncate_hand_values():
    # seq 0: log ratios [ln 2, ln 1.5] -> w = exp(ln 3) = 3 -> truncated to 2 on both tokens
    # seq 1: [ln 0.5] -> w = 0.5 (not truncated)
    inp = _is_inputs([[LN(2), LN(1.5)], [LN(0.5), 0.0]], [2, 1])
    w, m = _correct("truncate", inp, level="sequence", threshold_high=2.0)
    assert w[0].tolist() == pytest.approx([2.0, 2.0, 0.0])
    assert w[1].tolist() == pytest.approx([0.5, 0.0, 0.0])
    assert m["is_trunc_frac"].item() == pytest.approx(2 / 3)  # token-weighted: 2 of 3 tokens


def test_mask_mode_keeps_weight_inside_bounds():
    # w = [3, 0.5, 1, 0.3], bounds [0.4, 2] -> [0, 0.5, 1, 0]; 2 of 4 masked
    inp = _is_inputs([[LN(3), LN(0.5), 0.0, LN(0.3)]], [4])
    w, m = _correct("mask", inp, threshold_low=0.4, threshold_high=2.0)
    assert w[0].tolist() == pytest.approx([0.0, 0.5, 1.0, 0.0, 0.0])
    assert m["is_mask_frac"].item() == pytest.approx(0.5)
    assert m["is_weight_mean"].item() == pytest.approx(1.5 / 4)


def test_none_mode_is_the_mask():
    inp = _is_inputs([[LN(3), 0.0]], [2])
    w, m = _correct("none", inp)
    assert w[0].tolist() == [1.0, 1.0, 0.0]
    assert m["is_weight_mean"].item() == pytest.approx(2.0)  # raw mean (3 + 1)/2, for diagnosis


@pytest.mark.parametrize("mode", ["none", "truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_finite_with_poisoned_padding_and_huge_ratios(mode, level):
    # a real token with log ratio 100 (clamped to 20 before exp) and inf/-inf padding
    inp = _is_inputs([[100.0, 0.0]], [2], T=4)
    cfg = {"threshold_low": 0.5} if mode == "mask" else {}
    w, m = _correct(mode, inp, level=level, **cfg)
    assert torch.isfinite(w).all()
    assert (w[0, 2:] == 0).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_mismatch_metrics_hand_values():
    # old - rollout: seq 0 [0.1, -0.1], seq 1 [0.2] (+ padding)
    # gap mean = (0.1 + 0.1 + 0.2)/3 = 0.133333; gap max 0.2
    # k3(x) = e^x - 1 - x: 0.0051709 + 0.0048374 + 0.0214028 = 0.0314111 -> /3 = 0.0104704
    # ESS: sequence log-weights [0, 0.2] -> w = [1, 1.221403];
    #      (1 + 1.221403)^2 / (2 * (1 + 1.491825)) = 4.934631 / 4.983649 = 0.990164
    inp = _is_inputs([[0.1, -0.1], [0.2, 0.0]], [2, 1])
    m = compute_mismatch_metrics(inp.old_logp_BT, inp.rollout_logp_BT, inp.mask_BT)
    assert m["logp_gap_mean"].item() == pytest.approx(0.4 / 3, rel=1e-5)
    assert m["logp_gap_max"].item() == pytest.approx(0.2, rel=1e-5)
    assert m["logp_gap_signed"].item() == pytest.approx(-0.2 / 3, rel=1e-5)  # log mu - log pi: (-0.1 + 0.1 - 0.2)/3
    k3 = sum(math.exp(x) - 1 - x for x in (0.1, -0.1, 0.2)) / 3
    assert m["rollout_kl_k3"].item() == pytest.approx(k3, rel=1e-4)
    w = [1.0, math.exp(0.2)]
    assert m["ess"].item() == pytest.approx(sum(w) ** 2 / (2 * sum(x * x for x in w)), rel=1e-5)
    assert m["ess"].item() == pytest.approx(0.990164, rel=1e-5)


def test_mismatch_metrics_report_an_injected_offset():
    # docs/design.md, correctness rule 3: a fixed rollout-side offset of 0.3 nats on every token shows up exactly
    old = torch.randn(4, 6)
    mask = torch.ones(4, 6)
    m = compute_mismatch_metrics(old, old - 0.3, mask)
    assert m["logp_gap_mean"].item() == pytest.approx(0.3, rel=1e-5)
    assert m["ess"].item() == pytest.approx(1.0)  # the same weight for every sequence
    assert compute_mismatch_metrics(old, old, mask)["rollout_kl_k3"].item() == 0.0


def test_off_policy_mask_hand_values():
    # mean_t log(mu/pi): seq 0 = 0.6 > delta 0.5 with A < 0 -> dropped
    #                    seq 1 = 0.6 > 0.5 but A > 0        -> kept (positives always kept)
    #                    seq 2 = 0.1 <= 0.5 with A < 0      -> kept
    #                    seq 3: tokens [0.9, 0.5] mean 0.7 but its padding is poisoned -> dropped
    rollout = torch.tensor([[0.6, 0.6], [0.6, 0.6], [0.1, 0.1], [0.9, 0.5]]) - 1.0
    logp = torch.full((4, 2), -1.0)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [-0.5, -0.5]])
    mask = torch.ones(4, 2)
    out = compute_off_policy_mask(rollout, logp, adv, mask, delta=0.5)
    assert out.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


def test_off_policy_mask_ignores_padding():
    # padded position with a huge mu/pi gap must not count towards the mean (mean = 0.1)
    rollout = torch.tensor([[-0.9, 1e4]])
    logp = torch.tensor([[-1.0, -INF]])
    out = compute_off_policy_mask(rollout, logp, torch.tensor([[-1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), 0.5)
    assert out.tolist() == [[1.0, 0.0]]


def test_misspelled_correction_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        IS_CORRECTIONS["truncated"]
    assert all(n in str(err.value) for n in ["mask", "none", "truncate"])


# ----------------------------------------------------------------------------- dynamic sampling


@pytest.mark.parametrize(
    "outcomes, keep",
    [
        ([0.0, 0.0, 0.0], False),  # all wrong
        ([1.0, 1.0], False),  # all right
        ([1.0, 0.0, 0.0], True),
        ([1.0, 1.0 + 1e-9], False),  # below tol 1e-6: no exact float comparison
        ([NAN, 1.0, 0.0], True),  # a failed reward is ignored
        ([NAN, 1.0], False),  # one finite outcome left
        ([1.0], False),  # group of one
        ([], False),
    ],
)
def test_zero_variance_filter(outcomes, keep):
    assert GROUP_FILTERS["zero_variance"](outcomes, DynamicSamplingConfig(enable=True)) is keep


def test_select_groups_enable_and_disable():
    groups = [[0, 0, 0], [1, 0, 1], [1, 1, 1], [0, 1, 0]]
    keep, m = select_groups(groups, DynamicSamplingConfig(enable=True))
    assert keep == [1, 3]
    assert m["frac_zero_variance"].item() == 0.5
    assert m["num_kept"].item() == 2.0 and m["num_groups"].item() == 4.0
    keep_all, m_off = select_groups(groups, DynamicSamplingConfig(enable=False))
    assert keep_all == [0, 1, 2, 3]
    assert m_off["frac_zero_variance"].item() == 0.5  # still reported


def test_filter_on_raw_outcome_drops_all_wrong_group_despite_length_shaping():
    # docs/design.md, correctness rule 9 (NeMo-RL#2431): an all-wrong group with overlong shaping has spread-out
    # SHAPED rewards (0, -0.5, -1) and would survive a filter on them; on raw outcomes it is dropped
    raw = [0.0, 0.0, 0.0]
    penalty = compute_overlong_penalty(torch.tensor([10, 18, 20]), max_len=20, cache_len=4).tolist()
    assert penalty == pytest.approx([0.0, -0.5, -1.0])
    shaped = [r + p for r, p in zip(raw, penalty)]
    cfg = DynamicSamplingConfig(enable=True)
    assert GROUP_FILTERS["zero_variance"](shaped, cfg) is True  # the trap
    keep, m = select_groups([raw], cfg)
    assert keep == [] and m["frac_zero_variance"].item() == 1.0


def test_misspelled_filter_lists_valid_names():
    with pytest.raises(UnknownNameError, match="zero_variance"):
        select_groups([[0, 1]], DynamicSamplingConfig(), name="zero_var")


# ----------------------------------------------------------------------------- compact filtering


def test_stop_reason_weights_per_reason_policy():
    reasons = ["eos", "length", "timeout", "max_turns", StopReason.LENGTH, StopReason.DONE]
    policy = {"length": "mask", "timeout": "zero", "max_turns": "keep"}
    weight_B, zero_B = compute_stop_reason_weights(reasons, policy)
    # eos keep; length mask (weight 0); timeout zero (reward override); max_turns keep;
    # the StopReason enum member is looked up by its value; done is not in the policy -> keep
    assert weight_B.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert zero_B.tolist() == [False, False, True, False, False, False]


def test_stop_reason_bad_policy_raises():
    with pytest.raises(ValueError, match="mask, keep, zero"):
        compute_stop_reason_weights(["length"], {"length": "drop"})


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_is_weights_match_plain_loop(mode, level):
    gen = torch.Generator().manual_seed(4)
    B, T = 5, 4
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) - 1
    roll = old + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = [4, 2, 0, 3, 1]
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).to(torch.float64)
    cfg = {"threshold_low": 0.6} if mode == "mask" else {}
    w, _ = _correct(mode, ISInputs(old, roll, mask), level=level, threshold_high=1.5, **cfg)
    for i, n in enumerate(lengths):
        seq_log = sum(old[i, t].item() - roll[i, t].item() for t in range(n))
        for t in range(T):
            if t >= n:
                assert w[i, t].item() == 0.0
                continue
            raw = math.exp(seq_log if level == "sequence" else old[i, t].item() - roll[i, t].item())
            expected = min(raw, 1.5) if mode == "truncate" else (raw if 0.6 <= raw <= 1.5 else 0.0)
            assert w[i, t].item() == pytest.approx(expected, rel=1e-5)


def test_mismatch_metrics_and_off_policy_mask_match_plain_loop():
    gen = torch.Generator().manual_seed(9)
    B, T = 6, 5
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) - 1
    roll = old + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T)
    lengths = [5, 3, 0, 1, 4, 2]
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).to(torch.float64)
    m = compute_mismatch_metrics(old, roll, mask)
    gaps, k3s, seq_logw = [], [], []
    for i, n in enumerate(lengths):
        xs = [old[i, t].item() - roll[i, t].item() for t in range(n)]
        gaps += [abs(x) for x in xs]
        k3s += [math.exp(x) - 1 - x for x in xs]
        if n:
            seq_logw.append(sum(xs))
    ws = [math.exp(x) for x in seq_logw]
    assert m["logp_gap_mean"].item() == pytest.approx(sum(gaps) / len(gaps), rel=1e-5)
    assert m["logp_gap_max"].item() == pytest.approx(max(gaps), rel=1e-5)
    assert m["rollout_kl_k3"].item() == pytest.approx(sum(k3s) / len(k3s), rel=1e-5)
    assert m["ess"].item() == pytest.approx(sum(ws) ** 2 / (len(ws) * sum(w * w for w in ws)), rel=1e-5)

    delta = 0.05
    out = compute_off_policy_mask(roll, old, adv, mask, delta)
    for i, n in enumerate(lengths):
        drift = sum(roll[i, t].item() - old[i, t].item() for t in range(n)) / max(n, 1)
        drop = adv[i, 0].item() < 0 and drift > delta
        for t in range(T):
            assert out[i, t].item() == (0.0 if (drop or t >= n) else 1.0)
