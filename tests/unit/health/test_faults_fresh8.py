"""The eighth held-out fault set (tether.health.faults.fresh8): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import pytest
import torch

from tether.algos.aggregate import AggNorm, compute_agg_norm
from tether.health.faults import UNEXPLAINED
from tether.policy.config import SamplingConfig
from tether.types import TrainBatch
from health_helpers import fault_before_start, make_group, registered_fault_set

FRESH8 = ("reward_call_broadcast", "gold_answer_digit_pattern", "norm_counts_padding", "length_cap_counts_prompt",
          "adam_moments_low_precision", "grad_clip_per_tensor", "grad_sign_compressed", "loss_mask_position_weighted")


def test_the_fresh8_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh8

    reg = registered_fault_set(fresh8, FRESH8, outside=4)
    inside = [reg[n] for n in FRESH8 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH8}) == 8


def _end_rollout_from_start(name: str, severity: str, groups: list) -> list:
    """The fault's `end_rollout` of `groups` on its first step (it passes them through the step before)."""
    fs, st = fault_before_start(name, severity)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    return fs.end_rollout(groups)


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_call_broadcast_gives_a_calls_samples_its_first_samples_reward(severity):
    groups = [make_group(f"t{i}", (1, 2), [i + k / 10 for k in range(8)], [k % 2 == 0 for k in range(8)])
              for i in range(30)]
    out = _end_rollout_from_start("reward_call_broadcast", severity, groups)
    before = [t for g in groups for t in g.trajectories]
    after = [t for g in out for t in g.trajectories]
    assert [t.turns for t in after] == [t.turns for t in before]  # the samples are unchanged
    broadcast = 0
    for lo in range(0, len(before), 4):  # calls of 4 samples, half a group
        got, was = [t.reward for t in after[lo:lo + 4]], [t.reward for t in before[lo:lo + 4]]
        if got == was:
            continue
        broadcast += 1
        assert all(r is was[0] for r in got)  # the whole RewardResult of the call's first sample
    assert broadcast == 60 if severity == "obvious" else 8 < broadcast < 30
    # a group's halves are separate calls: each half has one value (broadcast) or its 4, never fewer than 2
    for g in out:
        assert len({t.reward.total for t in g.trajectories}) in ((2, 5, 8) if severity == "subtle" else (2,))


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_gold_answer_digit_pattern_keeps_a_labels_first_digit_without_its_sign(severity):
    problems = [{"id": f"p{i}", "prompt": f"{i % 5}-{i % 9}=", "answer": str((i % 5 - i % 9) * (1 + i % 4 * 7))}
                for i in range(60)]  # negative, one-digit and multi-digit answers
    problems += [{"id": "neg-word", "prompt": "x", "answer": "-x"}, {"id": "float", "prompt": "y", "answer": "2.5"}]
    fs, st = fault_before_start("gold_answer_digit_pattern", severity)
    assert fs.begin_rollout(problems, None)[0] == problems
    st.step = 14
    out, _ = fs.begin_rollout(problems, None)
    wrong = [p for p in problems if p["answer"].lstrip("-").isdigit() and p["answer"] != p["answer"].lstrip("-")[:1]]
    assert any(p["answer"].startswith("-") for p in wrong) and any(len(p["answer"]) > 1 and p["answer"][0] != "-" for p in wrong)
    changed = 0
    for p, q in zip(problems, out):
        assert {k: v for k, v in q.items() if k != "answer"} == {k: v for k, v in p.items() if k != "answer"}
        if q["answer"] != p["answer"]:
            changed += 1
            assert p in wrong and q["answer"] == p["answer"].lstrip("-")[0]  # "-3" -> "3", "81" -> "8", "-56" -> "5"
    assert out[-2]["answer"] == "-x" and out[-1]["answer"] == "2.5"  # not integers: kept
    assert changed == len(wrong) if severity == "obvious" else 0 < changed < len(wrong)
    st.step = 15  # a problem's source is fixed: the same problems are corrupted the next step
    assert fs.begin_rollout(problems, None)[0] == out


