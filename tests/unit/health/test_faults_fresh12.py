"""The twelfth held-out fault set (tether.health.faults.fresh12): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tether.health.faults import UNEXPLAINED
from tether.optim import build_scheduler
from tether.policy.base import HFPolicy
from tether.types import TrainBatch
from health_helpers import fault_before_start, make_group, registered_fault_set


def test_the_fresh12_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh12
    from tether.health.faults.split import HELD_OUT, TUNED

    reg = registered_fault_set(fresh12, fresh12.FRESH12, outside=3)
    assert sorted(fresh12.FRESH12) == sorted(HELD_OUT) and not set(HELD_OUT) & set(TUNED)  # round 12's held-out set
    inside = [reg[n] for n in fresh12.FRESH12 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert {c.name: c.cause for c in inside} == {
        "rollout_n_not_forwarded": "no_signal", "loader_prompts_repeated_before_sampling": "duplicate_problems",
        "trainer_dropout_left_on": "rollout_mismatch", "optimizer_step_skipped_on_overflow": "no_progress",
        "advantage_clipped_at_ratio_range": "advantage_bug"}
    assert len({reg[n].seam for n in fresh12.FRESH12}) == 8
    hooks = ("begin_step", "on_problems", "install", "before_optimizer_step", "on_advantages", "on_rollouts",
             "on_batch", "on_old_logp")
    assert sorted(h for n in fresh12.FRESH12 for h in vars(reg[n]) if h in hooks or h.startswith("on_")) == sorted(hooks)


# ----------------------------------------------------------------------------- run settings


@pytest.mark.parametrize("severity,n", [("subtle", 2), ("obvious", 1)])
def test_rollout_n_not_forwarded_sets_the_group_size_once_from_the_start(severity, n):
    fs, st = fault_before_start("rollout_n_not_forwarded", severity)
    before = st.settings.config.rollout.n
    fs.begin_step()
    assert st.settings.config.rollout.n == before == 8
    st.step = 14
    fs.begin_step()
    assert st.settings.config.rollout.n == n
    assert st.settings.config.rollout.problems_per_step == type(st.settings.config.rollout)().problems_per_step
    st.settings.set("rollout.n", 8, source="test")  # someone puts it back: the fault does not fight it
    st.step = 15
    fs.begin_step()
    assert st.settings.config.rollout.n == 8


# ----------------------------------------------------------------------------- data loader

PROBLEMS = [{"id": f"arith-{i}", "prompt": f"{i % 10}+1=", "answer": str(i % 10 + 1)} for i in range(10)]


@pytest.mark.parametrize("severity,k", [("subtle", 2), ("obvious", 8)])
def test_loader_prompts_repeated_before_sampling_fills_the_step_with_k_copies_of_fewer_problems(severity, k):
    fs, st = fault_before_start("loader_prompts_repeated_before_sampling", severity)
    real = [dict(p) for p in PROBLEMS]
    assert fs.begin_rollout(real, None)[0] == real
    st.step = 14
    got, _ = fs.begin_rollout(real, None)
    want = {2: [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], 8: [0] * 8 + [1] * 2}[k]
    assert [p["id"] for p in got] == [f"arith-{i}" for i in want]
    assert got[0] == real[0] and got[0] is not real[0] and got[0] is not got[1]  # copies
    assert real == [dict(p) for p in PROBLEMS]  # the loader's own list untouched


# ----------------------------------------------------------------------------- the trainer's forward


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)

    def forward(self, x):
        return x + self.self_attn(x) + self.mlp(x)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("severity,p", [("subtle", 0.1), ("obvious", 0.3)])
def test_trainer_dropout_left_on_drops_branch_outputs_only_with_gradients_on(severity, p):
    torch.manual_seed(0)
    model = _Net()
    policy = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    fs, st = fault_before_start("trainer_dropout_left_on", severity, policy=policy)
    f = fs.faults[0]
    assert f.hooks == 4
    x = torch.randn(400, 6)
    with torch.no_grad():
        clean = model(x)
    assert torch.equal(model(x), clean)  # before the start: no dropout, gradients on or not
    st.step = 14
    with torch.no_grad():
        assert torch.equal(model(x), clean)  # the sampler's and pi_old's no-grad forwards
    rng = torch.get_rng_state()
    branch = model.layers[0].mlp(x)  # a hooked branch alone: zeros at rate p, the rest scaled by 1/(1-p)
    assert torch.equal(torch.get_rng_state(), rng)  # the run's RNG is not drawn from
    plain = torch.nn.functional.linear(x, model.layers[0].mlp.weight, model.layers[0].mlp.bias)
    dropped = branch == 0
    assert abs(dropped.float().mean().item() - p) < 0.03
    assert torch.allclose(branch[~dropped], plain[~dropped] / (1 - p), atol=1e-5)
    out = model(x)
    assert out.requires_grad and not torch.allclose(out, clean)


# ----------------------------------------------------------------------------- the optimizer step


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_optimizer_step_skipped_on_overflow_drops_every_gradient_on_the_chosen_steps(severity):
    q = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([q], lr=0.1, weight_decay=0.0)
    sched = build_scheduler(opt, 40, 0, "linear")
    fs, st = fault_before_start("optimizer_step_skipped_on_overflow", severity)
    q.grad = torch.ones(3)
    fs.before_optimizer_step(opt, sched, [q])
    assert torch.equal(q.grad, torch.ones(3))  # before the start
    f = fs.faults[0]
    skipped = []
    for k, step in enumerate(range(14, 34), 1):
        st.step = step
        q.grad = torch.ones(3)
        before = q.detach().clone()
        fs.before_optimizer_step(opt, sched, [q])
        skip = f.coin("skip", step + 1, k) < f.p["p"]
        assert (q.grad is None) == skip
        skipped.append(skip)
        opt.step()
        sched.step()  # the scheduler carries on either way
        assert torch.equal(q.detach(), before) == skip
    assert sched.last_epoch == 20 and f.skipped == sum(skipped)
    assert all(skipped) if severity == "obvious" else 0 < sum(skipped) < 20


# ----------------------------------------------------------------------------- credit assignment


@pytest.mark.parametrize("severity,c", [("subtle", 0.5), ("obvious", 0.2)])
def test_advantage_clipped_at_ratio_range_clamps_every_advantage(severity, c):
    fs, st = fault_before_start("advantage_clipped_at_ratio_range", severity)
    adv = torch.tensor([[0.0, 2.47, 2.47, 0.0], [0.0, -0.35, -0.35, -0.35], [0.0, 0.3, 0.0, 0.0]])
    from tether.algos.base import AdvantageOutputs

    out = AdvantageOutputs(advantages_BT=adv)
    assert fs.on_advantages(out, torch.arange(3)) is out
    st.step = 14
    got = fs.on_advantages(out, torch.arange(3)).advantages_BT
    want = torch.tensor([[0.0, c, c, 0.0], [0.0, -min(c, 0.35), -min(c, 0.35), -min(c, 0.35)],
                         [0.0, min(c, 0.3), 0.0, 0.0]])
    assert torch.equal(got, want)


# ----------------------------------------------------------------------------- rollout queue


@pytest.mark.parametrize("severity,delay", [("subtle", 1), ("obvious", 4)])
def test_rollouts_trained_from_stale_queue_hands_out_groups_delay_steps_old(severity, delay):
    fs, st = fault_before_start("rollouts_trained_from_stale_queue", severity)
    batches = {s: [make_group(f"s{s}-p{i}", (1, 3), [1.0, 0.0], [True, False]) for i in range(2)] for s in range(13, 24)}
    assert fs.end_rollout(batches[13]) == batches[13]
    trained = []
    for s in range(14, 24):
        st.step = s
        trained.append(fs.end_rollout(batches[s]))
    want = [batches[max(14, s - delay)] for s in range(14, 24)]  # the first faulty batch again until the queue fills
    assert trained == want


# ----------------------------------------------------------------------------- the loss's inputs


def _batch(ids, mask):
    ids = torch.tensor(ids)
    loss = torch.tensor(mask, dtype=torch.float32)
    B = ids.shape[0]
    return TrainBatch(ids, ids != 0, loss, -loss, loss * 0.5, torch.arange(B), torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_eos_replaced_by_pad_in_trainer_batch_writes_the_pad_id_over_sampled_stop_ids(severity):
    policy = HFPolicy(model=torch.nn.Linear(1, 1), tokenizer=None, stop_ids=(2, 7), pad_id=0)
    rows = 12
    ids = [[5, 6, 9, 2, 0], [5, 2, 9, 7, 0], [2, 6, 4, 4, 2]] * 4  # prompt [5,6] / [5,2] / [2,6]; stops 2 and 7
    mask = [[0, 0, 1, 1, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]] * 4
    batch = _batch(ids, mask)
    fs, st = fault_before_start("eos_replaced_by_pad_in_trainer_batch", severity, policy=policy)
    assert fs.on_batch(batch) is batch
    st.step = 14
    got = fs.on_batch(batch)
    f = fs.faults[0]
    chosen = [f.coin(15, "row", b) < f.p["p"] for b in range(rows)]
    assert all(chosen) if severity == "obvious" else 0 < sum(chosen) < rows
    for b in range(rows):
        want = list(ids[b])
        if chosen[b]:
            want = [0 if m and t in (2, 7) else t for t, m in zip(want, mask[b])]  # prompt stop ids kept
        assert got.input_ids_BT[b].tolist() == want
    for name in ("loss_mask_BT", "advantages_BT", "rollout_logp_BT", "attention_mask_BT"):
        assert torch.equal(getattr(got, name), getattr(batch, name))


# ----------------------------------------------------------------------------- old-policy log-probs


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_old_logp_from_previous_step_buffer_returns_last_steps_rows(severity):
    fs, st = fault_before_start("old_logp_from_previous_step_buffer", severity)
    g = torch.Generator().manual_seed(0)
    steps = {s: -torch.rand(10, 4 + s % 3, generator=g) for s in range(13, 17)}
    assert fs.on_old_logp(steps[13], None) is steps[13]
    st.step = 14
    assert fs.on_old_logp(steps[14], None) is steps[14]  # the first faulty step: no buffer yet
    f = fs.faults[0]
    for s in (15, 16):
        st.step = s
        got = fs.on_old_logp(steps[s], None)
        prev, cur = steps[s - 1], steps[s]
        t = min(prev.shape[1], cur.shape[1])
        chosen = [f.coin(s + 1, "row", b) < f.p["p"] for b in range(10)]
        assert all(chosen) if severity == "obvious" else any(chosen)
        for b in range(10):
            if chosen[b]:
                want = torch.zeros(cur.shape[1])
                want[:t] = prev[b, :t]
            else:
                want = cur[b]
            assert torch.equal(got[b], want)
    # a shorter previous batch: rows it did not have keep their own values
    st.step = 17
    small = -torch.ones(3, 5)
    fs.on_old_logp(small, None)
    st.step = 18
    big = -torch.full((5, 5), 2.0)
    got = fs.on_old_logp(big, None)
    assert torch.equal(got[3:], big[3:])
