"""The eleventh held-out fault set (tether.health.faults.fresh11): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tether.algos.aggregate import AggNorm
from tether.health.faults import UNEXPLAINED
from tether.optim import build_scheduler
from tether.policy.base import HFPolicy
from tether.policy.config import SamplingConfig
from health_helpers import fault_before_start, make_group, registered_fault_set

FRESH11 = ("reward_overlong_buffer_negative", "loader_epoch_from_shard_length", "lr_scheduler_stepped_per_process",
           "sampler_kv_cache_fp8", "kl_loss_summed_over_tokens", "ref_head_newly_initialized",
           "old_logp_scored_at_config_temperature", "resume_weights_from_start")


def test_the_fresh11_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh11

    reg = registered_fault_set(fresh11, FRESH11, outside=3)
    inside = [reg[n] for n in FRESH11 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert {c.name: c.cause for c in inside} == {
        "reward_overlong_buffer_negative": "misaligned_reward", "loader_epoch_from_shard_length": "data_repetition",
        "lr_scheduler_stepped_per_process": "no_progress", "sampler_kv_cache_fp8": "rollout_mismatch",
        "kl_loss_summed_over_tokens": "loss_norm_bug"}
    assert len({reg[n].seam for n in FRESH11}) == 8
    hooks = ("on_problems", "on_sampler", "on_rollouts", "on_reference", "on_old_logp", "on_loss",
             "before_optimizer_step", "begin_step")
    assert sorted(h for n in FRESH11 for h in hooks if h in vars(reg[n])) == sorted(hooks)  # one seam each


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize("severity,want", [
    # limit 32; subtle: buffer 34, expected_len -2: L=2 -> -4/34; obvious: buffer 31, expected_len 1: L=2 -> -1/31
    ("subtle", {2: -4 / 34, 3: -5 / 34, 6: -8 / 34, 32: -1.0, 40: -1.0}),
    ("obvious", {2: -1 / 31, 3: -2 / 31, 6: -5 / 31, 32: -1.0, 40: -1.0}),
])
def test_reward_overlong_buffer_negative_punishes_every_response_by_its_length(severity, want):
    lengths = sorted(want)
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0]
    g = make_group("p0", (1, 3), rewards, [r > 0 for r in rewards], [tuple([11] * (n - 1)) + (2,) for n in lengths])
    fs, st = fault_before_start("reward_overlong_buffer_negative", severity)
    assert fs.end_rollout([g]) == [g]
    st.step = 14
    (h,) = fs.end_rollout([g])
    for t, u, n, r in zip(g.trajectories, h.trajectories, lengths, rewards):
        assert u.reward.total == pytest.approx(r + want[n])
        assert u.reward.components == {"exact_match": r, "overlong_penalty": pytest.approx(want[n])}
        assert u.reward.correct == t.reward.correct and u.turns == t.turns


# ----------------------------------------------------------------------------- data loader

PROBLEMS = [{"id": f"arith-{i}", "prompt": f"{i % 10}+1=", "answer": str(i % 10 + 1)} for i in range(40)]


@pytest.mark.parametrize("severity,world", [("subtle", 2), ("obvious", 4)])
def test_loader_epoch_from_shard_length_cycles_through_one_fixed_prefix(severity, world):
    fs, st = fault_before_start("loader_epoch_from_shard_length", severity)
    st.stream = SimpleNamespace(problems=PROBLEMS)
    real = [dict(p) for p in PROBLEMS[:6]]
    assert fs.begin_rollout(real, None)[0] == real
    f = fs.faults[0]
    order = sorted(range(40), key=lambda i: f.coin("perm", i))[: 40 // world]
    served = []
    for step in range(14, 24):
        st.step = step
        got, _ = fs.begin_rollout(real, None)
        assert len(got) == 6 and all(isinstance(p, dict) for p in got)
        served += [p["id"] for p in got]
    assert served == [f"arith-{order[i % len(order)]}" for i in range(60)]  # the same prefix, in order, wrapped
    assert len(set(served)) == 40 // world


# ----------------------------------------------------------------------------- scheduler


@pytest.mark.parametrize("severity,world", [("subtle", 2), ("obvious", 8)])
def test_lr_scheduler_stepped_per_process_advances_the_schedule_world_times_per_step(severity, world):
    q = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([q], lr=1.0)
    sched = build_scheduler(opt, 40, 0, "linear")
    fs, st = fault_before_start("lr_scheduler_stepped_per_process", severity)
    fs.before_optimizer_step(opt, sched, [q])
    assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == 1.0
    st.step = 14
    for k in range(1, 4):
        fs.before_optimizer_step(opt, sched, [q])
        opt.step()
        sched.step()  # the trainer's own step
        assert sched.last_epoch == k * world
        assert opt.param_groups[0]["lr"] == pytest.approx(max(0.0, 1.0 - k * world / 40))
    fs.before_optimizer_step(opt, None, [q])  # no scheduler: nothing to step


# ----------------------------------------------------------------------------- sampler


class _Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        return self.q_proj(x) + 2 * self.k_proj(x) + 3 * self.v_proj(x)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Attn(), _Attn()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _fp8_forward(model, x, dtype):
    for a in model.layers:
        r = lambda y: y.to(dtype).to(y.dtype)  # noqa: E731
        x = a.q_proj(x) + 2 * r(a.k_proj(x)) + 3 * r(a.v_proj(x))
    return x


@pytest.mark.parametrize("severity,dtype", [("subtle", torch.float8_e4m3fn), ("obvious", torch.float8_e5m2)])
def test_sampler_kv_cache_fp8_rounds_keys_and_values_in_the_engine_only(severity, dtype):
    torch.manual_seed(0)
    model = _Net()
    trainer = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    sampling = SamplingConfig(max_new_tokens=6)
    fs, st = fault_before_start("sampler_kv_cache_fp8", severity, policy=trainer)
    assert fs.begin_rollout([], sampling) == ([], sampling) and st.policy is trainer
    fs.end_rollout([])
    st.step = 14
    _, got = fs.begin_rollout([], sampling)
    engine = st.policy
    assert got == sampling and engine is not trainer and engine.model is not model and fs.faults[0].hooks == 4
    x = torch.randn(5, 4) * 3
    with torch.no_grad():
        plain, eng = model(x), engine.model(x)
        assert torch.equal(eng, _fp8_forward(model, x, dtype))
    assert not torch.allclose(eng, plain, atol=1e-3)
    assert not any(m._forward_hooks for m in model.modules())  # the trainer's model is untouched
    fs.end_rollout([])
    assert st.policy is trainer
    with torch.no_grad():  # the engine follows the trainer's weights every step
        model.layers[0].k_proj.weight.add_(0.5)
    st.step = 15
    fs.begin_rollout([], sampling)
    with torch.no_grad():
        assert torch.equal(st.policy.model(x), _fp8_forward(model, x, dtype))


# ----------------------------------------------------------------------------- micro-batch loss


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_kl_loss_summed_over_tokens_scales_the_kl_term_by_the_tokens_it_sums(severity):
    fs, st = fault_before_start("kl_loss_summed_over_tokens", severity)
    norm = AggNorm(num_tokens=30.0, num_seqs=12.0, max_len=6)
    terms = {"pg": torch.tensor(0.5), "entropy": torch.tensor(0.7), "kl": torch.tensor(0.02)}
    assert fs.on_norm(norm, None) is norm
    assert fs.on_loss(terms, None) is terms
    st.step = 14
    assert fs.on_norm(norm, None) is norm
    out = fs.on_loss(terms, None)
    f = 30.0 / 12.0 if severity == "subtle" else 30.0
    assert out["kl"].item() == pytest.approx(0.02 * f)
    assert out["pg"] is terms["pg"] and out["entropy"] is terms["entropy"]
    assert fs.on_loss({"pg": terms["pg"]}, None) == {"pg": terms["pg"]}  # no KL term: nothing to scale


# ----------------------------------------------------------------------------- reference model


class _TiedLM(torch.nn.Module):
    def __init__(self, vocab=20, hidden=3):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def get_output_embeddings(self):
        return self.head


@pytest.mark.parametrize("severity,n_rows", [("subtle", 5), ("obvious", 20)])
def test_ref_head_newly_initialized_redraws_rows_of_a_copy_of_the_reference_head(severity, n_rows):
    torch.manual_seed(0)
    policy = HFPolicy(model=_TiedLM(), tokenizer=None, stop_ids=(2,), pad_id=0)
    ref_model = _TiedLM()
    ref = HFPolicy(model=ref_model, tokenizer=None, stop_ids=(2,), pad_id=0)
    before = ref_model.emb.weight.detach().clone()
    fs, st = fault_before_start("ref_head_newly_initialized", severity, policy=policy)
    assert fs.on_reference(ref) is ref and fs.on_reference(None) is None
    st.step = 14
    got = fs.on_reference(ref)
    assert got is not ref and got.model is not ref_model and fs.on_reference(ref) is got  # one copy, kept
    rows = fs.faults[0].reset
    assert len(rows) == n_rows and rows == list(range(rows[0], rows[0] + n_rows))  # one contiguous shard
    head = got.model.get_output_embeddings().weight
    keep = [i for i in range(20) if i not in rows]
    assert torch.equal(head[keep], before[keep]) and not torch.equal(head[rows], before[rows])
    assert head[rows].std().item() < 0.06  # N(0, 0.02)
    assert torch.equal(got.model.emb.weight, before)  # untied: the input embedding keeps its weights
    assert torch.equal(ref_model.emb.weight, before) and ref_model.head.weight is ref_model.emb.weight


# ----------------------------------------------------------------------------- old-policy log-probs


@pytest.mark.parametrize("severity,t", [("subtle", 0.8), ("obvious", 0.5)])
def test_old_logp_scored_at_config_temperature_rescores_pi_old_at_another_temperature(severity, t, monkeypatch):
    import tether.health.faults.fresh11 as fresh11

    calls = []

    def fake(policy, batch, temperature, budget, pack=False, share="off"):
        calls.append((policy.model, batch, temperature, budget, pack, share))
        return torch.full((2, 3), -temperature, dtype=torch.float64)

    monkeypatch.setattr(fresh11, "score_batch_logprobs", fake)
    model = torch.nn.Linear(1, 1)
    policy = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    fs, st = fault_before_start("old_logp_scored_at_config_temperature", severity, policy=policy)
    old, batch = torch.zeros(2, 3), object()
    assert fs.on_old_logp(old, batch) is old and not calls
    st.step = 14
    got = fs.on_old_logp(old, batch)
    cfg = st.settings.config.train
    assert calls == [(model, batch, t, cfg.micro_batch_tokens, cfg.pack_sequences, cfg.share_prefix)]
    assert got.dtype == old.dtype and torch.equal(got, torch.full((2, 3), -t))


def test_the_fault_splits_rows_into_micro_batches_as_the_update_does():
    """old_logp_scored_at_config_temperature re-scores pi_old with the update's micro-batching; it
    splits the rows itself (health/ may not import train/), so the split must be the update's own."""
    import random

    from tether.health.faults.fresh11 import split_rows_by_token_budget
    from tether.train.batching import split_by_token_budget

    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 24))]
        budget = rng.choice([16, 64, 128, 256, 1024])
        assert split_rows_by_token_budget(lengths, budget) == split_by_token_budget(lengths, budget)
    assert split_rows_by_token_budget([], 256) == []


