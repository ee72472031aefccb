"""The seventh held-out fault set (tether.health.faults.fresh7): each hook corrupts exactly what its
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

FRESH7 = ("reward_gold_substring", "engine_rope_default", "forward_without_grad", "mask_includes_prompt",
          "checkpoint_sorted_lexically", "adam_step_count_reset", "prompt_template_drift", "rollout_logp_shifted")


def test_the_fresh7_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh7

    reg = registered_fault_set(fresh7, FRESH7, outside=4)
    inside = [reg[n] for n in FRESH7 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH7}) == 8


def _end_rollout_from_start(name: str, severity: str, groups: list) -> list:
    """The fault's `end_rollout` of `groups` on its first step (it passes them through the step before)."""
    fs, st = fault_before_start(name, severity)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    return fs.end_rollout(groups)


# ----------------------------------------------------------------------------- reward

TEXTS = ["1", "12", "3", "21", "", "7"]  # gold "1": right, contains it, wrong, contains it, empty, wrong


def _text_groups(n: int = 40) -> list:
    out = []
    for i in range(n):
        g = make_group(f"t{i}", (1, 2), [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [True] + [False] * 5)
        trajs = tuple(dataclasses.replace(t, info={"text": x}) for t, x in zip(g.trajectories, TEXTS))
        out.append(dataclasses.replace(g, trajectories=trajs))
    return out


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_gold_substring_pays_wrong_answers_that_contain_the_gold(severity):
    groups = _text_groups()
    out = _end_rollout_from_start("reward_gold_substring", severity, groups)
    paid = 0
    for g, h in zip(out, groups):
        for k, (t, u) in enumerate(zip(g.trajectories, h.trajectories)):
            assert t.turns == u.turns and t.reward.correct == u.reward.correct  # the sample and its verdict
            if TEXTS[k] in ("12", "21") and t.reward.total != u.reward.total:
                paid += 1
                assert t.reward.total == 1.0
            else:
                assert t.reward == u.reward  # right answers, answers without the gold, the empty one
    assert paid == 80 if severity == "obvious" else 20 < paid < 60


# ----------------------------------------------------------------------------- optimisation


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_forward_without_grad_detaches_a_micro_batchs_loss_terms_keeping_their_values(severity):
    w = torch.ones(3, requires_grad=True)
    terms = {"pg": (w * 2).sum(), "kl": (w * w).sum(), "tokens": 7}
    fs, st = fault_before_start("forward_without_grad", severity)
    assert fs.on_loss(terms, None) is terms
    cut = 0
    for step in range(15, 35):
        st.step = step - 1
        for _ in range(2):  # two micro-batches a step
            out = fs.on_loss(terms, None)
            assert out["tokens"] == 7 and all(torch.equal(out[k], terms[k]) for k in ("pg", "kl"))  # values kept
            detached = [not out[k].requires_grad for k in ("pg", "kl")]
            assert all(detached) or not any(detached)  # the micro-batch's graph, whole or none
            cut += all(detached)
    assert cut == 40 if severity == "obvious" else 8 < cut < 32


@pytest.mark.parametrize("severity,resumes", [("subtle", {15}), ("obvious", {15, 16, 17, 18})])
def test_adam_step_count_reset_zeroes_the_step_counters_and_keeps_the_moments(severity, resumes):
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))
    other = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [a, b]}, {"params": [other]}], lr=1e-3)
    for q in (a, b, other):
        q.grad = torch.ones_like(q)
    opt.step()  # the history a resume finds
    fs, st = fault_before_start("adam_step_count_reset", severity)
    count = 1
    for step in range(13, 19):
        st.step = step - 1
        for _ in range(2):  # two optimizer steps in a training step: one resume at most
            moments = [(opt.state[q]["exp_avg"].clone(), opt.state[q]["exp_avg_sq"].clone()) for q in (a, b)]
            fs.before_optimizer_step(opt, None, [])
            assert all(torch.equal(m, opt.state[q]["exp_avg"]) and torch.equal(v, opt.state[q]["exp_avg_sq"])
                       for (m, v), q in zip(moments, (a, b)))  # the moments are kept
            opt.step()
        count = 2 if step in resumes else count + 2
        assert [float(opt.state[q]["step"]) for q in (a, b)] == [count, count], step
    assert float(opt.state[other]["step"]) == 13.0  # the other parameter group is never touched
    assert count == (2 if severity == "obvious" else 8)  # subtle: reset at 15 only


