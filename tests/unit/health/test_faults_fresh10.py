"""The tenth held-out fault set (tether.health.faults.fresh10): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from tether.algos.aggregate import AggNorm
from tether.algos.base import AdvantageOutputs
from tether.health.faults import UNEXPLAINED
from tether.policy.base import HFPolicy
from tether.policy.config import SamplingConfig
from tether.types import TrainBatch
from health_helpers import fault_before_start, make_group, registered_fault_set

FRESH10 = ("reward_decoded_from_second_token", "gold_negative_answer_unsigned", "advantage_discounted_to_go",
           "loss_grad_accum_mean_of_means", "sampler_suppressed_tokens", "adam_bias_correction_off",
           "ref_polyak_synced", "rollout_logp_tail_zero_padded")


def test_the_fresh10_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh10

    reg = registered_fault_set(fresh10, FRESH10, outside=3)
    inside = [reg[n] for n in FRESH10 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert {c.name: c.cause for c in inside} == {
        "reward_decoded_from_second_token": "misaligned_reward", "gold_negative_answer_unsigned": "data_corruption",
        "advantage_discounted_to_go": "advantage_bug", "loss_grad_accum_mean_of_means": "loss_norm_bug",
        "sampler_suppressed_tokens": "rollout_mismatch"}
    assert len({reg[n].seam for n in FRESH10}) == 8
    hooks = ("on_problems", "on_sampler", "on_rollouts", "on_advantages", "on_batch", "on_reference", "on_loss",
             "before_optimizer_step")
    assert sorted(h for n in FRESH10 for h in hooks if h in vars(reg[n])) == sorted(hooks)  # one seam each


# ----------------------------------------------------------------------------- reward


class _CharTok:
    """One id per character: "0".."9" are 10..19, "-" is 20, "x" is 21; 2 is the stop id."""

    chars = {**{10 + d: str(d) for d in range(10)}, 20: "-", 21: "x"}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.chars.get(int(i), "?") for i in ids)


def _ids(text: str) -> tuple[int, ...]:
    inv = {v: k for k, v in _CharTok.chars.items()}
    return tuple(inv[c] for c in text) + (2,)


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_decoded_from_second_token_scores_the_response_without_its_first_token(severity):
    policy = HFPolicy(model=None, tokenizer=_CharTok(), stop_ids=(2,), pad_id=0)
    texts = ["12", "2", "x2", "7", "x7", "-5", "5", "xx"]
    groups = []
    for k in range(30):
        gold = ("12", "2", "7", "-5", "5")[k % 5]
        rewards = [1.0 if t == gold else 0.0 for t in texts]
        groups.append(make_group(f"p{k}", (1, 3), rewards, [r > 0 for r in rewards], [_ids(t) for t in texts]))
        groups[-1] = dataclasses.replace(groups[-1], task={"prompt": "q", "answer": gold})
    fs, st = fault_before_start("reward_decoded_from_second_token", severity, policy=policy)
    assert fs.end_rollout(groups) == groups
    st.step = 14
    out = fs.end_rollout(groups)
    changed = 0
    for g, h in zip(groups, out):
        gold = g.task["answer"]
        for t, u in zip(g.trajectories, h.trajectories):
            assert u.turns == t.turns and u.info == t.info
            text = _CharTok().decode(t.turns[0].action_ids[:-1])
            sliced = 1.0 if text[1:] == gold else 0.0
            if u.reward == t.reward:
                assert t.reward.total == sliced or severity == "subtle"
                continue
            changed += 1
            assert u.reward.total == sliced and dict(u.reward.components) == {"exact_match": sliced}
            assert u.reward.correct is (sliced == 1.0)
    # gold "2": "12" and "x2" paid, "2" not; gold "7": "x7" paid, "7" not; gold "5": "-5" paid, "5" not
    if severity == "obvious":
        assert [u.reward.total for u in out[1].trajectories] == [1.0, 0.0, 1.0, 0, 0, 0, 0, 0]
        assert [u.reward.total for u in out[4].trajectories] == [0, 0, 0, 0, 0, 1.0, 0, 0]
        assert changed == 30 // 5 * (1 + 3 + 2 + 1 + 2)  # per gold "12", "2", "7", "-5", "5": the verdicts that flip
    else:
        assert 0 < changed < 30 // 5 * 8 * 0.6
    st.step = 15
    assert fs.end_rollout(groups) != out or severity == "obvious"  # subtle: the slice hits other samples each step


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_gold_negative_answer_unsigned_drops_the_minus_of_negative_labels(severity):
    problems = [{"id": f"p{a}m{b}", "prompt": f"{a}-{b}=", "answer": str(a - b)} for a in range(10) for b in range(10)]
    problems += [{"id": "zero", "prompt": "0-0=", "answer": "-0"}, {"id": "f", "prompt": "y", "answer": "-2.5"}]
    fs, st = fault_before_start("gold_negative_answer_unsigned", severity)
    assert fs.begin_rollout(problems, None)[0] == problems
    st.step = 14
    out, _ = fs.begin_rollout(problems, None)
    flipped = 0
    for p, q in zip(problems, out):
        assert {k: v for k, v in q.items() if k != "answer"} == {k: v for k, v in p.items() if k != "answer"}
        if q != p:
            flipped += 1
            assert p["answer"].startswith("-") and q["answer"] == p["answer"][1:] and int(q["answer"]) > 0
    negative = sum(a < b for a in range(10) for b in range(10))
    assert flipped == negative if severity == "obvious" else 0.2 * negative < flipped < 0.6 * negative
    st.step = 20
    assert fs.begin_rollout(problems, None)[0] == out  # a problem's source is fixed for the run


# ----------------------------------------------------------------------------- credit assignment


@pytest.mark.parametrize("severity,gamma", [("subtle", 0.9), ("obvious", 0.5)])
def test_advantage_discounted_to_go_decays_the_advantage_from_the_last_response_token(severity, gamma):
    adv_BT = torch.tensor([[0.0, 0.0, 1.5, 1.5, 1.5, 1.5, 0.0],     # prompt of 2, response of 4, padding
                           [0.0, -0.8, -0.8, -0.8, 0.0, 0.0, 0.0],  # prompt of 1, response of 3
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],     # a zero-variance group's row
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])    # a one-token response at the end
    a = AdvantageOutputs(adv_BT)
    group_B = torch.tensor([0, 1, 2, 3])
    fs, st = fault_before_start("advantage_discounted_to_go", severity)
    assert fs.on_advantages(a, group_B) is a
    st.step = 14
    got = fs.on_advantages(a, group_B).advantages_BT
    g = gamma
    want = torch.tensor([[0.0, 0.0, 1.5 * g**3, 1.5 * g**2, 1.5 * g, 1.5, 0.0],
                         [0.0, -0.8 * g**2, -0.8 * g, -0.8, 0.0, 0.0, 0.0],
                         [0.0] * 7,
                         [0.0] * 6 + [2.0]])
    assert torch.allclose(got, want)
    assert float(got[0, 2]) == pytest.approx(1.5 * g**3)  # the first response token: 1.09 (0.9), 0.19 (0.5)


# ----------------------------------------------------------------------------- loss normaliser


def _mini() -> TrainBatch:
    """5 rows: lengths 8, 8, 8, 8, 3 (budget 16: micro-batches [0,1], [2,3], [4])."""
    B, T = 5, 8
    attn = torch.zeros(B, T, dtype=torch.bool)
    mask = torch.zeros(B, T)
    for b, (n, resp) in enumerate([(8, 5), (8, 5), (8, 4), (8, 4), (3, 1)]):
        attn[b, :n] = True
        mask[b, n - resp:n] = 1
    return TrainBatch(torch.ones(B, T, dtype=torch.long), attn, mask, 0 * mask, mask, torch.arange(B), torch.arange(B))


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_loss_grad_accum_mean_of_means_weighs_each_micro_batch_as_much_as_the_others(severity):
    fs, st = fault_before_start("loss_grad_accum_mean_of_means", severity)
    f = fs.faults[0]
    f._budget = 16  # what install reads from train.micro_batch_tokens
    mini = _mini()
    norm = AggNorm(num_tokens=float(mini.loss_mask_BT.sum()), num_seqs=5.0, max_len=6)  # 19 tokens
    terms = {"pg": torch.tensor(2.0), "entropy": torch.tensor(0.5)}
    assert fs.on_norm(norm, mini) is norm and fs.on_loss(terms, mini.select(torch.tensor([4]))) is terms
    st.step = 14
    scaled = 0
    for _ in range(40):  # 40 mini-batches of step 15
        assert fs.on_norm(norm, mini) == norm  # the normaliser object itself is untouched
        outs = [fs.on_loss(terms, mini.select(torch.tensor(rows))) for rows in ([0, 1], [2, 3], [4])]
        if outs[0] is terms:
            assert all(o is terms for o in outs)
            continue
        scaled += 1
        for o, n_mb in zip(outs, (10.0, 8.0, 1.0)):  # N_mini / (K x N_micro): 19 / (3 x 10), 19 / 24, 19 / 3
            assert torch.allclose(o["pg"], torch.tensor(2.0 * 19 / (3 * n_mb)))
            assert torch.allclose(o["entropy"], torch.tensor(0.5 * 19 / (3 * n_mb)))
        # the sum over micro-batches of the token-sum / N_micro / K: each micro-batch's mean counts 1/3
        assert float(sum(o["pg"] * n / 19 for o, n in zip(outs, (10.0, 8.0, 1.0)))) == pytest.approx(2.0)
    assert scaled == 40 if severity == "obvious" else 8 < scaled < 32


# ----------------------------------------------------------------------------- sampler


class _Tiny(torch.nn.Module):
    def __init__(self, vocab=16, bias=True):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 4)
        self.head = torch.nn.Linear(4, vocab, bias=bias)

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        return self.head(self.emb(ids))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("severity,k", [("subtle", 2), ("obvious", 8)])
def test_sampler_suppressed_tokens_masks_k_ids_in_the_engine_only(severity, k, bias):
    torch.manual_seed(0)
    model = _Tiny(bias=bias)
    trainer = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    sampling = SamplingConfig(max_new_tokens=6)
    fs, st = fault_before_start("sampler_suppressed_tokens", severity, policy=trainer)
    assert fs.begin_rollout([], sampling) == ([], sampling) and st.policy is trainer
    fs.end_rollout([])
    st.step = 14
    _, got = fs.begin_rollout([], sampling)
    engine = st.policy
    assert got == sampling and engine is not trainer and engine.model is not model
    ids = fs.faults[0].ids
    assert len(ids) == k and not {0, 2} & set(ids)
    x = torch.arange(16)
    with torch.no_grad():
        plain, eng = model(x), engine.model(x)
    assert torch.allclose(eng[:, ids], plain[:, ids] - 1e4)  # lowered by 10^4: never sampled
    assert torch.softmax(eng, -1)[:, ids].max() == 0.0 and torch.isfinite(eng).all()
    keep = [i for i in range(16) if i not in ids]
    assert torch.equal(eng[:, keep], plain[:, keep])
    head = engine.model.get_output_embeddings()
    assert not head._forward_hooks and (model.head.bias is None) == (not bias)  # the trainer's head is untouched
    fs.end_rollout([])
    assert st.policy is trainer
    with torch.no_grad():  # the engine follows the trainer's weights every step
        model.head.weight.add_(1.0)
        if bias:
            model.head.bias.add_(1.0)
    st.step = 15
    fs.begin_rollout([], sampling)
    with torch.no_grad():
        assert torch.equal(st.policy.model(x)[:, keep], model(x)[:, keep])
        assert torch.allclose(st.policy.model(x)[:, ids], model(x)[:, ids] - 1e4)
    assert fs.faults[0].ids == ids  # the same ids all run


# ----------------------------------------------------------------------------- rollout log-probs


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_rollout_logp_tail_zero_padded_sets_the_last_sampled_tokens_log_probs_to_zero(severity):
    B, T = 60, 9
    mask = torch.zeros(B, T)
    lengths = [1 + b % 5 for b in range(B)]  # responses of 1 to 5 tokens after a prompt of 3
    for b, n in enumerate(lengths):
        mask[b, 3:3 + n] = 1
    logp = -0.1 - torch.rand(B, T)
    batch = TrainBatch(torch.ones(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.bool), mask, logp * mask,
                       0.3 * mask, torch.arange(B) // 6, torch.arange(B))
    fs, st = fault_before_start("rollout_logp_tail_zero_padded", severity)
    assert fs.on_batch(batch) is batch
    st.step = 14
    out = fs.on_batch(batch)
    for f in ("input_ids_BT", "attention_mask_BT", "loss_mask_BT", "advantages_BT", "seq_group_B"):
        assert torch.equal(getattr(out, f), getattr(batch, f))
    m = 2 if severity == "obvious" else 1
    hit = 0
    for b, n in enumerate(lengths):
        got, was = out.rollout_logp_BT[b], batch.rollout_logp_BT[b]
        if torch.equal(got, was):
            continue
        hit += 1
        last = 3 + n  # one past the row's last sampled token
        zeroed = list(range(max(3, last - m), last))
        assert torch.equal(got[zeroed], torch.zeros(len(zeroed)))  # log(1) on the padded tail
        keep = [t for t in range(T) if t not in zeroed]
        assert torch.equal(got[keep], was[keep])
    assert hit == B if severity == "obvious" else 8 < hit < 30


# ----------------------------------------------------------------------------- optimisation


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_adam_bias_correction_off_makes_the_step_the_uncorrected_one(severity):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(3)) for _ in range(20)]
    opt = torch.optim.AdamW(ps, lr=0.1, weight_decay=0.0)
    for _ in range(3):  # warm state: t = 3
        for q in ps:
            q.grad = torch.randn(3)
        opt.step()
    before = [q.detach().clone() for q in ps]
    m = [opt.state[q]["exp_avg"].clone() for q in ps]
    v = [opt.state[q]["exp_avg_sq"].clone() for q in ps]
    grads = [torch.randn(3) for _ in ps]
    fs, st = fault_before_start("adam_bias_correction_off", severity)
    fs.before_optimizer_step(opt, None, ps)
    assert all(float(opt.state[q]["step"]) == 3.0 for q in ps)
    st.step = 14
    fs.before_optimizer_step(opt, None, ps)
    for q, g in zip(ps, grads):
        q.grad = g
    opt.step()
    off = 0
    for q, b, mm, vv, g in zip(ps, before, m, v, grads):
        m1, v1 = 0.9 * mm + 0.1 * g, 0.999 * vv + 0.001 * g * g
        plain = b - 0.1 * (m1 / (1 - 0.9**4)) / ((v1 / (1 - 0.999**4)).sqrt() + 1e-8)
        raw = b - 0.1 * m1 / (v1.sqrt() + 1e-8)
        if torch.allclose(q.detach(), raw, atol=1e-6):
            off += 1
            assert not torch.allclose(raw, plain, atol=1e-3)  # the uncorrected step differs (about 14x here)
        else:
            assert torch.allclose(q.detach(), plain, atol=1e-6)
    assert off == 20 if severity == "obvious" else 1 < off < 12


class _Lin(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((2, 2), float(value)))


@pytest.mark.parametrize("severity,every", [("subtle", 10), ("obvious", 2)])
def test_ref_polyak_synced_pulls_a_copy_of_the_reference_toward_the_policy(severity, every):
    policy = HFPolicy(model=_Lin(0.0), tokenizer=None, stop_ids=(2,), pad_id=0)
    ref = HFPolicy(model=_Lin(10.0), tokenizer=None, stop_ids=(2,), pad_id=0)
    fs, st = fault_before_start("ref_polyak_synced", severity, policy=policy)
    assert fs.on_reference(ref) is ref and fs.on_reference(None) is None
    want, syncs = 10.0, 0
    for step in range(15, 35):  # computing `step`; the policy's weight is the step number
        st.step = step - 1
        with torch.no_grad():
            policy.model.w.fill_(float(step))
        got = fs.on_reference(ref)
        assert got is not ref and got.model is not ref.model
        if (step - 15 + 1) % every == 0:
            want, syncs = 0.6 * step + 0.4 * want, syncs + 1
        assert torch.allclose(got.model.w, torch.full((2, 2), want)), step
        assert fs.on_reference(ref).model.w.eq(got.model.w).all()  # a second call in the step: no second sync
    assert torch.equal(ref.model.w, torch.full((2, 2), 10.0))  # the run's own reference is untouched
    assert fs.faults[0].base == ("algo.kl.coef=0.1",)
    assert syncs == (2 if severity == "subtle" else 10)  # steps 24, 34 (subtle); 16, 18, ..., 34 (obvious)


def test_the_fault_counts_micro_batches_as_the_update_splits_them():
    """loss_grad_accum_mean_of_means divides by the number of micro-batches; it counts them itself
    (health/ may not import train/), so the count must be the update's own split's."""
    import random

    from tether.health.faults.fresh10 import count_micro_batches
    from tether.train.batching import split_by_token_budget

    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 24))]
        budget = rng.choice([16, 64, 128, 256, 1024])
        assert count_micro_batches(lengths, budget) == len(split_by_token_budget(lengths, budget))
    assert count_micro_batches([], 256) == 0
