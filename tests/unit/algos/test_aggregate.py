"""agg_loss: hand-computed values per mode, global denominators, micro-batch gradient invariance."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import AGG_MODES, AggNorm, agg_loss, compute_agg_norm
from tether.registry import UnknownNameError

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"]

NAN, INF = float("nan"), float("inf")


def _hand_batch() -> tuple[torch.Tensor, torch.Tensor]:
    # seq 0: 3 tokens [1,2,3]; seq 1: 2 tokens [4,5]; seq 2: empty (all masked).
    # Padded positions hold NaN / inf / huge values that must never leak.
    loss_BT = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 5.0, INF, -INF], [NAN, 1e30, INF, 7.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return loss_BT, mask_BT


def test_registry_has_exactly_the_four_modes():
    assert AGG_MODES.names() == sorted(MODES)


def test_compute_agg_norm_counts_tokens_and_nonempty_sequences():
    _, mask_BT = _hand_batch()
    norm = compute_agg_norm(mask_BT, max_len=8)
    # 3 + 2 + 0 tokens; the empty third sequence is not counted as a sequence.
    assert norm == AggNorm(num_tokens=5.0, num_seqs=2.0, max_len=8)
    # max_len None falls back to the padded length T = 4
    assert compute_agg_norm(mask_BT).max_len == 4


@pytest.mark.parametrize(
    "mode, expected",
    [
        # sum of masked losses = 1+2+3+4+5 = 15 over 5 tokens
        ("token_mean", 15 / 5),  # 3.0
        # per-sequence means 6/3 = 2 and 9/2 = 4.5; mean over the 2 non-empty sequences
        ("seq_mean_token_mean", (2.0 + 4.5) / 2),  # 3.25
        # token sums 6 and 9 over 2 sequences
        ("seq_mean_token_sum", 15 / 2),  # 7.5
        # Dr. GRPO / TRL dr_grpo: 15 / (B=2 * L_max=4)
        ("constant_norm", 15 / (2 * 4)),  # 1.875
    ],
)
def test_hand_values_with_poisoned_padding(mode, expected):
    loss_BT, mask_BT = _hand_batch()
    loss_BT.requires_grad_(True)
    norm = compute_agg_norm(mask_BT, max_len=4)
    value = agg_loss(loss_BT, mask_BT, mode, norm)
    assert value.item() == pytest.approx(expected, rel=1e-6)
    value.backward()
    grad = loss_BT.grad
    assert torch.isfinite(grad).all()
    # gradient exactly 0 at every padded position, despite NaN/inf there
    assert (grad[mask_BT == 0] == 0).all()
    # and d value / d loss_{0,0}: token_mean 1/5, seq_mean_token_mean 1/(3*2), seq sum 1/2, const 1/8
    expected_grad = {"token_mean": 1 / 5, "seq_mean_token_mean": 1 / 6, "seq_mean_token_sum": 1 / 2,
                     "constant_norm": 1 / 8}[mode]
    assert grad[0, 0].item() == pytest.approx(expected_grad, rel=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_batch_is_exact_zero_not_nan(mode):
    loss_BT = torch.full((2, 3), NAN)
    mask_BT = torch.zeros(2, 3)
    out = agg_loss(loss_BT, mask_BT, mode, compute_agg_norm(mask_BT))
    assert out.item() == 0.0


def test_misspelled_mode_lists_valid_names():
    loss_BT, mask_BT = _hand_batch()
    with pytest.raises(UnknownNameError) as err:
        agg_loss(loss_BT, mask_BT, "token_meen", compute_agg_norm(mask_BT))
    msg = str(err.value)
    assert "Did you mean 'token_mean'" in msg
    for mode in MODES:
        assert mode in msg


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="differ"):
        agg_loss(torch.zeros(2, 3), torch.zeros(2, 4), "token_mean", AggNorm(1.0, 1.0, 4))


# ----------------------------------------------------------------------------- invariance


def _random_batch(B: int = 6, T: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x_BT = torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = [7, 3, 0, 5, 1, 6]  # includes an empty sequence
    mask_BT = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)
    # Garbage (finite) at padding: it must not change anything. NaN inputs are the loss
    # function's job to mask before its own arithmetic (see the poisoned-padding test above).
    x_BT = torch.where(mask_BT > 0, x_BT, torch.full_like(x_BT, 1e3))
    return x_BT, mask_BT


def _grad_over_splits(mode: str, splits: list[int]) -> torch.Tensor:
    """Gradient w.r.t. a shared parameter after accumulating agg_loss over micro-batches."""
    x_BT, mask_BT = _random_batch()
    theta_T = torch.linspace(-1.0, 1.0, x_BT.shape[1], dtype=torch.float64).requires_grad_(True)
    norm = compute_agg_norm(mask_BT, max_len=10)  # ONE global norm for the mini-batch
    start = 0
    for size in splits:
        sl = slice(start, start + size)
        loss_BT = torch.sin(x_BT[sl] * theta_T) + theta_T.square() * x_BT[sl]  # nonlinear per token
        agg_loss(loss_BT, mask_BT[sl], mode, norm).backward()
        start += size
    assert start == x_BT.shape[0]
    return theta_T.grad


@pytest.mark.parametrize("mode", MODES)
def test_gradient_identical_for_full_batch_single_sequences_and_uneven_splits(mode):
    full = _grad_over_splits(mode, [6])
    assert torch.isfinite(full).all() and full.abs().sum() > 0
    torch.testing.assert_close(_grad_over_splits(mode, [1] * 6), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_grad_over_splits(mode, [3, 1, 2]), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_grad_over_splits(mode, [2, 4]), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_vectorised_matches_plain_loop(mode):
    x_BT, mask_BT = _random_batch()
    norm = compute_agg_norm(mask_BT, max_len=10)
    total, lengths = 0.0, []
    for i in range(x_BT.shape[0]):
        row = [x_BT[i, t].item() for t in range(x_BT.shape[1]) if mask_BT[i, t] > 0]
        lengths.append(len(row))
        if not row:
            continue
        if mode == "seq_mean_token_mean":
            total += sum(row) / len(row)
        else:
            total += sum(row)
    n_tok, n_seq = sum(lengths), sum(1 for n in lengths if n > 0)
    denom = {"token_mean": n_tok, "seq_mean_token_mean": n_seq, "seq_mean_token_sum": n_seq,
             "constant_norm": n_seq * 10}[mode]
    got = agg_loss(x_BT, mask_BT, mode, norm).item()
    assert math.isclose(got, total / denom, rel_tol=1e-12)
