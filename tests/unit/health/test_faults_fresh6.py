"""The sixth held-out fault set (tether.health.faults.fresh6): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tether.health.faults import UNEXPLAINED
from tether.policy.hf import HFPolicy
from tether.types import TrainBatch
from health_helpers import fault_before_start, make_group, registered_fault_set

FRESH6 = ("reward_length_sorted", "loo_filter_keeps_majority", "loo_advantage_spike", "sync_merge_accumulates",
          "grad_flat_offset", "adam_state_reordered", "old_logp_sequence_sum", "prefix_cache_collision")


def test_the_fresh6_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh6

    reg = registered_fault_set(fresh6, FRESH6, outside=4)
    inside = [reg[n] for n in FRESH6 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH6}) == 8


def _end_rollout_from_start(name: str, severity: str, groups: list) -> list:
    """The fault's `end_rollout` of `groups` on its first step (it passes them through the step before)."""
    fs, st = fault_before_start(name, severity)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    return fs.end_rollout(groups)


# ----------------------------------------------------------------------------- reward


def _length_groups(tasks: int = 40) -> list:
    """Groups of 4 with response lengths 3, 1, 2, 1 tokens and distinct rewards (task index + sample / 10)."""
    out = []
    for i in range(tasks):
        rewards = [i + k / 10 for k in range(4)]
        out.append(make_group(f"t{i}", (1, 2), rewards, [True] * 4, responses=[(5, 6, 7), (5,), (5, 6), (8,)]))
    return out


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_length_sorted_gives_each_sample_the_reward_of_the_chunks_kth_shortest(severity):
    groups = _length_groups()
    out = _end_rollout_from_start("reward_length_sorted", severity, groups)
    slots = [t for g in groups for t in g.trajectories]
    got = [t.reward for g in out for t in g.trajectories]
    size = 32 if severity == "subtle" else len(slots)
    sorted_chunks = 0
    for lo in range(0, len(slots), size):
        chunk = slots[lo:lo + size]
        expect = [t.reward for t in sorted(chunk, key=lambda t: t.num_action_tokens)]
        if got[lo:lo + size] == expect:
            sorted_chunks += 1
        else:
            assert got[lo:lo + size] == [t.reward for t in chunk]  # untouched chunk
    assert sorted_chunks == 1 if severity == "obvious" else 0 < sorted_chunks < 5
    assert [t.turns for g in out for t in g.trajectories] == [t.turns for t in slots]  # samples unchanged
    assert sorted(r.total for r in got) == sorted(t.reward.total for t in slots)  # the same scores, moved
    if severity == "obvious":  # rewards cross groups: sample 0 of group 0 gets the first 1-token sample's score
        assert got[0] is slots[1].reward and got[1] is slots[3].reward


# ----------------------------------------------------------------------------- data


PATTERNS = [[1.0] + [0.0] * 7, [0.0] * 7 + [1.0], [1.0] * 7 + [0.0], [1.0, 1.0, 1.0] + [0.0] * 5,
            [1.0, 0.0] * 4, [0.0] * 8]  # lone correct, lone wrong (twice), 3 of 8 correct, 4/4, all equal


@pytest.mark.parametrize("severity,k", [("subtle", 1), ("obvious", 3)])
def test_loo_filter_keeps_majority_drops_a_groups_small_minority(severity, k):
    groups = [make_group(f"t{i}", (1,), PATTERNS[i % 6], [r > 0 for r in PATTERNS[i % 6]]) for i in range(60)]
    out = _end_rollout_from_start("loo_filter_keeps_majority", severity, groups)
    filtered = 0
    for i, (g, h) in enumerate(zip(out, groups)):
        rewards = [t.reward.total for t in g.trajectories]
        minority = min(PATTERNS[i % 6].count(1.0), PATTERNS[i % 6].count(0.0))
        if not 0 < minority <= k:  # 4/4, all equal, and (k = 1) the 3-of-8 groups: nothing to drop
            assert g == h
        elif g != h:
            filtered += 1
            assert len(rewards) == 8 - minority and len(set(rewards)) == 1  # the majority, no signal left
            assert all(t in h.trajectories for t in g.trajectories)
    assert filtered == 40 if severity == "obvious" else 8 < filtered < 22  # subtle: half of the 30 lone-sample groups


# ----------------------------------------------------------------------------- credit assignment


