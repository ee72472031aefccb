"""Sampling-distribution consistency ("Keep Sampling Mask", DeepSeek-V3.2 arXiv 2512.02556): the
sampler records how many tokens top-k / top-p / min-p kept, and the trainer's scorer applies the
same truncation, so the rollout/trainer log-prob gap with a filter equals the gap without one."""

import pytest
import torch

from tether.train.batching import build_sequences, pad_records
from tether.config import SamplingConfig, load_config
from tether.policy.hf import apply_sampling_mask, make_policy, run_generate
from tether.policy.sampling import _filter_logits
from tether.policy.tiny import build_tiny_model, build_tokenizer
from tether.tasks import make_problems
from tether.types import RewardResult, StopReason, TrainBatch, Trajectory, Turn
from tether.train.update import compute_batch_logprobs

PROBLEMS = make_problems("reverse", 12, seed=3)


@pytest.fixture(scope="module")
def policy():
    from tether.config import TinyModelConfig

    tok = build_tokenizer([p["prompt"] + p["answer"] for p in make_problems("reverse", 200, seed=1)], 256)
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=48, num_layers=2, num_heads=2, intermediate_size=96), tok, seed=0)
    return make_policy(model, tok)


def measure_gap(policy, share: str = "off", **sampling) -> float:
    """mean |rollout log-prob - trainer log-prob| over sampled tokens, the trainer scoring as the update does."""
    sp = SamplingConfig(max_new_tokens=12, **sampling)
    prompts = [list(policy.tokenizer.encode(p["prompt"])) for p in PROBLEMS for _ in range(2)]
    samples = run_generate(policy, prompts, sp, torch.Generator().manual_seed(0))
    records = []
    for i, s in enumerate(samples):
        turn = Turn(s.prompt_ids, s.token_ids, s.logprobs, action_kept=s.kept)
        records += build_sequences(Trajectory(str(i), (turn,), RewardResult(0.0), StopReason.EOS), i // 2, i, True)
    p = pad_records(records, policy.pad_id)
    batch = TrainBatch(p.input_ids_BT, p.attention_mask_BT, p.loss_mask_BT, p.rollout_logp_BT,
                       torch.zeros_like(p.rollout_logp_BT), p.group_B, p.traj_B, kept_BT=p.kept_BT)
    trainer = compute_batch_logprobs(policy, batch, sp.temperature, 4096, share=share)
    mask = p.loss_mask_BT > 0
    return float((trainer - p.rollout_logp_BT)[mask].abs().mean())


def test_filtered_gap_equals_the_unfiltered_gap(policy):
    base = measure_gap(policy)
    assert base < 1e-3  # same weights, fp32: only kernel-order noise
    for filt in ({"top_k": 3}, {"top_p": 0.9}, {"min_p": 0.1}, {"top_k": 5, "temperature": 0.7}):
        assert abs(measure_gap(policy, **filt) - base) < 1e-3, filt
    # the prefix-sharing scorer lays the mask out like the ids
    assert abs(measure_gap(policy, share="on", top_k=3) - base) < 1e-3


def test_without_the_mask_the_trainer_scores_another_distribution(policy):
    # keep_mask=false on purpose: the rollout log-probs are of the top-3 distribution, the trainer's of the full one
    assert measure_gap(policy, top_k=3, keep_mask=False) > 0.5


def test_sampler_records_kept_counts(policy):
    prompts = [list(policy.tokenizer.encode(PROBLEMS[0]["prompt"]))] * 3
    gen = torch.Generator().manual_seed(0)
    for s in run_generate(policy, prompts, SamplingConfig(max_new_tokens=6, top_k=4), gen):
        assert s.kept and set(s.kept) == {4}
    assert all(not s.kept for s in run_generate(policy, prompts, SamplingConfig(max_new_tokens=6), gen))


def test_apply_sampling_mask_matches_the_sampler_filter():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 40)
    targets = logits.argmax(-1)
    for top_k, top_p, min_p in ((3, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.2)):
        ref = _filter_logits(logits.reshape(-1, 40), top_k, top_p, min_p).reshape(2, 5, 40)
        kept = torch.isfinite(ref).sum(-1)
        got = apply_sampling_mask(logits, kept, targets)
        assert torch.equal(torch.isfinite(got), torch.isfinite(ref))
    # kept 0: the full vocabulary
    assert torch.equal(apply_sampling_mask(logits, torch.zeros(2, 5, dtype=torch.long), targets), logits)


def test_vllm_backend_refuses_a_filter_it_cannot_report():
    from tether.config import ConfigError

    base = ["dist.backend=vllm", "dist.placement.rollout.gpus=1"]
    with pytest.raises(ConfigError, match="keep_mask=false"):
        load_config(None, base + ["rollout.sampling.top_k=3"])
    load_config(None, base + ["rollout.sampling.top_k=3", "rollout.sampling.keep_mask=false"])  # on purpose: allowed


def test_uniforms_come_from_the_generators_device(monkeypatch):
    """A run's generator is a CPU one; on a GPU the log-probs are on cuda. torch.rand with a CPU generator and
    device='cuda' raises, so the uniforms are drawn on the generator's device and moved (make gpu-check's lora
    part failed this way on an H200). Here the log-probs sit on the meta device, which stands in for cuda."""
    from tether.policy.sampling import _sample_inverse_cdf

    seen, rand = [], torch.rand

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device"))
        return rand(*args, **kwargs)

    monkeypatch.setattr(torch, "rand", spy)
    logp = torch.log_softmax(torch.randn(2, 5), -1).to("meta")
    tok = _sample_inverse_cdf(logp, torch.Generator().manual_seed(0))
    assert seen == [torch.device("cpu")] and tok.device.type == "meta" and tok.shape == (2,)
