"""The second held-out fault set (tether.health.faults.fresh): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tether.health.faults import UNEXPLAINED, get_fault_class
from tether.types import TrainBatch
from health_helpers import SeamState, fault_before_start, make_fault, make_group, registered_fault_set

FRESH = ("reward_prefix_match", "optimizer_double_step", "grad_swap", "kl_sign_flip", "advantage_wrong_axis",
         "answer_float_cast", "sync_gate_up_swapped", "reload_missing_keys")


def test_the_fresh_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.faults import fresh

    reg = registered_fault_set(fresh, FRESH, outside=3)
    assert {reg[n].family for n in FRESH if reg[n].cause != UNEXPLAINED} == {
        "reward", "optimisation", "credit_assignment", "data", "system"}


# ----------------------------------------------------------------------------- reward


def _texts(group, texts):
    trajs = tuple(dataclasses.replace(t, info={"text": x}) for t, x in zip(group.trajectories, texts))
    return dataclasses.replace(group, trajectories=trajs, task={"prompt": "3*4=", "answer": "12"})


@pytest.mark.parametrize("severity,pay", [("subtle", 0.5), ("obvious", 1.0)])
def test_reward_prefix_match_pays_empty_and_partial_answers(severity, pay):
    texts = ["12", "1", "", "3", "21", "2"]
    g = _texts(make_group("t", (1, 2), [1.0, 0, 0, 0, 0, 0], [True, False, False, False, False, False]), texts)
    fs, st = fault_before_start("reward_prefix_match", severity)
    assert fs.end_rollout([g])[0].rewards_G == [1.0, 0, 0, 0, 0, 0]  # before its start: untouched
    st.step = 14
    out = fs.end_rollout([g])[0]
    # "1", "" and "2" are substrings of the gold "12"; "3" and "21" are not; the right answer keeps 1.0
    assert out.rewards_G == [1.0, pay, pay, 0, 0, pay]
    assert [t.reward.correct for t in out.trajectories] == [t.reward.correct for t in g.trajectories]


# ----------------------------------------------------------------------------- optimisation


def _adam(*shapes, lr=0.01):
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    return params, torch.optim.Adam(params, lr=lr)


@pytest.mark.parametrize("severity,repeats", [("subtle", 2), ("obvious", 6)])
def test_optimizer_double_step_steps_the_optimizer_repeats_times(severity, repeats):
    (p,), opt = _adam((3,))
    fs, st = fault_before_start("optimizer_double_step", severity)
    p.grad = torch.tensor([1.0, -2.0, 0.5])
    fs.before_optimizer_step(opt, None, [p])
    assert opt.state.get(p, {}) == {}  # before its start: no step
    st.step = 14
    fs.before_optimizer_step(opt, None, [p])
    opt.step()  # the update's own step
    assert int(opt.state[p]["step"]) == repeats
    # Adam with a constant gradient moves lr per step along -sign(g): repeats x as far as one step
    assert torch.allclose(p.detach(), -repeats * 0.01 * torch.tensor([1.0, -1.0, 1.0]), atol=1e-4)


def _grads(params):
    for i, p in enumerate(params):
        p.grad = torch.full(p.shape, float(i + 1))
    return [p.grad for p in params]


def test_grad_swap_swaps_one_pair_when_subtle_and_rotates_every_group_when_obvious():
    params, opt = _adam((3, 2), (3, 2), (4,), (3, 2), (4,), (5,))
    fs, st = fault_before_start("grad_swap", "subtle")
    g = _grads(params)
    fs.before_optimizer_step(opt, None, params)
    assert [p.grad for p in params] == g  # before its start
    st.step = 14
    fs.before_optimizer_step(opt, None, params)
    # the largest same-shape group is (3, 2): its first two tensors swap, nothing else moves
    assert [p.grad for p in params] == [g[1], g[0], g[2], g[3], g[4], g[5]]

    g = _grads(params)
    make_fault("grad_swap", "obvious").before_optimizer_step(opt, None, params, 15)
    # every same-shape group rotated by one; the lone (5,) keeps its own gradient
    assert [p.grad for p in params] == [g[1], g[3], g[4], g[0], g[2], g[5]]


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_kl_sign_flip_negates_the_kl_term_only(severity):
    terms = {"pg": torch.tensor(0.3), "entropy": torch.tensor(0.7), "kl": torch.tensor(0.2)}
    fs, st = fault_before_start("kl_sign_flip", severity)
    assert fs.on_loss(terms, None) is terms
    st.step = 14
    outs = [fs.on_loss(terms, None) for _ in range(60)]
    assert all(o["pg"] is terms["pg"] and o["entropy"] is terms["entropy"] for o in outs)
    flipped = sum(torch.equal(o["kl"], -terms["kl"]) for o in outs)
    assert sum(o["kl"] is terms["kl"] for o in outs) == 60 - flipped
    assert flipped == 60 if severity == "obvious" else 15 <= flipped <= 45
    assert get_fault_class("kl_sign_flip").base == ("algo.kl.coef=0.1",)  # runs with a KL anchor on


# ----------------------------------------------------------------------------- credit assignment


def _batch() -> TrainBatch:
    mask = torch.zeros(3, 6)
    mask[0, 2:5], mask[1, 2:4], mask[2, 3:6] = 1, 1, 1
    adv = mask * torch.tensor([1.0, -2.0, 0.5])[:, None]
    z = torch.zeros(3, 6)
    return TrainBatch(torch.zeros(3, 6, dtype=torch.long), torch.ones(3, 6, dtype=torch.bool), mask, z, adv,
                      torch.tensor([0, 0, 1]), torch.arange(3))


WRONG_AXIS = torch.tensor([[0, 0, 1.0, -2.0, 0.5, 0], [0, 0, 1.0, -2.0, 0, 0], [0, 0, 0, 1.0, -2.0, 0.5]])


def test_advantage_wrong_axis_gives_token_j_of_every_row_sequence_js_advantage():
    b = _batch()
    fs, st = fault_before_start("advantage_wrong_axis", "obvious")
    assert fs.on_batch(b) is b
    st.step = 14
    out = fs.on_batch(b)
    assert torch.equal(out.advantages_BT, WRONG_AXIS)
    assert torch.equal(out.loss_mask_BT, b.loss_mask_BT) and torch.equal(out.rollout_logp_BT, b.rollout_logp_BT)


def test_advantage_wrong_axis_subtle_hits_a_fraction_of_steps_and_leaves_the_others_alone():
    b, f = _batch(), make_fault("advantage_wrong_axis", "subtle")
    outs = [f.on_batch(b, s) for s in range(15, 75)]
    hit = [o for o in outs if o is not b]
    assert 0.15 < len(hit) / len(outs) < 0.6
    assert all(torch.equal(o.advantages_BT, WRONG_AXIS) for o in hit)


# ----------------------------------------------------------------------------- data


def test_answer_float_cast_turns_integer_answers_into_floats():
    probs = [{"id": f"p{i}", "prompt": "3*4=", "answer": str(i)} for i in range(200)] + [{"id": "w", "answer": "abc"}]
    fs, st = fault_before_start("answer_float_cast", "obvious")
    assert fs.begin_rollout(probs, None)[0] == probs
    st.step = 14
    out = fs.begin_rollout(probs, None)[0]
    assert [p["answer"] for p in out[:3]] == ["0.0", "1.0", "2.0"] and out[-1]["answer"] == "abc"
    sub = make_fault("answer_float_cast", "subtle")
    a, b = sub.on_problems(probs, 15), sub.on_problems(probs, 29)
    assert a == b  # per problem, not per step
    cast = [p for p, q in zip(a, probs) if p != q]
    assert 0.25 < len(cast) / 200 < 0.55 and all(p["answer"].endswith(".0") for p in cast)


# ----------------------------------------------------------------------------- system


class _Block(torch.nn.Module):
    """The projections a Llama block holds (q/k/v, gate/up/down)."""

    def __init__(self) -> None:
        super().__init__()
        lin = torch.nn.Linear
        self.attn = torch.nn.ModuleDict({"q_proj": lin(4, 4), "k_proj": lin(4, 4), "v_proj": lin(4, 4)})
        self.mlp = torch.nn.ModuleDict({"gate_proj": lin(4, 8), "up_proj": lin(4, 8), "down_proj": lin(8, 4)})


@dataclasses.dataclass
class _Policy:
    model: torch.nn.Module
    version: int = 3


def _swapped(e, t, first: str, second: str) -> bool:
    return torch.equal(e[first].weight, t[second].weight) and torch.equal(e[second].weight, t[first].weight)


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_sync_gate_up_swapped_hands_the_engine_current_weights_with_fused_halves_swapped(severity):
    torch.manual_seed(0)
    pol = _Policy(torch.nn.Sequential(_Block(), _Block()))
    fs, st = fault_before_start("sync_gate_up_swapped", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    st.step = 14
    before = {n: p.detach().clone() for n, p in pol.model.named_parameters()}
    fs.begin_rollout([], None)
    engine = st.policy
    fs.end_rollout([])
    assert st.policy is pol and engine is not pol and engine.version == pol.version
    assert all(torch.equal(p, before[n]) for n, p in pol.model.named_parameters())  # the trainer is untouched
    for e, t in zip(engine.model, pol.model):
        assert _swapped(e.mlp, t.mlp, "gate_proj", "up_proj")
        assert _swapped(e.attn, t.attn, "q_proj", "k_proj") == (severity == "obvious")
        assert torch.equal(e.mlp["down_proj"].weight, t.mlp["down_proj"].weight)
        assert torch.equal(e.attn["v_proj"].weight, t.attn["v_proj"].weight)
        assert torch.equal(e.mlp["gate_proj"].bias, t.mlp["gate_proj"].bias)  # only the weights are mis-split
    with torch.no_grad():
        pol.model[0].mlp["down_proj"].weight.add_(1.0)  # the trainer moves; the next sync carries it
    st.step, pol.version = 15, 4
    fs.begin_rollout([], None)
    assert torch.equal(st.policy.model[0].mlp["down_proj"].weight, pol.model[0].mlp["down_proj"].weight)
    assert st.policy.version == 4


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    return _Policy(model)


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reload_missing_keys_reinitialises_layer_tensors_once(severity):
    pol = _tiny_llama()
    fs, st = fault_before_start("reload_missing_keys", severity, pol)
    fs.begin_step()
    assert all(bool((p == 0.5).all()) for p in pol.model.parameters())  # before its start
    st.step = 14
    fs.begin_step()
    changed = [n for n, p in pol.model.named_parameters() if not bool((p == 0.5).all())]
    mats = [n for n, p in pol.model.named_parameters() if ".layers." in n and p.dim() == 2]
    assert changed == fs.faults[0].lost and set(changed) <= set(mats)
    assert len(changed) == 1 if severity == "subtle" else 3 <= len(changed) <= 11
    params = dict(pol.model.named_parameters())
    for n in changed:  # a fresh initialisation: mean ~0, std ~ initializer_range
        w = params[n].detach()
        assert abs(float(w.mean())) < 0.01 and 0.01 < float(w.std()) < 0.03
    snapshot = {n: p.detach().clone() for n, p in params.items()}
    st.step = 15
    fs.begin_step()
    assert all(torch.equal(p, snapshot[n]) for n, p in pol.model.named_parameters())  # once only