def _adv(values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, 4] advantages (each row's value on positions 1..2, zero elsewhere) and the group ids."""
    rows = [v for g in values for v in g]
    adv = torch.zeros(len(rows), 4)
    adv[:, 1:3] = torch.tensor(rows)[:, None]
    return adv, torch.tensor([gi for gi, g in enumerate(values) for _ in g])


@pytest.mark.parametrize("severity,eps", [("subtle", 1e-2), ("obvious", 1e-6)])
def test_loo_advantage_spike_divides_a_lone_samples_gap_by_eps(severity, eps):
    r = torch.tensor([1.0] + [0.0] * 7)
    grpo = ((r - r.mean()) / (r.std() + 1e-6)).tolist()  # the lone correct sample's group, in float32
    lone, mixed = [2.0] + [-0.5] * 4, [1.0, 1.0, -1.0, -1.0]
    adv, group = _adv([lone, mixed, [0.0] * 4, grpo])
    fs, st = fault_before_start("loo_advantage_spike", severity)
    assert fs.on_advantages(_Adv(adv), group).advantages_BT is adv
    st.step = 14
    out = fs.on_advantages(_Adv(adv), group).advantages_BT
    assert torch.allclose(out[0, 1:3], torch.full((2,), 2.5 / eps))  # (A - mean of its peers) / (0 + eps)
    assert torch.equal(out[1:13], adv[1:13])  # the peers, the 2/2 group and the all-zero group: unchanged
    assert torch.allclose(out[13, 1:3], torch.full((2,), (grpo[0] - grpo[1]) / eps), rtol=1e-4)
    assert torch.equal(out[14:], adv[14:])
    assert out[:, 0].abs().sum() == 0 and out[:, 3].abs().sum() == 0  # off the loss tokens: none


@dataclasses.dataclass
class _Adv:
    advantages_BT: torch.Tensor


def _batch() -> TrainBatch:
    B = 40
    mask = torch.zeros(B, 6)
    mask[:, 2:5] = 1
    old = -0.1 * (torch.arange(6.0) + 1) * mask
    return TrainBatch(torch.ones(B, 6, dtype=torch.long), torch.ones(B, 6, dtype=torch.bool), mask, old.clone(),
                      mask.clone(), torch.arange(B) // 4, torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_old_logp_sequence_sum_puts_each_rows_summed_log_prob_in_every_token_slot(severity):
    batch = _batch()
    old = batch.rollout_logp_BT.clone()
    fs, st = fault_before_start("old_logp_sequence_sum", severity)
    assert fs.on_old_logp(old, batch) is old
    st.step = 14
    out = fs.on_old_logp(old, batch)
    hit = ~torch.isclose(out, old).all(-1)
    seq = -0.1 * (3 + 4 + 5)
    assert torch.allclose(out[hit][:, 2:5], torch.full((int(hit.sum()), 3), seq))
    assert torch.equal(out[hit][:, :2], old[hit][:, :2]) and torch.equal(out[~hit], old[~hit])
    assert bool(hit.all()) if severity == "obvious" else 0.1 < float(hit.float().mean()) < 0.6


# ----------------------------------------------------------------------------- optimisation


def _params(n: int = 8) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter], torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.zeros(3)) for _ in range(n)]
    other = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": ps}, {"params": [other]}], lr=1e-3)
    for i, q in enumerate(ps):
        q.grad = torch.arange(3.0) + 10 * i  # flat buffer: 0,1,2, 10,11,12, 20,21,22, ...
    other.grad = torch.ones(2)
    return opt, ps, other


@pytest.mark.parametrize("severity,first", [("subtle", 6), ("obvious", 1)])
def test_grad_flat_offset_reads_each_tensors_gradient_shifted_in_the_flat_buffer(severity, first):
    opt, ps, other = _params()
    fs, st = fault_before_start("grad_flat_offset", severity)
    fs.before_optimizer_step(opt, None, ps)
    assert all(torch.equal(q.grad, torch.arange(3.0) + 10 * i) for i, q in enumerate(ps))  # before its start
    st.step = 14
    flat = torch.cat([q.grad.clone() for q in ps])
    fs.before_optimizer_step(opt, None, ps)
    for i, q in enumerate(ps):
        shift = 0 if i < first else i - first + 1
        want = torch.cat([flat[3 * i + shift:3 * i + shift + 3], torch.zeros(3)])[:3]
        assert torch.equal(q.grad, want), i
    assert torch.equal(other.grad, torch.ones(2))  # the policy's group only


