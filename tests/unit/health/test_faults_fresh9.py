"""The ninth held-out fault set (tether.health.faults.fresh9): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import collections
import dataclasses
import types

import pytest
import torch

from tether.algos.base import AdvantageOutputs
from tether.health.faults import UNEXPLAINED
from tether.policy.base import HFPolicy
from tether.policy.config import SamplingConfig
from tether.types import TrainBatch
from health_helpers import fault_before_start, make_group, registered_fault_set

FRESH9 = ("reward_majority_vote", "advantage_integer_dtype", "gold_answer_modular", "stop_string_token_ids",
          "weights_left_at_ema", "weight_decay_coupled", "trainer_prompt_other_row", "old_logp_scoring_noise")


def test_the_fresh9_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh9

    reg = registered_fault_set(fresh9, FRESH9, outside=4)
    inside = [reg[n] for n in FRESH9 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH9}) == 8
    hooks = ("on_problems", "on_sampler", "on_rollouts", "on_advantages", "on_batch", "on_old_logp",
             "before_optimizer_step", "install")
    assert sorted(h for n in FRESH9 for h in hooks if h in vars(reg[n])) == sorted(hooks)  # one seam each


# ----------------------------------------------------------------------------- reward


def _vote_groups(n: int = 40) -> list:
    """Groups of 8 whose majority answer (token ids) is right in some groups and wrong in others."""
    groups = []
    for k in range(n):
        right, wrong = (5, 2), (6 + k % 3, 2)
        # k % 4 == 0: the right answer wins; 1: a tie, the wrong one sampled first; 2, 3: the wrong one wins
        responses = [wrong] * (3 + k % 4) + [right] * (5 - k % 4)
        rewards = [1.0 if r == right else 0.0 for r in responses]
        groups.append(make_group(f"p{k}", (1, 2, 3), rewards, [r > 0 for r in rewards], responses))
    return groups


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_majority_vote_pays_agreement_with_the_groups_most_common_answer(severity):
    groups = _vote_groups()
    fs, st = fault_before_start("reward_majority_vote", severity)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    out = fs.end_rollout(groups)
    voted = 0
    for g, h in zip(groups, out):
        assert [t.response_ids for t in h.trajectories] == [t.response_ids for t in g.trajectories]
        if h == g:
            continue
        voted += 1
        counts = collections.Counter(t.response_ids for t in g.trajectories)
        top = max(counts.values())
        winner = next(t.response_ids for t in g.trajectories if counts[t.response_ids] == top)  # ties: first sampled
        for t in h.trajectories:
            paid = 1.0 if t.response_ids == winner else 0.0
            assert t.reward.total == paid and dict(t.reward.components) == {"exact_match": paid}
            assert t.reward.correct is (paid == 1.0)
    assert voted == 30 if severity == "obvious" else 2 < voted < 20  # groups whose majority is right keep their rewards
    st.step = 15  # a problem's label reaches the reward or not for the whole run
    assert fs.end_rollout(groups) == out


# ----------------------------------------------------------------------------- credit assignment


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_advantage_integer_dtype_truncates_the_advantages_of_its_groups_toward_zero(severity):
    group_B = torch.arange(40).repeat_interleave(8)
    adv = torch.linspace(-2.6, 2.6, 320)[torch.randperm(320, generator=torch.Generator().manual_seed(0))]
    adv_BT = adv[:, None] * torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])  # prompt, three response tokens, padding
    a = AdvantageOutputs(adv_BT)
    fs, st = fault_before_start("advantage_integer_dtype", severity)
    assert fs.on_advantages(a, group_B) is a
    st.step = 14
    got = fs.on_advantages(a, group_B).advantages_BT
    assert got.dtype == adv_BT.dtype and torch.equal(got[:, [0, 4]], adv_BT[:, [0, 4]])
    hit = {int(g) for g in group_B[(got != adv_BT).any(-1)]}
    for g in range(40):
        rows = group_B == g
        if g in hit:
            assert torch.equal(got[rows], torch.trunc(adv_BT[rows]))  # -0.35 -> 0, 2.47 -> 2, -1.2 -> -1
        else:
            assert torch.equal(got[rows], adv_BT[rows])
    assert len(hit) == 40 if severity == "obvious" else 4 < len(hit) < 24
    hit_rows = torch.isin(group_B, torch.tensor(sorted(hit)))
    assert torch.equal(got[hit_rows], got[hit_rows].trunc())  # no fractional advantage left in the hit groups' rows
    if severity == "obvious":
        assert set(got.unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0, 2.0}


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("severity,mod", [("subtle", 23), ("obvious", 10)])
def test_gold_answer_modular_keeps_the_remainder_of_answers_at_or_above_the_modulus(severity, mod):
    problems = [{"id": f"p{a}x{b}", "prompt": f"{a}*{b}=", "answer": str(a * b)} for a in range(10) for b in range(10)]
    problems += [{"id": "word", "prompt": "x", "answer": "ten"}, {"id": "float", "prompt": "y", "answer": "25.5"}]
    fs, st = fault_before_start("gold_answer_modular", severity)
    assert fs.begin_rollout(problems, None)[0] == problems
    st.step = 14
    out, _ = fs.begin_rollout(problems, None)
    changed = 0
    for p, q in zip(problems, out):
        assert {k: v for k, v in q.items() if k != "answer"} == {k: v for k, v in p.items() if k != "answer"}
        if p["answer"].isdigit() and int(p["answer"]) >= mod:
            changed += 1
            assert q["answer"] == str(int(p["answer"]) % mod)  # "60" -> "14" (mod 23), "81" -> "1" (mod 10)
        else:
            assert q == p
    assert changed == sum(a * b >= mod for a in range(10) for b in range(10)) and changed > 20


# ----------------------------------------------------------------------------- system


class _CharTok:
    """One id per character (the ids of "\\n", ".", "0".."9" are 3, 4, 10..19)."""

    vocab = {"\n": 3, ".": 4, **{str(d): 10 + d for d in range(10)}}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.get(ch, 40) for ch in text]


@pytest.mark.parametrize("severity,extra", [("subtle", (3, 12, 4)), ("obvious", (3, 11, 4, 12))])
def test_stop_string_token_ids_makes_each_character_of_the_stop_string_a_stop_token(severity, extra):
    trainer = HFPolicy(model=None, tokenizer=_CharTok(), stop_ids=(2,), pad_id=0)
    sampling = SamplingConfig(max_new_tokens=6)
    problems = [{"id": "p0", "prompt": "3*4=", "answer": "12"}]
    fs, st = fault_before_start("stop_string_token_ids", severity, policy=trainer)
    assert fs.begin_rollout(problems, sampling) == (problems, sampling) and st.policy is trainer
    fs.end_rollout([])
    st.step = 14
    ran, got = fs.begin_rollout(problems, sampling)
    assert ran == problems and got == sampling
    engine = st.policy
    assert engine is not trainer and engine.stop_ids == (2,) + extra  # the digits 2 (subtle), 1 and 2 (obvious)
    assert engine.model is trainer.model and engine.tokenizer is trainer.tokenizer
    assert dataclasses.replace(engine, stop_ids=(2,)) == trainer  # nothing else of the engine changes
    fs.end_rollout([])
    assert st.policy is trainer and trainer.stop_ids == (2,)  # the trainer's stop ids are untouched


def _prompt_batch() -> TrainBatch:
    """6 groups of 2 rows; prompts of 3 tokens (groups 0-3) and 4 tokens (groups 4, 5); responses of 2."""
    rows, groups = [], []
    for g in range(6):
        plen = 3 if g < 4 else 4
        for _ in range(2):
            rows.append(([100 + 10 * g + i for i in range(plen)], plen))
            groups.append(g)
    B, T = len(rows), 8
    ids = torch.zeros(B, T, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    mask = torch.zeros(B, T)
    for b, (prompt, plen) in enumerate(rows):
        ids[b, :plen] = torch.tensor(prompt)
        ids[b, plen:plen + 2] = torch.tensor([7 + b % 2, 2])
        attn[b, :plen + 2] = True
        mask[b, plen:plen + 2] = 1
    group_B = torch.tensor(groups)
    return TrainBatch(ids, attn, mask, -0.5 * mask, 0.3 * mask, group_B, torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_trainer_prompt_other_row_gives_a_group_the_prompt_of_the_next_group_of_its_length(severity):
    batch = _prompt_batch()
    fs, st = fault_before_start("trainer_prompt_other_row", severity)
    assert fs.on_batch(batch) is batch
    hits = 0
    for step in range(14, 30):  # the groups that get another prompt are drawn per step
        st.step = step
        out = fs.on_batch(batch)
        for f in ("attention_mask_BT", "loss_mask_BT", "rollout_logp_BT", "advantages_BT", "seq_group_B"):
            assert torch.equal(getattr(out, f), getattr(batch, f))
        resp = batch.loss_mask_BT > 0
        assert torch.equal(out.input_ids_BT[resp], batch.input_ids_BT[resp])  # the responses are untouched
        for g in range(6):
            plen, nxt = (3, (g + 1) % 4) if g < 4 else (4, 4 + (g - 3) % 2)
            rows = (batch.seq_group_B == g).nonzero().squeeze(-1)
            got = out.input_ids_BT[rows, :plen]
            if torch.equal(got, batch.input_ids_BT[rows, :plen]):
                continue
            hits += 1
            assert torch.equal(got, batch.input_ids_BT[2 * nxt, :plen].expand(2, plen))  # group 3 takes group 0's
    assert hits == 16 * 6 if severity == "obvious" else 10 < hits < 60


@pytest.mark.parametrize("severity,sigma", [("subtle", 0.05), ("obvious", 0.5)])
def test_old_logp_scoring_noise_perturbs_pi_old_on_sampled_tokens_only(severity, sigma):
    mask = torch.zeros(64, 10)
    mask[:, 3:8] = 1
    batch = TrainBatch(torch.ones(64, 10, dtype=torch.long), torch.ones(64, 10, dtype=torch.bool), mask,
                       -0.5 * mask, 0.3 * mask, torch.arange(64) // 8, torch.arange(64))
    old = -torch.rand(64, 10) * mask
    fs, st = fault_before_start("old_logp_scoring_noise", severity)
    assert fs.on_old_logp(old, batch) is old
    st.step = 14
    got = fs.on_old_logp(old, batch)
    diff = got - old
    assert torch.equal(diff[mask == 0], torch.zeros(int((mask == 0).sum())))
    d = diff[mask > 0]
    assert (d != 0).all() and abs(float(d.std()) - sigma) < 0.15 * sigma and abs(float(d.mean())) < 0.2 * sigma
    assert torch.equal(fs.on_old_logp(old, batch), got)  # deterministic per step
    st.step = 15
    assert not torch.equal(fs.on_old_logp(old, batch), got)  # a new error every step


# ----------------------------------------------------------------------------- optimisation


@pytest.mark.parametrize("severity,decay,every", [("subtle", 0.8, 5), ("obvious", 0.9, 2)])
def test_weights_left_at_ema_writes_the_lagging_average_into_the_weights(severity, decay, every):
    ps = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    other = torch.nn.Parameter(torch.zeros(2))
    opt = types.SimpleNamespace(param_groups=[{"params": ps}, {"params": [other]}])  # what the hook reads
    fs, st = fault_before_start("weights_left_at_ema", severity)
    fs.before_optimizer_step(opt, None, ps)
    assert all(torch.equal(q, torch.zeros(3)) for q in ps)
    ema = None
    for step in range(15, 27):  # computing `step`; the weights grow by 1 per step between hooks (the update)
        st.step = step - 1
        with torch.no_grad():
            for q in ps:
                q.add_(1.0)
            other.add_(1.0)
        was = [q.detach().clone() for q in ps]
        ema = [w.clone() for w in was] if ema is None else [decay * e + (1 - decay) * w for e, w in zip(ema, was)]
        fs.before_optimizer_step(opt, None, ps)
        want = ema if (step - 15 + 1) % every == 0 else was
        assert all(torch.allclose(q, w) for q, w in zip(ps, want)), step
        fs.before_optimizer_step(opt, None, ps)  # the step's second optimizer step: nothing more
        assert all(torch.allclose(q, w) for q, w in zip(ps, want))
    assert torch.equal(other, torch.full((2,), 12.0))  # the policy's group only


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)


@pytest.mark.parametrize("severity,wd", [("subtle", 0.01), ("obvious", 0.1)])
def test_weight_decay_coupled_adds_the_decay_term_to_every_gradient(severity, wd):
    torch.manual_seed(0)
    model = _Model()
    policy = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    x = torch.randn(4, 3)

    def grads():
        model.zero_grad(set_to_none=True)
        model.lin(x).pow(2).sum().backward()
        return [q.grad.clone() for q in model.lin.parameters()]

    plain = grads()
    fs, st = fault_before_start("weight_decay_coupled", severity, policy=policy)
    assert all(torch.equal(g, p) for g, p in zip(grads(), plain))  # before the start: the plain gradient
    st.step = 14
    got = grads()
    for g, p, q in zip(got, plain, model.lin.parameters()):
        assert torch.allclose(g, p + wd * q.detach())
    assert model.frozen.grad is None
