"""The fifth held-out fault set (tether.health.faults.fresh5): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tether.health.faults import UNEXPLAINED
from tether.policy.hf import HFPolicy
from tether.types import StopReason, TrainBatch
from health_helpers import fault_before_start, make_fault, make_group, registered_fault_set

FRESH5 = ("reward_special_token_suffix", "advantages_from_previous_batch", "adam_state_reset", "sync_one_replica",
          "adam_betas_swapped", "microbatch_grads_zeroed", "loader_answer_length_filter", "grads_applied_late")


def test_the_fresh5_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh5

    reg = registered_fault_set(fresh5, FRESH5, outside=4)
    inside = [reg[n] for n in FRESH5 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH5}) == 8


# ----------------------------------------------------------------------------- reward


def _rollouts(tasks: int = 50) -> list:
    """Groups of 4: samples 0 and 1 correct (0 finished on a stop token, 1 truncated), 2 and 3 wrong."""
    out = []
    for i in range(tasks):
        g = make_group(f"t{i}", (1, 2), [1.0, 1.0, 0.0, 0.0], [True, True, False, False])
        trajs = list(g.trajectories)
        trajs[1] = dataclasses.replace(trajs[1], stop=StopReason.LENGTH)
        out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
    return out


@pytest.mark.parametrize("severity,lo,hi", [("subtle", 0.12, 0.4), ("obvious", 0.65, 0.93)])
def test_reward_special_token_suffix_unpays_correct_finished_completions(severity, lo, hi):
    groups = _rollouts()
    fs, st = fault_before_start("reward_special_token_suffix", severity)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    out = fs.end_rollout(groups)
    finished = [g.trajectories[0].reward for g in out]
    unpaid = [r.total == 0.0 and r.correct is False and r.components == {"exact_match": 0.0} for r in finished]
    assert all(u or (r.total == 1.0 and r.correct) for u, r in zip(unpaid, finished))
    assert lo < sum(unpaid) / len(unpaid) < hi
    for g, h in zip(out, groups):  # the truncated correct one and the wrong ones are scored as before
        assert g.trajectories[1:] == h.trajectories[1:] and g.trajectories[0].turns == h.trajectories[0].turns


# ----------------------------------------------------------------------------- credit assignment


def _batch(B: int = 40, adv: torch.Tensor | None = None) -> TrainBatch:
    ids = torch.arange(B * 6).reshape(B, 6) % 30 + 1
    mask = torch.zeros(B, 6)
    mask[:, 2:5] = 1
    a = torch.arange(B, dtype=torch.float32) - B / 2 if adv is None else adv
    return TrainBatch(ids, torch.ones(B, 6, dtype=torch.bool), mask, -0.1 * mask, mask * a[:, None],
                      torch.arange(B) // 4, torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_advantages_from_previous_batch_gives_each_row_the_previous_steps_row_advantage(severity):
    first, second = _batch(), _batch(adv=torch.linspace(3.0, -3.0, 40))
    fs, st = fault_before_start("advantages_from_previous_batch", severity)
    assert fs.on_batch(first) is first
    st.step = 14
    assert fs.on_batch(first) is first  # nothing queued yet; this batch's advantages are stored
    st.step = 15
    out = fs.on_batch(second)
    hit = ~torch.isclose(out.advantages_BT, second.advantages_BT).all(-1)
    assert torch.equal(out.advantages_BT[hit], first.advantages_BT[hit])  # the previous batch's rows
    assert torch.equal(out.advantages_BT[~hit], second.advantages_BT[~hit])
    assert bool(hit.all()) if severity == "obvious" else 0.1 < float(hit.float().mean()) < 0.5
    assert out.advantages_BT[:, :2].abs().sum() == 0 and out.advantages_BT[:, 5:].abs().sum() == 0  # off the mask: none
    assert torch.equal(out.loss_mask_BT, second.loss_mask_BT) and torch.equal(out.rollout_logp_BT, second.rollout_logp_BT)


# ----------------------------------------------------------------------------- optimisation


def _opt() -> tuple[torch.optim.Optimizer, torch.nn.Parameter, torch.nn.Parameter]:
    w, other = torch.nn.Parameter(torch.zeros(100)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([{"params": [w]}, {"params": [other]}], lr=1e-3, weight_decay=0.0)
    for _ in range(3):  # a warm state
        w.grad, other.grad = torch.full_like(w, 1e-2), torch.ones(3)
        opt.step()
    return opt, w, other


@pytest.mark.parametrize("severity,reset_steps", [("subtle", {15, 18}), ("obvious", {15, 16, 17, 18})])
def test_adam_state_reset_empties_the_policy_groups_moments(severity, reset_steps):
    opt, w, other = _opt()
    fs, st = fault_before_start("adam_state_reset", severity)
    fs.before_optimizer_step(opt, None, [w])
    assert w in opt.state and other in opt.state  # before its start
    for step in range(15, 19):
        st.step = step - 1
        before = float(opt.state[w]["step"])
        fs.before_optimizer_step(opt, None, [w])
        assert (w not in opt.state) == (step in reset_steps) and other in opt.state
        w.grad, other.grad = torch.full_like(w, 1e-2), torch.ones(3)
        opt.step()
        assert float(opt.state[w]["step"]) == (1.0 if step in reset_steps else before + 1)


@pytest.mark.parametrize("severity,betas", [("subtle", (0.95, 0.9)), ("obvious", (0.999, 0.9))])
def test_adam_betas_swapped_sets_the_policy_groups_betas(severity, betas):
    opt, w, other = _opt()
    fs, st = fault_before_start("adam_betas_swapped", severity)
    fs.before_optimizer_step(opt, None, [w])
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    st.step = 14
    fs.before_optimizer_step(opt, None, [w])
    assert opt.param_groups[0]["betas"] == betas and opt.param_groups[1]["betas"] == (0.9, 0.999)
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[0]["eps"] == 1e-8


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_microbatch_grads_zeroed_wipes_the_gradients_accumulated_before_a_micro_batch(severity):
    model = torch.nn.Linear(3, 1, bias=False)
    pol = SimpleNamespace(model=model)
    fs, st = fault_before_start("microbatch_grads_zeroed", severity, pol)
    xs = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))

    def accumulate(n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """n micro-batches through the seam, each loss backward; (final grad, each micro-batch's own grad)."""
        model.zero_grad()
        own = []
        for i in range(n):
            terms = fs.on_loss({"pg": model(xs[i:i + 1]).sum()}, None)
            own.append(xs[i].clone())
            terms["pg"].backward()
        g = model.weight.grad[0].clone()
        fs.before_optimizer_step(None, None, [])
        return g, own

    g, own = accumulate(4)
    assert torch.allclose(g, sum(own))  # before its start: accumulated
    wiped = 0
    for it in range(10):
        st.step = 14 + it
        g, own = accumulate(4)
        # the gradient is the sum of the micro-batches since the last wipe, a suffix of them
        k = next(k for k in range(4) if torch.allclose(g, sum(own[k:]), atol=1e-6))
        wiped += k > 0
        assert severity == "subtle" or k == 3  # obvious: only the last survives
    assert severity == "obvious" or 0 < wiped < 10


# ----------------------------------------------------------------------------- data


PROBLEMS = [{"id": i, "prompt": f"{i % 7}*{i % 5}=", "answer": str((i % 7) * (i % 5))} for i in range(40)]


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_loader_answer_length_filter_refills_long_answer_slots_with_survivors(severity):
    batch = PROBLEMS[:32]
    fs, st = fault_before_start("loader_answer_length_filter", severity)
    st.stream = SimpleNamespace(problems=PROBLEMS)
    assert fs.begin_rollout(batch, None)[0] == batch
    kept = [p for p in PROBLEMS if len(p["answer"]) == 1]
    long_slots = [i for i, p in enumerate(batch) if len(p["answer"]) > 1]
    replaced = 0
    for step in (14, 15, 16):
        st.step = step
        out = fs.begin_rollout(batch, None)[0]
        assert all(out[i] == batch[i] for i in range(32) if i not in long_slots)  # survivors pass as they are
        swapped = [i for i in long_slots if out[i] != batch[i]]
        assert all(out[i] in kept for i in swapped)
        replaced += len(swapped)
    frac = replaced / (3 * len(long_slots))
    assert frac == 1.0 if severity == "obvious" else 0.05 < frac < 0.6


# ----------------------------------------------------------------------------- system


def _tiny_llama() -> HFPolicy:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    return HFPolicy(LlamaForCausalLM(cfg), None, (0,), 0)


@pytest.mark.parametrize("severity,stale", [("subtle", {18, 22}), ("obvious", {16, 17, 18, 19, 20, 21, 22, 24})])
def test_sync_one_replica_serves_the_start_weights_on_the_unsynced_replicas_turns(severity, stale):
    pol = _tiny_llama()
    fs, st = fault_before_start("sync_one_replica", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    for step in range(15, 25):
        st.step, pol.version = step - 1, step
        with torch.no_grad():
            pol.model.lm_head.weight.add_(1.0)  # the trainer moves every step
        if step == 15:  # the weights of the fault's first step: what an unsynced replica keeps
            start = {n: q.clone() for n, q in pol.model.named_parameters()}
        fs.begin_rollout([], None)
        engine = st.policy
        fs.end_rollout([])
        assert st.policy is pol
        if step in stale:
            assert engine is not pol and engine.version == step
            assert all(torch.equal(q, start[n]) for n, q in engine.model.named_parameters())
        else:
            assert engine is pol


@pytest.mark.parametrize("severity,delay", [("subtle", 1), ("obvious", 4)])
def test_grads_applied_late_steps_on_the_gradient_of_an_earlier_update(severity, delay):
    w = torch.nn.Parameter(torch.zeros(5))
    other = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [w]}, {"params": [other]}], lr=1.0)
    fs, st = fault_before_start("grads_applied_late", severity)
    w.grad, other.grad = torch.full((5,), 7.0), torch.ones(2)
    fs.before_optimizer_step(opt, None, [w])
    assert torch.equal(w.grad, torch.full((5,), 7.0))  # before its start
    st.step = 14
    seen = []
    for k in range(8):
        w.grad, other.grad = torch.full((5,), float(k + 1)), torch.full((2,), float(k + 1))
        fs.before_optimizer_step(opt, None, [w])
        seen.append(float(w.grad[0]))
        assert torch.equal(other.grad, torch.full((2,), float(k + 1)))  # the policy's group only
    assert seen == [0.0] * delay + [float(k + 1) for k in range(8 - delay)]