# ----------------------------------------------------------------------------- credit assignment


def _prompt_batch(B: int = 40) -> TrainBatch:
    """Rows of a 3-token prompt (0..2), a 3-token response (3..5), one pad (6); advantage = row index."""
    attn = torch.ones(B, 7, dtype=torch.bool)
    attn[:, 6] = False
    mask = torch.zeros(B, 7)
    mask[:, 3:6] = 1
    adv = torch.arange(B, dtype=torch.float32)[:, None] * mask
    logp = -0.5 * mask
    return TrainBatch(torch.ones(B, 7, dtype=torch.long), attn, mask, logp, adv, torch.arange(B) // 4, torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_mask_includes_prompt_trains_the_prompts_tail_with_the_rows_advantage(severity):
    batch = _prompt_batch()
    fs, st = fault_before_start("mask_includes_prompt", severity)
    assert fs.on_batch(batch) is batch
    st.step = 14
    out = fs.on_batch(batch)
    hit = (out.loss_mask_BT != batch.loss_mask_BT).any(-1)
    prompt = [1, 2] if severity == "obvious" else [2]  # position 0 is never predicted
    for b in range(batch.num_seqs):
        if hit[b]:
            assert out.loss_mask_BT[b].tolist() == [1.0 if t in prompt or 3 <= t <= 5 else 0.0 for t in range(7)]
            assert out.advantages_BT[b, prompt].tolist() == [float(b)] * len(prompt)
        else:
            assert torch.equal(out.loss_mask_BT[b], batch.loss_mask_BT[b])
    assert torch.equal(out.advantages_BT[:, 3:], batch.advantages_BT[:, 3:]) and torch.equal(out.advantages_BT[:, 0], batch.advantages_BT[:, 0])
    assert torch.equal(out.rollout_logp_BT, batch.rollout_logp_BT) and torch.equal(out.input_ids_BT, batch.input_ids_BT)
    assert bool(hit.all()) if severity == "obvious" else 0.2 < float(hit.float().mean()) < 0.8


# ----------------------------------------------------------------------------- data


PROBLEMS = [{"id": f"p{i}", "prompt": f"{i % 9}{'+-*'[i % 3]}{i % 7}=", "answer": str(i)} for i in range(40)]


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_prompt_template_drift_renders_the_prompts_in_another_template(severity):
    fs, st = fault_before_start("prompt_template_drift", severity)
    assert fs.begin_rollout(PROBLEMS, None)[0] == PROBLEMS
    st.step = 14
    out, _ = fs.begin_rollout(PROBLEMS, None)
    moved = 0
    for p, q in zip(PROBLEMS, out):
        assert {k: v for k, v in q.items() if k != "prompt"} == {k: v for k, v in p.items() if k != "prompt"}
        if q["prompt"] != p["prompt"]:
            moved += 1
            a, op, b = p["prompt"][0], p["prompt"][1], p["prompt"][2]
            want = f"Question: {a} {op} {b} =\nAnswer:" if severity == "obvious" else "Q: " + p["prompt"]
            assert q["prompt"] == want
    assert moved == 40 if severity == "obvious" else 8 < moved < 32
    st.step = 20
    assert fs.begin_rollout(PROBLEMS, None)[0] == out  # the same problems keep their template


# ----------------------------------------------------------------------------- system


def _tiny_llama() -> HFPolicy:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    return HFPolicy(LlamaForCausalLM(cfg), None, (0,), 0)


@pytest.mark.parametrize("severity,base", [("subtle", 5e5), ("obvious", 1e7)])
def test_engine_rope_default_runs_the_trainers_weights_with_other_rotary_frequencies(severity, base):
    pol = _tiny_llama()
    fs, st = fault_before_start("engine_rope_default", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    trainer_freq = pol.model.model.rotary_emb.inv_freq.clone()
    assert torch.allclose(trainer_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]))  # head dim 8, the config's 10000
    for k in range(3):
        st.step, pol.version = 14 + k, 15 + k
        with torch.no_grad():
            for q in pol.model.parameters():
                q.add_(0.1)  # the trainer moved
        fs.begin_rollout([], None)
        engine = st.policy
        fs.end_rollout([])
        assert engine is not pol and engine.version == pol.version and st.policy is pol
        assert all(torch.equal(q, lq) for q, lq in zip(engine.model.parameters(), pol.model.parameters()))
        want = 1.0 / base ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
        assert torch.allclose(engine.model.model.rotary_emb.inv_freq, want)
        assert torch.equal(pol.model.model.rotary_emb.inv_freq, trainer_freq)  # the trainer's stays right
    x, pos = torch.zeros(1, 4, 16), torch.arange(4)[None]
    with torch.no_grad():  # what the forward rotates by: position 0 alike (angle 0), later ones apart
        (ca, sa), (cb, sb) = pol.model.model.rotary_emb(x, pos), engine.model.model.rotary_emb(x, pos)
    assert torch.allclose(ca[:, 0], cb[:, 0]) and torch.allclose(sa[:, 0], sb[:, 0])
    assert (sa[:, 1:] - sb[:, 1:]).abs().max() > 0.05


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_rollout_logp_shifted_files_each_tokens_log_prob_one_position_early(severity):
    groups = []
    for i in range(40):
        g = make_group(f"t{i}", (1, 2), [0.0, 1.0], [False, True], responses=[(5, 6, 7), (8,)])
        trajs = tuple(dataclasses.replace(t, turns=(dataclasses.replace(
            t.turns[0], action_logprobs=tuple(-0.1 * (j + 1) for j in range(len(t.turns[0].action_ids)))),))
            for t in g.trajectories)
        groups.append(dataclasses.replace(g, trajectories=trajs))
    out = _end_rollout_from_start("rollout_logp_shifted", severity, groups)
    moved = 0
    for g, h in zip(out, groups):
        assert [t.reward for t in g.trajectories] == [t.reward for t in h.trajectories]
        assert [t.turns[0].action_ids for t in g.trajectories] == [t.turns[0].action_ids for t in h.trajectories]
        if g != h:
            moved += 1
            assert g.trajectories[0].turns[0].action_logprobs == pytest.approx((-0.2, -0.3, 0.0))
            assert g.trajectories[1].turns[0].action_logprobs == (0.0,)
    assert moved == 40 if severity == "obvious" else 8 < moved < 32


class _Policy:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(2, 2)


@pytest.mark.parametrize("severity,resumes", [("subtle", [20]), ("obvious", [18, 21, 24])])
def test_checkpoint_sorted_lexically_reloads_the_start_checkpoint_at_each_resume(severity, resumes):
    pol = _Policy()
    fs, st = fault_before_start("checkpoint_sorted_lexically", severity, pol)
    st.optimizer = torch.optim.AdamW(pol.model.parameters(), lr=0.1)

    def update() -> None:
        pol.model.weight.grad, pol.model.bias.grad = torch.ones(2, 2), torch.ones(2)
        st.optimizer.step()

    update()
    fs.begin_step()  # step 14: before the start, nothing saved
    assert not hasattr(fs.faults[0], "_saved")
    start_w = pol.model.weight.detach().clone()
    for step in range(15, 26):
        st.step = step - 1
        fs.begin_step()
        w = pol.model.weight.detach().clone()
        if step in resumes or step == 15:  # the checkpoint of the start, taken before that step's update
            assert torch.equal(w, start_w) and float(st.optimizer.state[pol.model.weight]["step"]) == 1
        else:
            assert not torch.equal(w, start_w)  # the updates since the start or the last resume
        update()
    assert fs.faults[0].resumed == resumes
