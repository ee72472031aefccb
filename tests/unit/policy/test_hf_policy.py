"""The transformers backend: sampling log-probs, finish reasons, padding, chunked scoring."""

import dataclasses

import pytest
import torch

from tether.config import SamplingConfig, TinyModelConfig
from tether.policy.hf import compute_logprobs, find_stop_ids, make_policy, run_generate
from tether.policy.sampling import _filter_logits
from tether.policy.tiny import build_tiny_model, build_tokenizer
from tether.types import StopReason

CORPUS = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]


@pytest.fixture(scope="module")
def policy():
    tok = build_tokenizer(CORPUS, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), tok, seed=1)
    return make_policy(model, tok)


def _prompts(policy):
    tok = policy.tokenizer
    return [tok.encode("12+3="), tok.encode("1+2="), tok.encode("29+29=")]


def test_sampled_logprobs_equal_trainer_logprobs_with_left_padding(policy):
    # Prompts of different lengths are left-padded in one batch; with correct position ids the
    # log-probs recorded while sampling equal a fresh right-padded forward pass of each sequence.
    g = torch.Generator().manual_seed(0)
    for temp in (1.0, 0.7):
        samples = run_generate(policy, _prompts(policy), SamplingConfig(temperature=temp, max_new_tokens=12), g)
        for s in samples:
            seq = list(s.prompt_ids) + list(s.token_ids)
            lp, _ = compute_logprobs(policy, torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.bool), temperature=temp)
            got = lp[0, len(s.prompt_ids):]
            assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4), (temp, got, s.logprobs)


def test_logprobs_are_at_sampling_temperature(policy):
    g = torch.Generator().manual_seed(0)
    s = run_generate(policy, _prompts(policy)[:1], SamplingConfig(temperature=0.5, max_new_tokens=6), g)[0]
    seq = list(s.prompt_ids) + list(s.token_ids)
    ids = torch.tensor([seq])
    lp_t1, _ = compute_logprobs(policy, ids, torch.ones_like(ids, dtype=torch.bool), temperature=1.0)
    # at T=0.5 the recorded log-probs differ from the T=1 ones (tinker-feedback#148)
    assert not torch.allclose(lp_t1[0, len(s.prompt_ids):], torch.tensor(s.logprobs), atol=1e-3)


def test_finish_reasons_and_multiple_stop_ids(policy):
    assert len(policy.stop_ids) == 2  # <|endoftext|> and <|im_end|>
    g = torch.Generator().manual_seed(3)
    samples = run_generate(policy, _prompts(policy) * 8, SamplingConfig(max_new_tokens=3), g)
    for s in samples:
        if s.finish == StopReason.EOS:
            assert s.token_ids[-1] in policy.stop_ids
            assert not any(t in policy.stop_ids for t in s.token_ids[:-1])
        else:
            assert s.finish == StopReason.LENGTH and len(s.token_ids) == 3
            assert not any(t in policy.stop_ids for t in s.token_ids)


def test_pad_equal_to_eos_keeps_eos_in_response(policy, monkeypatch):
    # pad == eos: masks come from lengths, so the emitted eos stays in the response and a
    # response that is only eos (empty text) has length 1 (trl PR#6357).
    from tether.policy import decode, sampling, scoring

    eos = policy.stop_ids[0]
    pol = dataclasses.replace(policy, pad_id=eos)
    head = scoring.fp32_head_logits

    def force_eos(*args):  # make eos overwhelmingly likely: empty responses (the sampler's logits all come from here)
        logits = head(*args)
        logits[..., eos] += 100.0
        return logits

    for module in (sampling, decode):  # the prefill's head and the lean decode step's
        monkeypatch.setattr(module, "fp32_head_logits", force_eos)
    g = torch.Generator().manual_seed(0)
    samples = run_generate(pol, _prompts(pol), SamplingConfig(max_new_tokens=5), g)
    for s in samples:
        assert s.token_ids == (eos,) and s.finish == StopReason.EOS and len(s.logprobs) == 1


def test_greedy_is_deterministic_and_seeded_sampling_reproducible(policy):
    cfg = SamplingConfig(max_new_tokens=8)
    a = run_generate(policy, _prompts(policy), cfg, None, greedy=True)
    b = run_generate(policy, _prompts(policy), cfg, None, greedy=True)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    x = run_generate(policy, _prompts(policy), cfg, torch.Generator().manual_seed(5))
    y = run_generate(policy, _prompts(policy), cfg, torch.Generator().manual_seed(5))
    assert [s.token_ids for s in x] == [s.token_ids for s in y]


def test_top_k_top_p_filter():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k2 = _filter_logits(logits.clone(), top_k=2, top_p=1.0)
    assert torch.isinf(k2[0, 2:]).all() and torch.isfinite(k2[0, :2]).all()
    p = _filter_logits(logits.clone(), top_k=0, top_p=0.75)
    # mass before token: 0, .5, .8 -> tokens 0,1 kept (0.8 >= .75 drops token 2)
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()


def test_chunked_scoring_equals_unchunked_and_gradients_match(policy):
    ids = torch.randint(0, len(policy.tokenizer), (3, 20))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 15:] = False
    lp_a, ent_a = compute_logprobs(policy, ids, mask, with_entropy=True, chunk_size=4)
    lp_b, ent_b = compute_logprobs(policy, ids, mask, with_entropy=True, chunk_size=1000)
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(ent_a, ent_b, atol=1e-5)
    grads = []
    for chunk in (4, 1000):
        policy.model.zero_grad()
        lp, _ = compute_logprobs(policy, ids, mask, chunk_size=chunk)
        (lp * mask).sum().backward()
        grads.append(policy.model.get_output_embeddings().weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    policy.model.zero_grad()


def test_find_stop_ids_requires_one(policy):
    class Empty:
        eos_token_id = None

    with pytest.raises(ValueError, match="no eos token"):
        find_stop_ids(Empty(), Empty())
