"""The fourth held-out fault set (tether.health.faults.fresh4): each hook corrupts exactly what its
docstring says at both severities, and passes its input through before the fault's start step.
No training run (the faults' effect on a real run is measured with `tether faultbench`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tether.config import TetherConfig
from tether.health.faults import UNEXPLAINED
from tether.policy.hf import HFPolicy
from tether.types import Outcome, RewardResult, TrainBatch
from health_helpers import fault_before_start, make_fault, make_group, registered_fault_set

FRESH4 = ("reward_cached_by_prompt", "finished_rows_masked", "adam_eps_inflated", "sync_quantised",
          "loader_sorted_by_answer", "ref_from_base", "trainer_prompt_prefix", "old_logp_unshifted")


def test_the_fresh4_kinds_are_registered_with_labels_in_the_taxonomy_or_outside_it():
    from tether.health.causes import CAUSES
    from tether.health.faults import fresh4

    reg = registered_fault_set(fresh4, FRESH4, outside=4)
    inside = [reg[n] for n in FRESH4 if reg[n].cause != UNEXPLAINED]
    assert all(CAUSES[c.cause].family == c.family for c in inside)  # labelled in the cause's own family
    assert len({c.family for c in inside}) >= 3 and len({reg[n].seam for n in FRESH4}) == 8


# ----------------------------------------------------------------------------- reward


def _groups(rewards: list[float], tasks: int = 4) -> list:
    correct = [r == 1.0 for r in rewards]
    return [make_group(f"t{i}", (1, 2), rewards, correct) for i in range(tasks)]


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_reward_cached_by_prompt_returns_a_prompts_earlier_rewards_until_the_entry_expires(severity):
    first, later = [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]
    fs, st = fault_before_start("reward_cached_by_prompt", severity)
    assert fs.end_rollout(_groups(first)) == _groups(first)  # before its start: nothing cached either
    st.step = 14
    assert fs.end_rollout(_groups(later)) == _groups(later)  # the first sighting is scored and stored
    st.step = 15
    hit = fs.end_rollout(_groups(first))  # a new rollout of the same prompts: the stored rewards come back
    assert [[t.reward for t in g.trajectories] for g in hit] == [[t.reward for t in g.trajectories] for g in _groups(later)]
    assert [[t.turns for t in g.trajectories] for g in hit] == [[t.turns for t in g.trajectories] for g in _groups(first)]
    assert fs.end_rollout([make_group("new", (1, 2), first, [True, False, False, True])])[0].trajectories[0].reward.total == 1.0
    st.step = 18  # 4 steps after the entry was stored: expired at subtle (ttl 3), kept at obvious
    out = fs.end_rollout(_groups(first))
    want = first if severity == "subtle" else later
    assert [t.reward.total for g in out for t in g.trajectories] == want * 4


# ----------------------------------------------------------------------------- credit assignment


def _batch() -> TrainBatch:
    """Three rows: 0 and 1 end on a stop token (id 1), row 2 is truncated (ends on 9)."""
    ids = torch.tensor([[5, 6, 7, 8, 1, 0], [5, 6, 9, 1, 0, 0], [5, 6, 7, 8, 9, 9]])
    mask = torch.zeros(3, 6)
    mask[0, 2:5], mask[1, 2:4], mask[2, 3:6] = 1, 1, 1
    adv = mask * torch.tensor([1.0, -2.0, 0.5])[:, None]
    logp = -0.1 * mask
    return TrainBatch(ids, torch.ones(3, 6, dtype=torch.bool), mask, logp, adv, torch.tensor([0, 0, 1]), torch.arange(3))


STOPS = SimpleNamespace(stop_ids=(1, 3))


def test_finished_rows_masked_drops_the_rows_that_ended_on_a_stop_token():
    b = _batch()
    fs, st = fault_before_start("finished_rows_masked", "obvious", STOPS)
    assert fs.on_batch(b) is b
    st.step = 14
    out = fs.on_batch(b)
    assert out.loss_mask_BT[:2].sum() == 0 and torch.equal(out.loss_mask_BT[2], b.loss_mask_BT[2])  # the truncated row keeps its mask
    assert torch.equal(out.input_ids_BT, b.input_ids_BT) and torch.equal(out.advantages_BT, b.advantages_BT)


def test_finished_rows_masked_subtle_drops_a_fraction_of_the_finished_rows():
    B = 400
    ids = torch.full((B, 6), 4)
    ids[: B // 2, 4] = 1  # half the rows end on a stop token at position 4, the others run to the end
    mask = torch.zeros(B, 6)
    mask[: B // 2, 2:5] = 1
    mask[B // 2:, 2:] = 1
    b = dataclasses.replace(_batch(), input_ids_BT=ids, loss_mask_BT=mask, attention_mask_BT=torch.ones(B, 6, dtype=torch.bool))
    fault = make_fault("finished_rows_masked", "subtle")
    fault.view = SimpleNamespace(policy=STOPS)
    got = fault.on_batch(b, 15).loss_mask_BT
    dropped = got.sum(-1) == 0
    assert not dropped[B // 2:].any() and 0.2 < float(dropped[: B // 2].float().mean()) < 0.4
    assert torch.equal(got[~dropped], mask[~dropped])


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_old_logp_unshifted_scores_each_token_with_its_own_positions_logits(severity):
    from tether.train.update import compute_batch_logprobs

    pol = _tiny_llama()
    ids = torch.randint(1, 32, (60, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(60, 6)
    mask[:, 2:] = 1
    b = dataclasses.replace(_batch(), input_ids_BT=ids, attention_mask_BT=torch.ones(60, 6, dtype=torch.bool),
                            loss_mask_BT=mask, rollout_logp_BT=torch.zeros(60, 6), advantages_BT=mask.clone(),
                            seq_group_B=torch.arange(60), seq_traj_B=torch.arange(60))
    temp = TetherConfig().rollout.sampling.temperature
    old = compute_batch_logprobs(pol, b, temp, 8192)  # aligned: log P(x_t | x_<t)
    fs, st = fault_before_start("old_logp_unshifted", severity, pol)
    assert fs.on_old_logp(old, b) is old
    st.step = 14
    out = fs.on_old_logp(old, b)
    with torch.no_grad():
        same = torch.log_softmax(pol.model(ids).logits / temp, -1).gather(-1, ids[..., None])[..., 0]  # log P(x_t | x_<=t)
    hit = (out != old).any(-1)
    assert torch.allclose(out[hit][:, 2:], same[hit][:, 2:], atol=1e-5) and torch.equal(out[hit][:, :2], old[hit][:, :2])
    assert torch.equal(out[~hit], old[~hit])
    assert bool(hit.all()) if severity == "obvious" else 0.15 < float(hit.float().mean()) < 0.45


# ----------------------------------------------------------------------------- optimisation


@pytest.mark.parametrize("severity,eps", [("subtle", 1e-4), ("obvious", 1e-1)])
def test_adam_eps_inflated_sets_the_policy_groups_epsilon_and_shrinks_the_step(severity, eps):
    def first_step(eps_set: bool) -> float:
        w = torch.nn.Parameter(torch.zeros(1000))
        other = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.AdamW([{"params": [w]}, {"params": [other]}], lr=1e-3)
        w.grad = torch.full_like(w, 1e-4)
        other.grad = torch.ones(3)
        fs, st = fault_before_start("adam_eps_inflated", severity)
        fs.before_optimizer_step(opt, None, [w])
        assert opt.param_groups[0]["eps"] == 1e-8  # before its start
        if eps_set:
            st.step = 14
            fs.before_optimizer_step(opt, None, [w])
            assert opt.param_groups[0]["eps"] == eps and opt.param_groups[1]["eps"] == 1e-8
        opt.step()
        return float(w.detach().abs().mean())

    clean, hit = first_step(False), first_step(True)
    assert clean == pytest.approx(1e-3, rel=1e-3)  # Adam's first step: lr x sign(g)
    assert hit == pytest.approx(1e-3 * 1e-4 / (1e-4 + eps), rel=1e-2)


def _tiny_llama() -> HFPolicy:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=32, max_position_embeddings=16)
    return HFPolicy(LlamaForCausalLM(cfg), None, (0,), 0)


@pytest.mark.parametrize("severity", ["subtle", "obvious"])
def test_ref_from_base_swaps_the_reference_for_a_reinitialised_base(severity):
    from tether.policy.reference import make_reference

    pol = _tiny_llama()
    with torch.no_grad():
        for q in pol.model.parameters():
            q.add_(0.1)  # the SFT moved every tensor (norm gains included) away from the base's initialisation
    ref = make_reference(pol)
    kept = {n: q.clone() for n, q in ref.model.named_parameters()}
    fs, st = fault_before_start("ref_from_base", severity, pol)
    assert fs.on_reference(ref) is ref and fs.on_reference(None) is None
    st.step = 14
    base = fs.on_reference(ref)
    assert base is not ref and fs.on_reference(ref) is base  # built once
    assert all(torch.equal(q, kept[n]) for n, q in ref.model.named_parameters())  # the real reference is untouched
    new = dict(base.model.named_parameters())
    changed = [n for n in kept if not torch.equal(new[n], kept[n])]
    assert sorted(changed) == sorted(fs.faults[0].reinitialised)
    assert all(torch.equal(new[n], torch.ones_like(new[n])) for n in changed if new[n].dim() == 1)  # norm gains
    mats = [n for n in changed if new[n].dim() == 2]
    assert mats and all(0.01 < float(new[n].std()) < 0.03 for n in mats)  # initializer_range 0.02
    frac = len(changed) / len(kept)
    assert frac == 1.0 if severity == "obvious" else 0.1 < frac < 0.6


# ----------------------------------------------------------------------------- data


PROBLEMS = [{"id": i, "prompt": f"{i % 7}+{i % 5}=", "answer": str(i % 7 + i % 5)} for i in range(40)]


@pytest.mark.parametrize("severity,n", [("subtle", 2), ("obvious", 8)])
def test_loader_sorted_by_answer_hands_out_windows_of_the_data_in_answer_order(severity, n):
    shuffled = PROBLEMS[::-1][:8]
    fs, st = fault_before_start("loader_sorted_by_answer", severity)
    st.stream = SimpleNamespace(problems=PROBLEMS)
    assert fs.begin_rollout(shuffled, None)[0] == shuffled
    order = sorted(PROBLEMS, key=lambda p: (int(p["answer"]), p["prompt"]))
    for step, at in ((14, 0), (15, 8), (18, 32), (19, 40)):
        st.step = step
        out = fs.begin_rollout(shuffled, None)[0]
        assert out[:n] == [order[(at + i) % 40] for i in range(n)] and out[n:] == shuffled[n:]
    assert [int(p["answer"]) for p in order[:8]] == sorted(int(p["answer"]) for p in order[:8])


# ----------------------------------------------------------------------------- system


@pytest.mark.parametrize("severity,fmt", [("subtle", "fp8"), ("obvious", "int4")])
def test_sync_quantised_hands_the_engine_current_weights_in_a_low_precision_format(severity, fmt):
    from tether.health.faults.fresh4 import _quantise

    pol = _tiny_llama()
    fs, st = fault_before_start("sync_quantised", severity, pol)
    fs.begin_rollout([], None)
    assert st.policy is pol
    fs.end_rollout([])
    st.step, pol.version = 14, 5
    with torch.no_grad():
        pol.model.lm_head.weight.mul_(-2.0)  # the trainer has moved; the sync carries it
    before = {n: q.clone() for n, q in pol.model.named_parameters()}
    fs.begin_rollout([], None)
    engine = st.policy
    fs.end_rollout([])
    assert st.policy is pol and engine is not pol and engine.version == 5
    assert all(torch.equal(q, before[n]) for n, q in pol.model.named_parameters())  # the trainer keeps full precision
    for (n, q_eng), q in zip(engine.model.named_parameters(), pol.model.parameters()):
        if q.dim() == 1:
            assert torch.equal(q_eng, q), n
            continue
        assert torch.equal(q_eng, _quantise(q, fmt)) and not torch.equal(q_eng, q), n
        levels = q_eng.unique().numel()  # distinct values a tensor holds
        assert levels <= 16 if fmt == "int4" else levels > 16
    w_eng, w = engine.model.lm_head.weight.detach(), pol.model.lm_head.weight.detach()
    err = (w_eng - w).abs().max() / w.abs().max()
    assert float(err) < (0.04 if fmt == "fp8" else 0.08)


class _Tok:
    eos_token_id = 1

    def encode(self, text, add_special_tokens=True):
        assert text == "<|im_start|>system\n<|im_end|>\n" and not add_special_tokens
        return [2, 30, 31, 3, 31]


@pytest.mark.parametrize("severity,prefix", [("subtle", [1]), ("obvious", [2, 30, 31, 3, 31])])
def test_trainer_prompt_prefix_prepends_tokens_the_engine_did_not_see(severity, prefix):
    b = dataclasses.replace(_batch(), kept_BT=torch.ones(3, 6, dtype=torch.long))
    fs, st = fault_before_start("trainer_prompt_prefix", severity, SimpleNamespace(tokenizer=_Tok()))
    assert fs.on_batch(b) is b
    st.step = 14
    out = fs.on_batch(b)
    k = len(prefix)
    assert torch.equal(out.input_ids_BT[:, :k], torch.tensor(prefix).expand(3, k)) and torch.equal(out.input_ids_BT[:, k:], b.input_ids_BT)
    assert bool(out.attention_mask_BT[:, :k].all()) and torch.equal(out.attention_mask_BT[:, k:], b.attention_mask_BT)
    for name in ("loss_mask_BT", "rollout_logp_BT", "advantages_BT", "kept_BT"):
        x, y = getattr(out, name), getattr(b, name)
        assert not x[:, :k].any() and torch.equal(x[:, k:], y), name
    assert out.returns_BT is None and out.old_values_BT is None
    assert torch.equal(out.seq_group_B, b.seq_group_B) and out.num_loss_tokens == b.num_loss_tokens


def test_reward_results_and_outcomes_survive_the_cache():
    """The cached RewardResult is the whole result (verdict, components, outcome), not only the total."""
    g = make_group("t0", (1, 2), [1.0, 0.0], [True, False])
    err = dataclasses.replace(g.trajectories[1], reward=RewardResult(0.0, {}, Outcome.ERROR, None, "boom"))
    g = dataclasses.replace(g, trajectories=(g.trajectories[0], err))
    f = make_fault("reward_cached_by_prompt", "obvious")
    f.on_rollouts([g], 15)
    out = f.on_rollouts([make_group("t0", (1, 2), [0.0, 1.0], [False, True])], 16)[0]
    assert [t.reward for t in out.trajectories] == [t.reward for t in g.trajectories]