@pytest.mark.parametrize("severity,resumes", [("subtle", {15}), ("obvious", {15, 16, 17, 18, 19})])
def test_adam_state_reordered_rotates_the_moments_within_each_shape_class(severity, resumes):
    a, b, c = (torch.nn.Parameter(torch.zeros(4)) for _ in range(3))
    m = torch.nn.Parameter(torch.zeros(2, 2))
    opt = torch.optim.AdamW([{"params": [a, b, c, m]}], lr=1e-3)
    for q, g in ((a, 1.0), (b, 2.0), (c, 3.0), (m, 4.0)):
        q.grad = torch.full_like(q, g)
    opt.step()
    fs, st = fault_before_start("adam_state_reordered", severity)
    fs.before_optimizer_step(opt, None, [])
    assert [float(opt.state[q]["exp_avg"].flatten()[0]) for q in (a, b, c)] == pytest.approx([0.1, 0.2, 0.3])
    owner = {0.1: "a", 0.2: "b", 0.3: "c"}
    rotations = 0
    for step in range(15, 20):
        st.step = step - 1
        before = [owner[round(float(opt.state[q]["exp_avg"][0]), 4)] for q in (a, b, c)]
        for _ in range(2):  # two optimizer steps in a training step: one resume at most
            fs.before_optimizer_step(opt, None, [])
        after = [owner[round(float(opt.state[q]["exp_avg"][0]), 4)] for q in (a, b, c)]
        assert after == (before[-1:] + before[:-1] if step in resumes else before)
        rotations += after != before
        assert float(opt.state[m]["exp_avg"][0, 0]) == pytest.approx(0.4)  # alone in its shape: kept
    assert rotations == len(resumes)


# ----------------------------------------------------------------------------- system


def _tiny_llama() -> HFPolicy:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    return HFPolicy(LlamaForCausalLM(cfg), None, (0,), 0)


@pytest.mark.parametrize("severity,targets", [("subtle", ("q_proj", "v_proj")),
                                              ("obvious", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"))])
def test_sync_merge_accumulates_adds_every_synced_delta_again(severity, targets):
    pol = _tiny_llama()
    fs, st = fault_before_start("sync_merge_accumulates", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    base = {n: q.detach().clone() for n, q in pol.model.named_parameters()}
    for k in range(4):  # steps 15..18; the trainer has moved every tensor by 0.1 x k when step 15 + k syncs
        st.step, pol.version = 14 + k, 15 + k
        with torch.no_grad():
            for n, q in pol.model.named_parameters():
                q.copy_(base[n] + 0.1 * k)
        fs.begin_rollout([], None)
        engine = st.policy
        fs.end_rollout([])
        assert engine is not pol and engine.version == pol.version and st.policy is pol
        for n, q in engine.model.named_parameters():
            merged = "layers." in n and q.dim() == 2 and any(t in n for t in targets)
            want = base[n] + (0.1 * k * (k + 1) / 2 if merged else 0.1 * k)  # base + the sum of every delta
            assert torch.allclose(q, want, atol=1e-5), (n, k)


PROBLEMS = [{"id": f"p{i}", "prompt": f"{i % 9}{'+-*'[i % 3]}{i % 7}=", "answer": str(i)} for i in range(32)]


def _run_rollout(problems: list[dict]) -> list:
    """What the engine returns: each group's context ids are its prompt's characters, its response the prompt's."""
    return [dataclasses.replace(make_group(str(p["id"]), tuple(ord(c) for c in p["prompt"]), [0.0] * 2, [False] * 2,
                                           responses=[tuple(ord(c) for c in p["prompt"])] * 2), task=p)
            for p in problems]


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_prefix_cache_collision_generates_from_a_partners_prompt_but_reports_its_own(severity):
    fs, st = fault_before_start("prefix_cache_collision", severity)
    problems = PROBLEMS + [dict(PROBLEMS[0], id="long", prompt="12+34=")]  # no partner of its length
    assert fs.begin_rollout(problems, None)[0] == problems
    st.step = 14
    ran, _ = fs.begin_rollout(problems, None)
    out = fs.end_rollout(_run_rollout(ran))
    collided = 0
    for p, q, g in zip(problems, ran, out):
        own = tuple(ord(c) for c in p["prompt"])
        assert q["id"] == p["id"] and q["answer"] == p["answer"]  # scored against its own answer
        assert all(t.turns[0].context_ids == own for t in g.trajectories)  # the ids the engine reports
        if q["prompt"] != p["prompt"]:
            collided += 1
            assert g.task["prompt"] == p["prompt"]  # the group's task is the problem's own
            assert len(q["prompt"]) == len(p["prompt"])  # an equal-length partner's prompt
            assert all(t.turns[0].action_ids == tuple(ord(c) for c in q["prompt"]) for t in g.trajectories)
    assert ran[-1] == problems[-1]
    assert collided == 32 if severity == "obvious" else 2 <= collided <= 20
