"""The third held-out fault set (tether.health.faults.fresh3): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tether.config import TetherConfig
from tether.health.faults import UNEXPLAINED
from tether.policy.hf import HFPolicy
from tether.types import TrainBatch
from health_helpers import SeamState, fault_before_start, make_fault, make_group, registered_fault_set

FRESH3 = ("reward_silent_timeout", "old_logp_nan", "grad_garbage_rows", "advantage_credit_cut",
          "ratio_vs_reference", "prompt_symbols_stripped", "sampler_dropout", "token_ids_shifted")


def test_the_fresh3_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.faults import fresh3

    reg = registered_fault_set(fresh3, FRESH3, outside=3)
    assert {reg[n].family for n in FRESH3 if reg[n].cause != UNEXPLAINED} == {
        "reward", "optimisation", "credit_assignment", "data", "system"}


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize("severity,lo,hi", [("subtle", 0.15, 0.45), ("obvious", 0.8, 0.98)])
def test_reward_silent_timeout_zeroes_a_fraction_of_samples_without_an_error(severity, lo, hi):
    groups = [make_group(f"t{i}", (1, 2), [1.0, 0, 1.0, 0.0], [True, False, True, False]) for i in range(60)]
    fs, st = fault_before_start("reward_silent_timeout", severity)
    assert fs.end_rollout(groups) == groups  # before its start
    st.step = 14
    out = fs.end_rollout(groups)
    hit = [t for g in out for t in g.trajectories if t.reward.total == 0.0 and t.reward.correct is False]
    paid = [t for g in out for t in g.trajectories if t.reward.correct]
    assert all(t.reward.total == 1.0 and t.reward.components["exact_match"] == 1.0 for t in paid)  # untouched
    zeroed = 120 - len(paid)  # of the 120 correct samples
    assert lo < zeroed / 120 < hi
    assert all(t.reward.components["exact_match"] == 0.0 and t.reward.outcome.name == "OK" for t in hit)
    assert [g.task_id for g in out] == [g.task_id for g in groups]


# ----------------------------------------------------------------------------- optimisation


def _batch() -> TrainBatch:
    mask = torch.zeros(3, 6)
    mask[0, 2:5], mask[1, 2:4], mask[2, 3:6] = 1, 1, 1
    adv = mask * torch.tensor([1.0, -2.0, 0.5])[:, None]
    z = torch.zeros(3, 6)
    return TrainBatch(torch.zeros(3, 6, dtype=torch.long), torch.ones(3, 6, dtype=torch.bool), mask, z, adv,
                      torch.tensor([0, 0, 1]), torch.arange(3))


@pytest.mark.parametrize("severity,lo,hi", [("subtle", 0.0, 0.006), ("obvious", 0.02, 0.04)])
def test_old_logp_nan_puts_nan_on_a_fraction_of_loss_tokens_only(severity, lo, hi):
    mask = (torch.rand(64, 200, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    b = dataclasses.replace(_batch(), loss_mask_BT=mask)
    old = torch.full((64, 200), -0.7)
    fs, st = fault_before_start("old_logp_nan", severity)
    assert fs.on_old_logp(old, b) is old
    st.step = 14
    out = fs.on_old_logp(old, b)
    inf = torch.isnan(out)
    assert not (inf & (mask == 0)).any() and torch.equal(out[~inf], old[~inf])
    assert lo <= float(inf.sum()) / float(mask.sum()) < hi and (severity == "subtle" or inf.any())


@pytest.mark.parametrize("severity,p,scale", [("subtle", 0.03, 1.0), ("obvious", 0.6, 10.0)])
def test_grad_garbage_rows_replaces_a_fraction_of_matrix_rows_with_garbage(severity, p, scale):
    params = [torch.nn.Parameter(torch.zeros(400, 8)), torch.nn.Parameter(torch.zeros(8))]
    for q in params:
        q.grad = torch.ones_like(q)
    fs, st = fault_before_start("grad_garbage_rows", severity)
    fs.before_optimizer_step(None, None, params)
    assert all(bool((q.grad == 1).all()) for q in params)  # before its start
    st.step = 14
    fs.before_optimizer_step(None, None, params)
    g = params[0].grad
    changed = (g != 1).any(-1)
    assert bool((g[~changed] == 1).all()) and bool((params[1].grad == 1).all())  # vectors keep theirs
    assert abs(float(changed.float().mean()) - p) < 0.5 * p + 0.02
    junk = g[changed]
    assert torch.isfinite(junk).all() and 0.7 * scale < float(junk.std()) < 1.3 * scale  # gradient RMS is 1


# ----------------------------------------------------------------------------- credit assignment


def test_advantage_credit_cut_keeps_only_the_first_response_token_of_each_row():
    b = _batch()
    fs, st = fault_before_start("advantage_credit_cut", "obvious")
    assert fs.on_batch(b) is b
    st.step = 14
    out = fs.on_batch(b)
    want = torch.zeros(3, 6)
    want[0, 2], want[1, 2], want[2, 3] = 1.0, -2.0, 0.5
    assert torch.equal(out.advantages_BT, want)
    assert torch.equal(out.loss_mask_BT, b.loss_mask_BT) and torch.equal(out.rollout_logp_BT, b.rollout_logp_BT)


def test_advantage_credit_cut_subtle_cuts_a_fraction_of_rows():
    mask = torch.zeros(200, 6)
    mask[:, 1:5] = 1
    b = dataclasses.replace(_batch(), loss_mask_BT=mask, advantages_BT=mask.clone())
    out = make_fault("advantage_credit_cut", "subtle").on_batch(b, 15)
    cut = out.advantages_BT.sum(-1) == 1  # one token of credit left
    assert 0.25 < float(cut.float().mean()) < 0.55
    assert bool((out.advantages_BT[~cut] == mask[~cut]).all()) and bool((out.advantages_BT[cut, 1] == 1).all())


def _tiny_llama(fill: float | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    model = LlamaForCausalLM(cfg)
    if fill is not None:
        with torch.no_grad():
            for q in model.parameters():
                q.fill_(fill)
    return HFPolicy(model, None, (0,), 0)


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_ratio_vs_reference_puts_the_start_weights_log_probs_in_pi_olds_place(severity):
    from tether.train.update import compute_batch_logprobs

    pol = _tiny_llama()
    ids = torch.randint(1, 32, (40, 6), generator=torch.Generator().manual_seed(1))
    b = dataclasses.replace(_batch(), input_ids_BT=ids, attention_mask_BT=torch.ones(40, 6, dtype=torch.bool),
                            loss_mask_BT=torch.ones(40, 6), rollout_logp_BT=torch.zeros(40, 6),
                            advantages_BT=torch.zeros(40, 6), seq_group_B=torch.arange(40), seq_traj_B=torch.arange(40))
    cfg = TetherConfig()
    ref = compute_batch_logprobs(pol, b, cfg.rollout.sampling.temperature, cfg.train.micro_batch_tokens)
    fs, st = fault_before_start("ratio_vs_reference", severity, pol)
    with torch.no_grad():
        for q in pol.model.parameters():
            q.add_(0.05)  # the policy moves after the faults were set up; the reference does not
    old = compute_batch_logprobs(pol, b, cfg.rollout.sampling.temperature, cfg.train.micro_batch_tokens)
    assert fs.on_old_logp(old, b) is old
    st.step = 14
    out = fs.on_old_logp(old, b)
    swapped = [bool(torch.allclose(out[i], ref[i], atol=1e-5)) for i in range(40)]
    kept = [bool(torch.equal(out[i], old[i])) for i in range(40)]
    assert all(s != k for s, k in zip(swapped, kept))  # each row is pi_old's or the reference's
    assert not torch.allclose(old, ref, atol=1e-3)
    assert sum(swapped) == 40 if severity == "obvious" else 8 <= sum(swapped) <= 26


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("severity,want", [("subtle", ["34=", "3+4=", "3-4=", "ab="]),
                                            ("obvious", ["34", "34", "34", "a_b"])])
def test_prompt_symbols_stripped_removes_the_cleaners_characters_from_prompts_only(severity, want):
    probs = [{"id": i, "prompt": p, "answer": "7"} for i, p in enumerate(["3*4=", "3+4=", "3-4=", "`a_b`="])]
    fs, st = fault_before_start("prompt_symbols_stripped", severity)
    assert fs.begin_rollout(probs, None)[0] == probs
    st.step = 14
    out = fs.begin_rollout(probs, None)[0]
    assert [p["prompt"] for p in out] == want and [(p["id"], p["answer"]) for p in out] == [(i, "7") for i in range(4)]


# ----------------------------------------------------------------------------- system


def _logits(policy, ids):
    with torch.no_grad():
        return policy.model(ids).logits


@pytest.mark.parametrize("severity,p", [("subtle", 0.05), ("obvious", 0.5)])
def test_sampler_dropout_runs_the_engine_on_current_weights_with_dropout(severity, p):
    pol = _tiny_llama()
    ids = torch.randint(1, 32, (2, 5), generator=torch.Generator().manual_seed(2))
    fs, st = fault_before_start("sampler_dropout", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    st.step, pol.version = 14, 7
    clean = _logits(pol, ids)
    fs.begin_rollout([], None)
    engine = st.policy
    noisy = _logits(engine, ids)
    fs.end_rollout([])
    assert st.policy is pol and engine is not pol and engine.version == 7
    assert torch.equal(_logits(pol, ids), clean)  # the trainer's forward is untouched
    assert not torch.allclose(noisy, clean, atol=1e-4)
    hooked = [n for n, m in engine.model.named_modules() if m._forward_hooks]
    assert hooked == [f"model.layers.{i}.{s}" for i in range(2) for s in ("self_attn", "mlp")]
    kept = fs.faults[0]._drop(None, (), torch.ones(20000))  # the hook: drop at rate p, scale the rest by 1/(1-p)
    assert abs(float((kept == 0).float().mean()) - p) < 0.02 and math.isclose(float(kept.max()), 1 / (1 - p), rel_tol=1e-5)
    with torch.no_grad():
        pol.model.lm_head.weight.add_(1.0)  # the trainer moves; the next sync carries it
    st.step = 15
    fs.begin_rollout([], None)
    assert torch.equal(st.policy.model.lm_head.weight, pol.model.lm_head.weight)
    fs.end_rollout([])


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_token_ids_shifted_moves_response_ids_up_by_one_within_the_vocabulary(severity):
    from types import SimpleNamespace

    ids = torch.arange(400 * 6).reshape(400, 6) % 6  # ids 0..5 in every row
    mask = torch.zeros(400, 6)
    mask[:, 2:] = 1  # the response: positions 2..5 (ids 2, 3, 4, 5)
    b = dataclasses.replace(_batch(), input_ids_BT=ids, loss_mask_BT=mask, attention_mask_BT=torch.ones(400, 6, dtype=torch.bool),
                            rollout_logp_BT=torch.zeros(400, 6), advantages_BT=mask.clone())
    pol = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=6)))
    fs, st = fault_before_start("token_ids_shifted", severity, pol)
    assert fs.on_batch(b) is b
    st.step = 14
    out = fs.on_batch(b)
    hit = (out.input_ids_BT != ids).any(-1)
    assert torch.equal(out.input_ids_BT[hit], torch.tensor([0, 1, 3, 4, 5, 5]).expand(int(hit.sum()), 6))  # 5 + 1 leaves the vocabulary
    assert torch.equal(out.input_ids_BT[~hit], ids[~hit])
    assert bool(hit.all()) if severity == "obvious" else 0.15 < float(hit.float().mean()) < 0.35
    assert torch.equal(out.advantages_BT, b.advantages_BT) and torch.equal(out.loss_mask_BT, mask)