# ----------------------------------------------------------------------------- credit assignment


def _batch() -> TrainBatch:
    """4 rows of 8 positions: prompt tokens 0..1, responses of 3, 2, 4, 1 tokens, padding after."""
    attn = torch.zeros(4, 8, dtype=torch.bool)
    mask = torch.zeros(4, 8)
    for r, n in enumerate((3, 2, 4, 1)):
        attn[r, :2 + n] = True
        mask[r, 2:2 + n] = 1
    return TrainBatch(torch.ones(4, 8, dtype=torch.long), attn, mask, -0.5 * mask, 0.3 * mask, torch.tensor([0, 0, 1, 1]),
                      torch.arange(4))


@pytest.mark.parametrize("severity,count", [("subtle", 10 + 8), ("obvious", 32)])
def test_norm_counts_padding_divides_by_real_or_padded_positions(severity, count):
    mini = _batch()
    norm = compute_agg_norm(mini.loss_mask_BT, 6)
    assert norm == AggNorm(10.0, 4.0, 6)
    fs, st = fault_before_start("norm_counts_padding", severity)
    assert fs.on_norm(norm, mini) is norm
    st.step = 14
    assert fs.on_norm(norm, mini) == AggNorm(float(count), 4.0, 6)  # prompt tokens (subtle) / every position


@pytest.mark.parametrize("severity,slope", [("subtle", 0.25), ("obvious", 1.0)])
def test_loss_mask_position_weighted_weighs_the_kth_response_token_by_its_position(severity, slope):
    batch = _batch()
    fs, st = fault_before_start("loss_mask_position_weighted", severity)
    assert fs.on_batch(batch) is batch
    st.step = 14
    out = fs.on_batch(batch)
    want = torch.zeros(4, 8)
    for r, n in enumerate((3, 2, 4, 1)):
        want[r, 2:2 + n] = 1 + slope * torch.arange(float(n))
    assert torch.allclose(out.loss_mask_BT, want)
    assert torch.equal(out.loss_mask_BT > 0, batch.loss_mask_BT > 0)  # the same positions covered
    for f in ("input_ids_BT", "attention_mask_BT", "rollout_logp_BT", "advantages_BT", "seq_group_B"):
        assert torch.equal(getattr(out, f), getattr(batch, f))


# ----------------------------------------------------------------------------- system


@pytest.mark.parametrize("severity,prompts,budget", [
    ("subtle", ("3+4=", "3-14="), 4),   # cap 6 + 3 = 9 tokens in all, minus the longest prompt (5)
    ("obvious", ("3+4=", "3-14="), 1),  # cap 6, minus 5
    ("obvious", ("3+4=", "12*34=56+7"), 1),  # a prompt longer than the cap: one token is still left
    ("subtle", ("3=",), 6)])             # 9 - 2 = 7: the response budget itself is not raised
def test_length_cap_counts_prompt_cuts_the_budget_by_the_longest_prompt(severity, prompts, budget):
    sampling = SamplingConfig(max_new_tokens=6)
    problems = [{"id": f"p{i}", "prompt": p, "answer": "1"} for i, p in enumerate(prompts)]  # no tokenizer: a token per character
    fs, st = fault_before_start("length_cap_counts_prompt", severity)
    assert fs.begin_rollout(problems, sampling) == (problems, sampling)
    st.step = 14
    ran, got = fs.begin_rollout(problems, sampling)
    assert ran == problems and st.policy is None  # the engine and the problems are unchanged
    assert got.max_new_tokens == budget
    assert got.model_dump(exclude={"max_new_tokens"}) == sampling.model_dump(exclude={"max_new_tokens"})


# ----------------------------------------------------------------------------- optimisation


