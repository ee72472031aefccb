"""The invariant signals (tether.health.invariants) and the update's probes (tether.train.probes),
each on a hand-built input whose answer is computed by hand in the comments."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tether.algos import compute_agg_norm
from tether.health.invariants import (compute_answer_leakage, compute_answer_mix, compute_duplicate_stats, compute_mask_coverage,
                                      compute_param_norm, compute_reward_consistency, compute_reward_routing,
                                      compute_token_agreement)
from tether.health.telemetry import compute_buffers_fingerprint, compute_weights_fingerprint
from tether.train.probes import (NormCheck, PreSamplerKL, choose_probe_rows, compute_cosine, compute_grad_sketch,
                                 compute_logp_shift,
                                 compute_hparams, compute_logp_progress, compute_moment_change, compute_moment_sketch,
                                 compute_step_stats)
from tether.types import Outcome, RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn
from health_helpers import make_group

# ----------------------------------------------------------------------------- loss mask by position

SAMPLED = torch.tensor([[0, 0, 1, 1, 1, 0],   # row 0: prompt of 2, 3 sampled tokens, 1 pad
                        [0, 1, 1, 0, 0, 0]], dtype=torch.bool)  # row 1: prompt of 1, 2 sampled tokens
OK_ROWS = torch.tensor([True, True])


def test_mask_equal_to_the_sampled_positions_is_silent():
    out = compute_mask_coverage(SAMPLED.float(), SAMPLED, OK_ROWS)
    assert out == {"health/mask_missed": 0.0, "health/mask_extra": 0.0, "health/mask_missed_last": 0.0,
                   "health/mask_missed_first": 0.0, "health/mask_shifted": 0.0, "health/mask_uneven": 0.0}


def test_a_row_weight_is_even_and_a_per_position_weight_is_not():
    mask = SAMPLED.float().clone()
    mask[1] *= 0.5  # row 1 weighs 0.5 for all its tokens (a validity weight): even
    assert compute_mask_coverage(mask, SAMPLED, OK_ROWS)["health/mask_uneven"] == 0.0
    mask[0, 2:5] = torch.tensor([1.0, 2.0, 3.0])  # row 0: its running count, the position-id idiom
    out = compute_mask_coverage(mask, SAMPLED, OK_ROWS)
    assert out["health/mask_uneven"] == pytest.approx(1 / 2)  # row 0 of 2
    assert out["health/mask_missed"] == 0.0 and out["health/mask_extra"] == 0.0  # its positions are right


def test_a_mask_moved_one_position_right_keeps_its_count_but_not_its_positions():
    mask = torch.zeros(2, 6)
    mask[:, 1:] = SAMPLED[:, :-1].float()  # row 0 covers 3, 4, 5; row 1 covers 2, 3
    out = compute_mask_coverage(mask, SAMPLED, OK_ROWS)
    assert mask.sum() == SAMPLED.sum()  # the count check passes
    # missed: row 0 position 2, row 1 position 1 -> 2 of 5 sampled; extra: row 0 position 5, row 1 position 3 -> 2 / 5
    assert out["health/mask_missed"] == pytest.approx(2 / 5) and out["health/mask_extra"] == pytest.approx(2 / 5)
    assert out["health/mask_missed_first"] == 1.0 and out["health/mask_missed_last"] == 0.0
    assert out["health/mask_shifted"] == 1.0  # both rows: the sampled positions moved by one


def test_an_eos_dropped_from_the_mask_is_a_missed_last_token():
    mask = SAMPLED.float().clone()
    mask[0, 4] = 0  # row 0's last sampled token (its EOS)
    out = compute_mask_coverage(mask, SAMPLED, OK_ROWS)
    assert out["health/mask_missed"] == pytest.approx(1 / 5) and out["health/mask_extra"] == 0.0
    assert out["health/mask_missed_last"] == pytest.approx(1 / 2) and out["health/mask_shifted"] == 0.0


def test_rows_dropped_by_filtering_may_have_an_empty_mask():
    mask = SAMPLED.float().clone()
    mask[1] = 0  # row 1 weighs 0 (compact filtering): its tokens are not missed
    out = compute_mask_coverage(mask, SAMPLED, torch.tensor([True, False]))
    assert out["health/mask_missed"] == 0.0 and out["health/mask_extra"] == 0.0


# ----------------------------------------------------------------------------- independent samples


def _group(task: str, responses, logp: float) -> TrajectoryGroup:
    trajs = []
    for resp in responses:
        turn = Turn(context_ids=(1, 2), action_ids=resp, action_logprobs=tuple(logp / len(resp) for _ in resp))
        trajs.append(Trajectory(task, (turn,), RewardResult(0.0, {"exact_match": 0.0}, Outcome.OK, False), StopReason.EOS))
    return TrajectoryGroup(task, tuple(trajs), {"prompt": "p", "answer": "1"})


def test_identical_samples_of_an_unsure_sampler_are_unlikely():
    # p = exp(-2) = 0.135 for every sample; 4 identical samples: chance p^3 = 0.0025 < 0.01 -> unlikely
    g = _group("a", [(5, 6)] * 4, -2.0)
    out = compute_duplicate_stats([g])
    assert out["health/dup_groups_unlikely"] == 1.0
    assert out["health/dup_groups_expected"] == pytest.approx(math.exp(-2.0) ** 3)  # sum of p^3 / n over 4 samples
    assert out["health/dup_pairs"] == 6.0  # C(4, 2)
    assert out["health/dup_pairs_expected"] == pytest.approx(6 * math.exp(-2.0))


def test_identical_samples_of_a_sure_sampler_are_expected():
    g = _group("a", [(5, 6)] * 4, -0.05)  # p = 0.95: p^3 = 0.86, independent draws agree
    out = compute_duplicate_stats([g])
    assert out["health/dup_groups_unlikely"] == 0.0 and out["health/dup_groups_expected"] == 0.0


def test_distinct_samples_have_no_duplicates():
    out = compute_duplicate_stats([_group("a", [(5,), (6,), (7,), (8,)], -2.0)])
    assert out["health/dup_pairs"] == 0.0 and out["health/dup_groups_unlikely"] == 0.0


# ----------------------------------------------------------------------------- answer leakage


def _task_group(prompt: str, answer: str) -> TrajectoryGroup:
    g = make_group("t", (1,), [0.0], [False])
    return TrajectoryGroup(g.task_id, g.trajectories, {"prompt": prompt, "answer": answer})


def test_answer_in_its_own_prompt_against_chance():
    groups = [_task_group("3+4=", "7"), _task_group("12+1=", "13"), _task_group("5*1=", "5"), _task_group("9-2=", "7")]
    out = compute_answer_leakage(groups, shifts=(1,))
    # own: "5" in "5*1=" only ("7" is not in "3+4=", "13" not in "12+1=" as a token, "7" not in "9-2=") -> 1/4
    # chance (shift 1): "13" in "3+4="? no; "5" in "12+1="? no; "7" in "5*1="? no; "7" in "9-2="? no -> 0/4
    assert out == {"health/answer_in_prompt": 0.25, "health/answer_in_prompt_chance": 0.0}


def test_a_number_inside_a_longer_number_does_not_count():
    groups = [_task_group("12+1=", "2"), _task_group("3+4=", "7"), _task_group("1+1=", "2"), _task_group("2+2=", "4")]
    out = compute_answer_leakage(groups, shifts=(1,))
    assert out["health/answer_in_prompt"] == 0.0  # "2" is inside "12" only; "2+2=" does not hold "4"


def test_answer_mix_over_the_steps_distinct_problems():
    def g(task_id, answer):
        base = _task_group("p", answer)
        return TrajectoryGroup(task_id, base.trajectories, base.task)
    groups = [g("a", "7"), g("b", "13"), g("c", "-2"), g("d", "7"), g("a", "7"), g("a", "7")]  # "a" thrice: counted once
    # distinct problems a, b, c, d: answers 7, 13, -2, 7 -> lengths 1, 2, 2, 1; distinct answers 3 of 4
    assert compute_answer_mix(groups) == {"health/answer_len_mean": 1.5, "health/answer_distinct_frac": 0.75}
    assert compute_answer_mix(groups[:3]) == {}  # fewer than 4 problems: no statistic


# ----------------------------------------------------------------------------- reward routing


def test_rewards_on_the_wrong_samples_keep_each_groups_count():
    routed = make_group("a", (1,), [0.0, 1.0, 0.0, 0.0], [True, False, False, False])  # the 1 on a neighbour
    right = make_group("b", (1,), [1.0, 0.0, 1.0, 0.0], [True, False, True, False])
    out = compute_reward_routing([routed, right])
    # groups with verdicts 2; disagreeing 1 (a), which pays 1 sample for 1 correct -> routed 1/1
    assert out == {"health/reward_disagree_groups": 0.5, "health/reward_routed_frac": 1.0}


def test_noise_changes_how_many_samples_a_group_pays():
    noisy = make_group("a", (1,), [1.0, 1.0, 0.0, 1.0], [True, False, False, False])  # a flip: 3 paid, 1 correct
    out = compute_reward_routing([noisy])
    assert out == {"health/reward_disagree_groups": 1.0, "health/reward_routed_frac": 0.0}


def test_agreeing_rewards_have_nothing_to_route():
    out = compute_reward_routing([make_group("a", (1,), [1.0, 0.0], [True, False])])
    assert out["health/reward_disagree_groups"] == 0.0 and math.isnan(out["health/reward_routed_frac"])


def test_identical_responses_paid_differently_split_their_cluster():
    # group a: responses X, X, X, Y with rewards 1, 0, 1, 0 -> cluster {X x3} split (rewards 1/0, verdicts T/F)
    a = make_group("a", (1,), [1.0, 0.0, 1.0, 0.0], [True, False, True, False], [(5, 2), (5, 2), (5, 2), (6, 2)])
    # group b: X, X paid alike -> a cluster, not split; Z alone is no cluster
    b = make_group("b", (1,), [1.0, 1.0, 0.0], [True, True, False], [(5, 2), (5, 2), (7, 2)])
    out = compute_reward_consistency([a, b])
    assert out == {"health/reward_split_clusters": 0.5, "health/reward_split_verdicts": 0.5}


def test_identical_responses_to_different_prompts_are_no_cluster():
    # a grouping bug puts another prompt's sample in the group: the same response may rightly be paid otherwise
    g = make_group("a", (1,), [1.0, 0.0], [True, False], [(5, 2), (5, 2)])
    other = dataclasses.replace(g.trajectories[1], turns=(dataclasses.replace(g.trajectories[1].turns[0], context_ids=(9,)),))
    assert compute_reward_consistency([dataclasses.replace(g, trajectories=(g.trajectories[0], other))]) == {}
    assert compute_reward_consistency([make_group("b", (1,), [1.0, 0.0], [True, False])]) == {}  # all distinct


def test_a_silent_verifier_timeout_splits_clusters_of_correct_answers():
    """reward_silent_timeout (faults/fresh3.py) zeroes a share of the scored samples with their verdict: what
    the check guards, injected exactly."""
    from health_helpers import make_fault

    groups = [make_group(f"t{i}", (i,), [1.0] * 8, [True] * 8, [(5, 2)] * 8) for i in range(16)]
    assert compute_reward_consistency(groups)["health/reward_split_clusters"] == 0.0
    hit = make_fault("reward_silent_timeout", "obvious").on_rollouts(groups, 20)
    # obvious: 90% of the samples zeroed; a cluster of 8 stays whole only when all or none of them are (~0.43 +
    # 1e-8): 16 clusters, each split with probability ~0.57 by the fault's own coin
    assert compute_reward_consistency(hit)["health/reward_split_clusters"] >= 0.5


def test_token_agreement_compares_ids_at_the_sampled_positions_and_rows_whatever_the_layout():
    sampled = torch.tensor([[False, True, True, False], [False, False, True, True]])
    ids = torch.tensor([[1, 5, 6, 0], [1, 2, 7, 8]])
    attn = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert compute_token_agreement(ids.clone(), attn, ids, attn, sampled) == {"health/token_mismatch_rows": 0.0,
                                                                             "health/token_mismatch": 0.0}
    edited = ids.clone()
    edited[0, 3] = 9  # a pad position: neither attended nor sampled, not counted
    edited[1, 3] = 9  # a sampled position: 1 of 4 sampled positions, 1 of 2 rows
    assert compute_token_agreement(edited, attn, ids, attn, sampled) == {"health/token_mismatch_rows": 0.5,
                                                                        "health/token_mismatch": 0.25}
    # a prefix in front of every row (a BOS the engine never saw): the layout changes, every row differs
    bos = torch.full((2, 1), 3)
    prefixed, pattn = torch.cat([bos, ids], 1), torch.cat([torch.ones(2, 1, dtype=torch.bool), attn], 1)
    assert compute_token_agreement(prefixed, pattn, ids, attn, sampled) == {"health/token_mismatch_rows": 1.0}
    # the same tokens left-padded instead of right-padded: the same rows
    left = torch.tensor([[0, 1, 5, 6], [1, 2, 7, 8]])
    lattn = torch.tensor([[False, True, True, True], [True, True, True, True]])
    assert compute_token_agreement(left, lattn, ids, attn, sampled)["health/token_mismatch_rows"] == 0.0
    # a row dropped on the way counts as differing
    assert compute_token_agreement(ids[:1], attn[:1], ids, attn, sampled)["health/token_mismatch_rows"] == 0.5


# ----------------------------------------------------------------------------- parameters and buffers


def test_per_tensor_sums_tell_a_stale_sync_from_a_wrong_one():
    from tether.health.telemetry import (compute_fingerprint_of_sums, compute_sums_match, compute_weight_sums,
                                         compute_weights_fingerprint)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    sums = compute_weight_sums(model)
    assert sums.shape == (4,) and compute_fingerprint_of_sums(sums) == compute_weights_fingerprint(model)  # bit for bit
    v1 = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    v2 = torch.tensor([1.5, 2.5, 3.0, 4.5], dtype=torch.float64)  # the third tensor did not change
    versions = {1: v1, 2: v2}
    # partly stale (tensors 0, 1 at version 1, the rest at 2): every tensor is some version's
    assert compute_sums_match(torch.tensor([1.0, 2.0, 3.0, 4.5], dtype=torch.float64), versions) == {
        "health/weights_foreign_frac": 0.0}
    # two same-shaped tensors swapped by the sync: 2 of 4 match no version
    assert compute_sums_match(torch.tensor([2.5, 1.5, 3.0, 4.5], dtype=torch.float64), versions) == {
        "health/weights_foreign_frac": 0.5}
    # the engine's copy holds a tensor the trainer's has not (a bias added to its output head): whatever
    # matches, it is no version of the trainer's - 1 of 5 tensors foreign
    extra = torch.tensor([1.5, 2.5, 3.0, 4.5, 0.25], dtype=torch.float64)
    assert compute_sums_match(extra, versions) == {"health/weights_foreign_frac": pytest.approx(0.2)}
    # a tensor left out: every one it has matches, the missing one counts (1 of 4)
    assert compute_sums_match(v1[:3], versions) == {"health/weights_foreign_frac": pytest.approx(0.25)}
    # another layout whose tensors match nothing at all
    assert compute_sums_match(torch.tensor([9.0, 8.0], dtype=torch.float64), versions) == {
        "health/weights_foreign_frac": pytest.approx(1.0)}
    assert compute_sums_match(v1, {}) == {}  # nothing recorded: nothing to compare


def test_param_norm_and_a_buffer_the_parameter_checksum_does_not_see():
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[3.0, 4.0]]))
    lin.register_buffer("inv_freq", torch.tensor([1.0, 0.5]), persistent=False)
    assert compute_param_norm(lin) == pytest.approx(5.0)  # sqrt(9 + 16)
    params, bufs = compute_weights_fingerprint(lin), compute_buffers_fingerprint(lin)
    lin.inv_freq.mul_(0.9)
    assert compute_weights_fingerprint(lin) == params and compute_buffers_fingerprint(lin) != bufs


# ----------------------------------------------------------------------------- the update's probes


def test_logp_gain_is_the_advantage_weighted_change():
    before = torch.tensor([[0.0, -1.0, -2.0]])
    after = torch.tensor([[0.0, -0.5, -2.5]])
    adv = torch.tensor([[0.0, 1.0, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    out = compute_logp_progress(before, after, adv, mask)
    # gain = (1 x 0.5 + (-1) x (-0.5)) / (|1| + |-1|) = 0.5; change = mean(|0.5|, |-0.5|) = 0.5
    assert out == {"update/logp_gain": pytest.approx(0.5), "update/logp_change": pytest.approx(0.5)}
    assert compute_logp_progress(after, before, adv, mask)["update/logp_gain"] == pytest.approx(-0.5)  # against


def test_step_stats_measure_the_step_against_the_lr_and_spot_frozen_tensors():
    a, b, c = (torch.nn.Parameter(torch.zeros(4)) for _ in range(3))
    before = [x.detach().clone() for x in (a, b, c)]
    with torch.no_grad():
        a.add_(0.01)  # every element moved by lr = 0.01 (an Adam step with |m / sqrt(v)| = 1)
    grads = [torch.ones(4), None, torch.ones(4)]  # b got no gradient, c had one and did not move
    out = compute_step_stats([a, b, c], before, 0.01, grads)
    # ||dtheta|| = sqrt(4 x 0.01^2) = 0.02; lr x sqrt(N) = 0.01 x sqrt(12) -> 0.02 / 0.0346; b and c frozen: 2/3
    assert out["update/step_ratio"] == pytest.approx(0.02 / (0.01 * math.sqrt(12)))
    assert out["update/frozen_frac"] == pytest.approx(2 / 3)
    # a zero gradient (no signal, no momentum yet) that moves nothing is not a frozen tensor
    zero = [torch.zeros(4)] * 3
    assert compute_step_stats([a, b, c], [x.detach().clone() for x in (a, b, c)], 0.01, zero)["update/frozen_frac"] == 0.0


def test_grad_sketch_takes_the_same_strided_positions_and_cosines_track_the_gradients():
    g = [torch.arange(1000, dtype=torch.float32).reshape(10, 100), None, torch.tensor([3.0, -4.0])]
    sk = compute_grad_sketch(g, size=4)
    # 1000 elements, stride 250: positions 0, 250, 500, 750; the 2-element tensor whole; None skipped
    assert sk.tolist() == [0.0, 250.0, 500.0, 750.0, 3.0, -4.0] and sk.dtype == torch.float64
    assert compute_cosine(sk, sk) == pytest.approx(1.0) and compute_cosine(sk, -sk) == pytest.approx(-1.0)
    a, b = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert compute_cosine(a, b) == pytest.approx(1 / math.sqrt(2))
    # nothing to compare: no previous sketch, another shape, an all-zero gradient
    assert math.isnan(compute_cosine(a, None)) and math.isnan(compute_cosine(a, sk))
    assert math.isnan(compute_cosine(a, torch.zeros(2, dtype=torch.float64)))
    assert compute_grad_sketch([None]) is None


def _adam_with_state():
    a, b = torch.nn.Parameter(torch.zeros(100)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([a, b], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    a.grad, b.grad = torch.arange(100, dtype=torch.float32), torch.tensor([1.0, -2.0, 3.0])
    opt.step()  # one step: exp_avg = 0.1 g, exp_avg_sq = 0.01 g^2, step 1
    return opt, a, b


def test_moments_cast_to_a_low_precision_type_sit_on_its_grid_and_a_rescale_does_not():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(1000))
    opt = torch.optim.AdamW([p], lr=0.1)
    for _ in range(3):
        p.grad = torch.randn(1000) * 1e-2
        opt.step()
    sk = compute_moment_sketch(opt, size=8)  # 8 elements of each moment: 16 non-zero fp32 values
    st = opt.state[p]
    rounded = {k: st[k].to(torch.bfloat16).to(torch.float32) for k in ("exp_avg", "exp_avg_sq")}
    for k in rounded:
        st[k].copy_(rounded[k])  # stored in bfloat16 between steps (a mixed-precision optimizer state)
    ch = compute_moment_change(sk, compute_moment_sketch(opt, size=8))
    assert ch["update/moments_changed"] == 1.0 and ch["update/moments_rounded"] == 1.0
    assert ch["update/moments_scale"] == pytest.approx(1.0, abs=0.01)  # a rounding is no rescale
    st["exp_avg_sq"].mul_(0.1)  # a restore in the wrong scale: fp32 values off the grid
    st["exp_avg"].mul_(0.3)
    ch = compute_moment_change(sk, compute_moment_sketch(opt, size=8))
    assert ch["update/moments_rounded"] < 0.2
    st["exp_avg_sq"].zero_()  # every moment lost (all 0): nothing left to judge the grid on
    st["exp_avg"].zero_()
    assert "update/moments_rounded" not in compute_moment_change(sk, compute_moment_sketch(opt, size=8))


def test_moment_sketch_samples_the_same_positions_and_compares_by_hand():
    opt, a, b = _adam_with_state()
    sk = compute_moment_sketch(opt, size=4)
    # a: 100 elements, stride 25 -> positions 0, 25, 50, 75; b: 3 elements, zero-padded to 4
    assert sk.dtype == torch.float64 and sk.shape == (2, 9)
    assert sk[0].tolist() == pytest.approx([1.0, 0.0, 6.25, 25.0, 56.25, 0.0, 2.5, 5.0, 7.5])
    assert sk[1].tolist() == pytest.approx([1.0, 0.01, 0.04, 0.09, 0.0, 0.1, -0.2, 0.3, 0.0])
    assert compute_moment_change(sk, compute_moment_sketch(opt, size=4)) == {"update/moments_changed": 0.0}  # untouched
    opt.state[a]["exp_avg_sq"].mul_(0.01)  # a restore in the wrong scale, one tensor of two
    ch = compute_moment_change(sk, compute_moment_sketch(opt, size=4))
    assert ch["update/moments_changed"] == 0.5 and ch["update/moments_scale"] == pytest.approx(0.01)
    assert ch["update/moments_spread"] == pytest.approx(1.0) and ch["update/moments_steps"] == 0.0
    opt.state.pop(b)  # b's state lost: its second moments count 0; a at 0.01 and b at 0 are not one rescale
    ch = compute_moment_change(sk, compute_moment_sketch(opt, size=4))
    assert ch["update/moments_changed"] == 1.0 and ch["update/moments_scale"] == pytest.approx((0.875 + 0.0) / (87.5 + 0.14))
    assert ch["update/moments_spread"] == float("inf")
    opt2, a2, b2 = _adam_with_state()
    sk2 = compute_moment_sketch(opt2, size=4)
    opt2.step()  # an extra optimizer.step() (same gradients): the counter runs ahead, one factor per tensor
    ch = compute_moment_change(sk2, compute_moment_sketch(opt2, size=4))
    # v = 0.01 g^2 after one step; after the second 0.99 x 0.01 g^2 + 0.01 g^2 = 0.0199 g^2: 1.99x
    assert ch["update/moments_steps"] == 1.0 and ch["update/moments_scale"] == pytest.approx(1.99)
    # no earlier step, another layout, an optimizer without moments: nothing to compare
    assert compute_moment_change(None, sk) is None and compute_moment_change(sk, sk[:1]) is None
    empty = compute_moment_sketch(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]))  # before its first step
    assert empty.shape == (1, 17) and bool(empty.isnan().all()) and compute_moment_change(empty, empty) is None
    opt.state.clear()  # every tensor's state lost (an optimizer rebuilt between steps): all gone, one factor (0)
    ch = compute_moment_change(sk, compute_moment_sketch(opt, size=4))
    assert (ch["update/moments_changed"], ch["update/moments_scale"], ch["update/moments_spread"]) == (1.0, 0.0, 1.0)
    opt3, a3, b3 = _adam_with_state()
    opt3.step()  # step 2
    sk3 = compute_moment_sketch(opt3, size=4)
    for q in (a3, b3):  # the counter restored apart from the moments (a resume that restarts Adam's step at 0)
        opt3.state[q]["step"] = torch.tensor(0.0)
    ch = compute_moment_change(sk3, compute_moment_sketch(opt3, size=4))
    assert ch["update/moments_changed"] == 1.0 and ch["update/moments_scale"] == 1.0 and ch["update/moments_spread"] == 1.0
    assert ch["update/moments_steps"] == -2.0 and ch["update/moments_rewound"] == 2.0


def test_hparams_are_the_first_groups_adam_settings():
    opt, _, _ = _adam_with_state()
    assert compute_hparams(opt) == {"update/opt_beta1": 0.9, "update/opt_beta2": 0.99, "update/opt_eps": 1e-8,
                                    "update/opt_weight_decay": 0.0}
    assert compute_hparams(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)) == {"update/opt_weight_decay": 0.0}


def test_pre_sampler_kl_is_k3_over_the_loss_tokens_with_a_sampler_logprob():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -2.5, float("nan")], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    kl = PreSamplerKL()
    kl.add(logp, rollout, mask)
    # tokens kept: row 0 positions 0 and 1 (position 2 has no sampler log-prob, row 1 is masked)
    # log r = logp - rollout = 0 and 0.5: k3 = (e^0 - 1 - 0) + (e^0.5 - 1 - 0.5), over 2 tokens
    assert kl.result() == pytest.approx((math.exp(0.5) - 1.5) / 2)
    assert math.isnan(PreSamplerKL().result())


def test_norm_check_is_one_when_every_token_counts_once_and_sees_a_wrong_normaliser():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    right = compute_agg_norm(mask)
    check = NormCheck("token_mean", None)
    for rows in ([0], [1, 2]):  # two micro-batches under the mini-batch's normaliser: 2/6 + 4/6 = 1
        check.add(mask[rows], right)
    check.end(mask)
    assert check.result()["update/norm_ratio"] == pytest.approx(1.0, abs=1e-6)  # float32 sums
    wrong = NormCheck("token_mean", None)
    wrong.add(mask, type(right)(right.num_tokens * 4, right.num_seqs, right.max_len))  # 6 / 24 = 0.25 of the weight
    wrong.end(mask)
    assert wrong.result()["update/norm_ratio"] == pytest.approx(1.75)  # 1 + |0.25 - 1|


def test_probe_rows_are_rows_with_an_advantage():
    adv = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, -2.0]])
    mask = torch.ones(4, 2)
    assert choose_probe_rows(adv, mask, 8).tolist() == [1, 3]
    assert choose_probe_rows(torch.zeros(4, 2), mask, 8) is None


def test_a_log_prob_gap_that_one_position_of_shift_explains_is_told_from_a_sampler_that_differs():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, 0.0]] * 3)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]] * 3)
    mu = old.clone()
    mu[1, :4] = torch.tensor([-2.0, -0.5, -3.0, 0.0])  # each token filed with the next one's log-prob, the last padded 0
    mu[2, :4] = old[2, :4] - 0.4  # a sampler that computes another distribution: off at every shift
    out = compute_logp_shift(old, mu, mask)
    assert out["logp_gap_rows"].item() == 2.0 and out["logp_shift_rows"].item() == 1.0  # row 0: no gap
    # by hand, row 1: no shift |(-1+2)| + |(-2+0.5)| + |(-0.5+3)| + |(-3-0)| = 8 over 4 tokens; shifted by one: 0
    mu[1, 0] = -2.05  # numerics on top of the shift: 0.05 / 3 per pair, < 0.1 x 2.0125
    assert compute_logp_shift(old, mu, mask)["logp_shift_rows"].item() == 1.0
    assert compute_logp_shift(old, old, mask)["logp_gap_rows"].item() == 0.0  # the same numbers: no gap at all


def test_a_gap_on_tokens_recorded_at_log_prob_zero_is_a_padded_record():
    """The engine's log-probs came back two short and were padded with 0.0 (log 1): the gap sits on
    those two tokens only. A sampler that differs everywhere, or a record whose 0.0 is the trainer's
    too (a token both call certain), is not that."""
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, 0.0]] * 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]] * 4)
    mu = old.clone()
    mu[0, 2:4] = 0.0  # padded tail: gap |-0.5| + |-3| = 3.5, all of it on recorded zeros
    mu[1, :4] = old[1, :4] - 0.4  # another distribution: the gap is everywhere
    mu[2, 1:4] = torch.tensor([-2.3, 0.0, -3.2])  # one zero among others: 0.5 of 1.0 on zeros (< 0.9)
    out = compute_logp_shift(old, mu, mask)
    assert out["logp_gap_rows"].item() == 3.0 and out["logp_zero_rows"].item() == 1.0
    certain = old.clone()
    certain[:, 3] = 0.0  # the trainer also gives the last token probability 1
    assert compute_logp_shift(certain, certain, mask)["logp_zero_rows"].item() == 0.0
