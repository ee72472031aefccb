"""Sequences, masks from lengths (never token values), multi-turn merging, token budgets."""

import pytest
import torch

from tether.train.batching import build_records, build_sequences, pad_records, split_by_token_budget
from tether.types import Outcome, RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn

PAD = EOS = 0  # pad == eos on purpose


def traj(turns, reward=1.0, outcome=Outcome.OK, stop=StopReason.EOS):
    return Trajectory("t", tuple(turns), RewardResult(reward, outcome=outcome), stop)


def test_single_turn_mask_from_lengths_with_pad_equal_eos():
    # response ends with eos (id 0 == pad): the eos stays in the loss mask, padding does not
    t = traj([Turn((5, 6), (7, EOS), (-0.1, -0.2))])
    short = traj([Turn((5,), (EOS,), (-0.3,))], reward=0.0)
    p = pad_records(build_records([TrajectoryGroup("g", (t, short))]), PAD)
    assert p.input_ids_BT.tolist() == [[5, 6, 7, 0], [5, 0, 0, 0]]
    assert p.loss_mask_BT.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert p.attention_mask_BT.tolist() == [[True] * 4, [True, True, False, False]]
    # outcome reward sits on the last action token of each sequence, never at index -1 of padding
    assert p.token_rewards_BT.tolist() == [[0, 0, 0, 1.0], [0, 0, 0, 0]]
    assert p.rollout_logp_BT[0].tolist() == pytest.approx([0, 0, -0.1, -0.2])


def test_append_only_turns_merge_and_observation_tokens_are_masked():
    t1 = Turn((1, 2), (3,), (-0.5,), observation_ids=(8, 9), reward=0.25)
    t2 = Turn((1, 2, 3, 8, 9), (4, EOS), (-0.1, -0.2))
    seqs = build_sequences(traj([t1, t2]), group=0, traj_idx=0, valid=True)
    assert len(seqs) == 1
    s = seqs[0]
    assert s.ids == (1, 2, 3, 8, 9, 4, 0)
    assert s.loss_mask == (0, 0, 1, 0, 0, 1, 1)
    # step reward on turn 1's last action token, outcome (+ step reward 0) on the final token
    assert s.token_rewards == (0, 0, 0.25, 0, 0, 0, 1.0)


def test_rewritten_context_starts_new_sequence():
    # sliding window dropped the first turn: the second context is not an extension
    t1 = Turn((1, 2), (3,), (-0.5,))
    t2 = Turn((1, 9), (4,), (-0.1,))
    seqs = build_sequences(traj([t1, t2]), 0, 0, True)
    assert [s.ids for s in seqs] == [(1, 2, 3), (1, 9, 4)]
    assert [s.loss_mask for s in seqs] == [(0, 0, 1), (0, 0, 1)]
    assert all(s.traj == 0 for s in seqs)


def test_failed_reward_is_invalid_and_weights_scale_mask():
    ok = traj([Turn((1,), (2,), (-1.0,))])
    bad = traj([Turn((1,), (3,), (-1.0,))], reward=0.0, outcome=Outcome.ERROR)
    recs = build_records([TrajectoryGroup("g", (ok, bad))], weights={(0, 0): 0.0})
    assert [r.valid for r in recs] == [True, False]
    p = pad_records(recs, PAD)
    assert p.valid_B.tolist() == [True, False]
    assert p.loss_mask_BT.sum().item() == 1.0  # the weight-0 trajectory leaves the loss
    recs_zero = build_records([TrajectoryGroup("g", (ok, bad))], mask_invalid=False)
    assert all(r.valid for r in recs_zero)


def test_token_budget_split_covers_all_rows_once():
    lengths = [5, 30, 7, 12, 12, 3, 40]
    batches = split_by_token_budget(lengths, 48)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 48
    assert split_by_token_budget([100], 10) == [[0]]  # over-long row still trains alone


def test_pad_records_rejects_empty():
    with pytest.raises(ValueError):
        pad_records([], 0)