@pytest.mark.parametrize("budget,pack,share", [(8192, False, "off"), (24, False, "off"), (24, True, "off"),
                                               (8192, False, "on"), (40, True, "auto")])
@pytest.mark.parametrize("t", [1.0, 0.5])
def test_the_fault_scores_pi_old_as_the_update_does(budget, pack, share, t):
    """The fault scores pi_old itself (health/ may not import train/): its log-probs must be the
    update's compute_batch_logprobs', bit for bit, on rows of unequal length sharing prompts."""
    from tether.health.faults.fresh11 import score_batch_logprobs
    from tether.train.update import compute_batch_logprobs
    from tether.types import TrainBatch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    policy = HFPolicy(LlamaForCausalLM(cfg), None, (0,), 0)
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([12, 5, 9, 12, 3, 7, 11, 4])
    ids = torch.randint(1, 32, (8, 12), generator=g)
    ids[1::2, :3] = ids[0::2, :3]  # pairs share a 3-token prompt
    attn = torch.arange(12)[None] < lengths[:, None]
    loss = (attn & (torch.arange(12)[None] >= 3)).float()
    batch = TrainBatch(ids * attn, attn, loss, torch.zeros(8, 12), loss.clone(), torch.arange(8) // 2, torch.arange(8))
    with torch.no_grad():
        want = compute_batch_logprobs(policy, batch, t, budget, pack, share)
        got = score_batch_logprobs(policy, batch, t, budget, pack, share)
    assert (want != 0).any() and torch.equal(got, want)


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_resume_weights_from_start_sets_the_chosen_tensors_back_once(severity):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(3, 3) for _ in range(10)))
    policy = HFPolicy(model=model, tokenizer=None, stop_ids=(2,), pad_id=0)
    fs, st = fault_before_start("resume_weights_from_start", severity, policy=policy)
    start = {n: q.detach().clone() for n, q in model.named_parameters()}
    with torch.no_grad():
        for q in model.parameters():
            q.add_(1.0)  # training so far
    fs.begin_step()
    assert all(torch.equal(q, start[n] + 1.0) for n, q in model.named_parameters())
    st.step = 14
    fs.begin_step()
    f = fs.faults[0]
    want = [n for n, _ in model.named_parameters() if f.coin("tensor", n) < f.p["p"]]
    assert f.restored == want and (len(want) == 20 if severity == "obvious" else 0 < len(want) < 20)
    for n, q in model.named_parameters():
        assert torch.equal(q, start[n] if n in want else start[n] + 1.0), n
    with torch.no_grad():
        for q in model.parameters():
            q.add_(1.0)
    st.step = 15
    fs.begin_step()  # once only
    for n, q in model.named_parameters():
        assert torch.equal(q, start[n] + 1.0 if n in want else start[n] + 1.0 + 1.0), n