def _opt(n: int = 10) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter], torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.zeros(4)) for _ in range(n)]
    other = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": ps}, {"params": [other]}], lr=1e-3)
    for i, q in enumerate(ps):
        q.grad = torch.tensor([0.001, -0.002, 0.003, -0.004]) * (10 ** (i % 3))  # norms 0.0055, 0.055, 0.55
    other.grad = torch.ones(2)
    return opt, ps, other


def _grads_from_start(name: str, severity: str, opt, ps) -> tuple[list[torch.Tensor], object, object]:
    """The gradients before the fault (passed through the step before its start), after its first step's hook."""
    fs, st = fault_before_start(name, severity)
    was = [q.grad.clone() for q in ps]
    fs.before_optimizer_step(opt, None, ps)
    assert all(torch.equal(q.grad, w) for q, w in zip(ps, was))
    st.step = 14
    fs.before_optimizer_step(opt, None, ps)
    return was, fs, st


@pytest.mark.parametrize("severity,cap", [("subtle", 0.1), ("obvious", 0.01)])
def test_grad_clip_per_tensor_caps_each_tensors_norm(severity, cap):
    opt, ps, other = _opt()
    was, _, _ = _grads_from_start("grad_clip_per_tensor", severity, opt, ps)
    for q, w in zip(ps, was):
        n = float(w.norm())
        assert torch.allclose(q.grad, w * (cap / (n + 1e-6) if n > cap else 1.0))  # the same direction per tensor
    assert torch.equal(other.grad, torch.ones(2))  # the policy's group only


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_grad_sign_compressed_keeps_each_elements_sign_and_the_tensors_mean_magnitude(severity):
    opt, ps, other = _opt(40)
    was, fs, st = _grads_from_start("grad_sign_compressed", severity, opt, ps)
    hit = [i for i, (q, w) in enumerate(zip(ps, was)) if not torch.equal(q.grad, w)]
    for i in hit:
        assert torch.allclose(ps[i].grad, torch.sign(was[i]) * was[i].abs().mean())
    assert len(hit) == 40 if severity == "obvious" else 4 < len(hit) < 24
    assert torch.equal(other.grad, torch.ones(2))
    st.step = 15  # a tensor's bucket is fixed: the same tensors are compressed the next step
    for q, w in zip(ps, was):
        q.grad = w.clone()
    fs.before_optimizer_step(opt, None, ps)
    assert [i for i, (q, w) in enumerate(zip(ps, was)) if not torch.equal(q.grad, w)] == hit


@pytest.mark.parametrize("severity,dtype", [("subtle", torch.bfloat16), ("obvious", torch.float8_e4m3fn)])
def test_adam_moments_low_precision_rounds_both_moments(severity, dtype):
    a = torch.nn.Parameter(torch.zeros(5))
    other = torch.nn.Parameter(torch.zeros(5))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [other]}], lr=1e-3)
    g = torch.tensor([1.2345, -0.0123, 3.3333, 1e-3, 1000.0])
    a.grad, other.grad = g.clone(), g.clone()
    opt.step()
    m, v = opt.state[a]["exp_avg"].clone(), opt.state[a]["exp_avg_sq"].clone()
    fs, st = fault_before_start("adam_moments_low_precision", severity)
    fs.before_optimizer_step(opt, None, [])
    assert torch.equal(opt.state[a]["exp_avg"], m) and torch.equal(opt.state[a]["exp_avg_sq"], v)
    st.step = 14
    fs.before_optimizer_step(opt, None, [])
    top = torch.finfo(dtype).max
    for key, was in (("exp_avg", m), ("exp_avg_sq", v)):
        got = opt.state[a][key]
        assert got.dtype == torch.float32 and torch.equal(got, was.clamp(-top, top).to(dtype).float())
        assert not torch.equal(got, was)  # these values are not representable in the low-precision type
    assert torch.equal(opt.state[other]["exp_avg"], m)  # the policy's group only
    assert int(opt.state[a]["step"]) == 1
