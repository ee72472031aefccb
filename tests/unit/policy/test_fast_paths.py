"""Speed paths must not change results: lean decode, preallocated KV cache, CPU bf16 attention."""

import copy
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tiny_policy_helpers import gqa_models, make_tiny_policy

from tether.config import SamplingConfig
from tether.policy import decode
from tether.policy.attention import NAME, use_fast_cpu_attention
from tether.policy.hf import compute_logprobs, make_policy, run_generate
from tether.policy.sampling import _make_decode_cache, _preallocated_layer_class


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(hidden=64, heads=4, inter=128, seed=1)


@pytest.fixture(scope="module")
def tok(policy):
    return policy.tokenizer


def _prompts(tok, n=6):
    texts = ["12+3=", "1+2=", "29+29=", "7+", "3", "10+11="]
    return [tok.encode(t) for t in texts[:n]]


def test_lean_decoder_logits_equal_transformers_at_every_step(policy, tok):
    # Left-padded prompts, GQA, q/k/v biases: each lean step's logits equal a full forward pass of
    # the sequence so far (the model's own math, fp32).
    models = {"tiny-llama": policy.model, **gqa_models(len(tok))}
    for name, model in models.items():
        assert decode.supports(model), name
        pol = dataclasses.replace(policy, model=model.eval())
        g = torch.Generator().manual_seed(0)
        samples = run_generate(pol, _prompts(tok), SamplingConfig(max_new_tokens=10), g)
        for s in samples:
            seq = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
            lp, _ = compute_logprobs(pol, seq, torch.ones_like(seq, dtype=torch.bool))
            assert torch.allclose(lp[0, len(s.prompt_ids):], torch.tensor(s.logprobs), atol=2e-5), name


def test_lean_and_transformers_decoding_sample_the_same_tokens(policy, tok):
    for greedy in (False, True):
        out = {}
        for lean in (True, False):
            pol = dataclasses.replace(policy, lean_decode=lean)
            g = torch.Generator().manual_seed(3)
            out[lean] = run_generate(pol, _prompts(tok) * 3, SamplingConfig(max_new_tokens=12, temperature=0.8), g, greedy=greedy)
        for a, b in zip(out[True], out[False]):
            assert a.token_ids == b.token_ids and a.finish == b.finish
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5)


def test_lean_decoder_bf16_tracks_fp32(policy, tok):
    pol = dataclasses.replace(policy, autocast_bf16=True)
    g = torch.Generator().manual_seed(0)
    for s in run_generate(pol, _prompts(tok), SamplingConfig(max_new_tokens=8), g):
        seq = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
        lp, _ = compute_logprobs(policy, seq, torch.ones_like(seq, dtype=torch.bool))  # fp32 scorer
        assert torch.allclose(lp[0, len(s.prompt_ids):], torch.tensor(s.logprobs), atol=0.05)


def test_unsupported_models_fall_back_to_transformers(policy, tok):
    scaled = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert not decode.supports(scaled)
    pol = dataclasses.replace(policy, model=scaled)
    samples = run_generate(pol, _prompts(tok, 2), SamplingConfig(max_new_tokens=4), torch.Generator().manual_seed(0))
    assert all(len(s.token_ids) >= 1 for s in samples)


def test_preallocated_cache_grows_and_matches_concatenation():
    cls = _preallocated_layer_class()
    layer = cls(capacity=3)
    ks = [torch.randn(2, 2, n, 4) for n in (2, 1, 3)]
    for i, k in enumerate(ks):
        keys, values = layer.update(k, k + 1)
        want = torch.cat(ks[: i + 1], dim=2)
        assert torch.equal(keys, want) and torch.equal(values, want + 1)
    assert layer.get_seq_length() == 6


def test_decode_cache_is_preallocated_for_full_attention(policy):
    cache = _make_decode_cache(policy.model, 16)
    assert all(type(layer) is _preallocated_layer_class() for layer in cache.layers)


def test_cpu_bf16_attention_matches_sdpa_and_is_not_saved(policy, tmp_path):
    ids = torch.randint(4, len(policy.tokenizer), (4, 16))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 9:] = False
    mask[3, 5:] = False
    base = dataclasses.replace(policy, model=copy.deepcopy(policy.model), autocast_bf16=True)
    fast = dataclasses.replace(policy, model=copy.deepcopy(policy.model), autocast_bf16=True)
    assert use_fast_cpu_attention(fast.model) and fast.model.config._attn_implementation == NAME
    grads = []
    for p in (base, fast):
        lp, ent = compute_logprobs(p, ids, mask, with_entropy=True)
        (lp * mask).sum().backward()
        grads.append((lp.detach(), p.model.get_output_embeddings().weight.grad.clone()))
    keep = mask.clone()
    keep[:, 0] = False
    assert torch.allclose(grads[0][0][keep], grads[1][0][keep], atol=3e-2)
    assert torch.allclose(grads[0][1], grads[1][1], atol=3e-2, rtol=5e-2)
    fast.model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()


def test_make_policy_switches_attention_only_for_cpu_bf16(tok):
    model = make_tiny_policy(hidden=32, layers=1, inter=64, tok=tok).model
    assert make_policy(copy.deepcopy(model), tok).model.config._attn_implementation == "sdpa"
    assert make_policy(model, tok, autocast_bf16=True).model.config._attn_implementation == NAME


def test_inverse_cdf_sampler_draws_the_distribution_and_never_a_filtered_token():
    from tether.policy.sampling import _sample_inverse_cdf

    probs = torch.tensor([0.5, 0.3, 0.0, 0.2, 0.0])
    logp = torch.log(probs).expand(40000, -1)
    tok = _sample_inverse_cdf(logp, torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert torch.allclose(freq, probs, atol=0.01) and freq[2] == 0 and freq[4] == 0
    last = torch.log(torch.tensor([[0.0, 0.0, 1.0]])).expand(100, -1)  # all mass on the last token
    assert (_sample_inverse_cdf(last, torch.Generator().manual_seed(1)) == 2).all()


def test_bf16_sampler_logprobs_match_the_bf16_trainer(policy, tok):
    # Under bf16 autocast the sampler's LM head runs in fp32, as the trainer's scorer does
    # (scoring.fp32_head_logits), and the lean decoder's attention matmuls in bf16, as the trainer's.
    # Measured on this model: max |dlogp| 1.3e-3 (4.8e-3 when the sampler's head ran in bf16).
    pol = dataclasses.replace(policy, autocast_bf16=True)
    for lean in (True, False):
        p = dataclasses.replace(pol, lean_decode=lean)
        samples = run_generate(p, _prompts(tok) * 4, SamplingConfig(max_new_tokens=16), torch.Generator().manual_seed(0))
        for s in samples:
            seq = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
            lp, _ = compute_logprobs(p, seq, torch.ones_like(seq, dtype=torch.bool))  # the bf16 trainer's scorer
            assert (lp[0, len(s.prompt_ids):] - torch.tensor(s.logprobs)).abs().max() < 2.5e-3, lean


def test_lean_cache_window_grows_past_its_first_size(policy, tok):
    # The window starts GROW positions past the prompt and doubles: a generation longer than that
    # crosses a growth and still equals transformers' per-token decoding.
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model).eval())
    cfg = SamplingConfig(max_new_tokens=decode.LeanDecoder.GROW + 12, temperature=0.7)
    out = {}
    for lean in (True, False):
        out[lean] = run_generate(dataclasses.replace(pol, lean_decode=lean), _prompts(tok), cfg, torch.Generator().manual_seed(5))
    assert max(len(s.token_ids) for s in out[True]) > decode.LeanDecoder.GROW
    for a, b in zip(out[True], out[False]):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5)


def test_distinct_prompts_index_their_first_rows():
    from tether.policy.sampling import _distinct_prompts

    first, rows = _distinct_prompts([[1, 2], [3], [1, 2], [3], [4]], "cpu")
    assert first.tolist() == [0, 1, 4] and rows.tolist() == [0, 1, 0, 1, 2]
    assert _distinct_prompts([[1], [2]], "cpu") == (None, None)  # nothing shared: the plain prefill


def test_shared_prefill_samples_what_a_per_row_prefill_samples(policy, tok, monkeypatch):
    # GRPO's n samples per prompt: the prefill runs each distinct prompt once and the lean decoder
    # copies its keys/values to the prompt's rows. Greedy tokens are those of the per-row prefill
    # and sampled log-probs equal it (fp32; the prefill's batch size may change the last bits).
    from tether.policy import sampling

    prompts = [p for p in _prompts(tok) for _ in range(3)]
    cfg = SamplingConfig(max_new_tokens=12)
    calls = []
    real = sampling.next_token_logits
    monkeypatch.setattr(sampling, "next_token_logits", lambda m, ids, *a: calls.append(ids.shape[0]) or real(m, ids, *a))
    shared = run_generate(policy, prompts, cfg, torch.Generator().manual_seed(3))
    shared_greedy = run_generate(policy, prompts, cfg, None, greedy=True)
    assert calls[0] == 6 and calls[-1] == 6  # the prefill ran 6 rows for 18 samples
    monkeypatch.setattr(sampling, "_distinct_prompts", lambda p, d: (None, None))
    plain = run_generate(policy, prompts, cfg, torch.Generator().manual_seed(3))
    plain_greedy = run_generate(policy, prompts, cfg, None, greedy=True)
    assert calls[-1] == 18
    assert [s.token_ids for s in shared_greedy] == [s.token_ids for s in plain_greedy]
    assert [s.token_ids for s in shared] == [s.token_ids for s in plain]
    for a, b in zip(shared, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_shared_prefill_falls_back_when_the_lean_decoder_declines(policy, tok, monkeypatch):
    from tether.policy import sampling

    prompts = [p for p in _prompts(tok, 3) for _ in range(2)]
    cfg = SamplingConfig(max_new_tokens=8)
    want = run_generate(policy, prompts, cfg, None, greedy=True)
    real = decode.make_lean_decoder
    monkeypatch.setattr(decode, "make_lean_decoder", lambda pol, b, c, cache, rows=None: None if rows is not None
                        else real(pol, b, c, cache))
    got = run_generate(policy, prompts, cfg, None, greedy=True)  # a per-row prefill again, then the lean step
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert sampling._distinct_prompts(prompts, "cpu")[0] is not None


def _stopping_policy(policy, every: int = 24):
    """The tiny model with every `every`-th token a stop id: rows finish at different steps."""
    return dataclasses.replace(policy, stop_ids=tuple(range(0, policy.model.config.vocab_size, every)))


def _agree(a, b, atol: float) -> bool:
    """Two samples of one row agree: the same tokens, or the same up to a first different draw,
    with log-probs within `atol` on the common part (a matmul may round differently at another
    row count, which can move one draw)."""
    n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), min(len(a.token_ids), len(b.token_ids)))
    return torch.allclose(torch.tensor(a.logprobs[:n]), torch.tensor(b.logprobs[:n]), atol=atol)


def test_dropping_finished_rows_keeps_the_samples(policy, tok, monkeypatch):
    # Finished rows leave the lean decoder's batch (sampling._COMPACT); every row still draws its
    # uniform each step, so the samples are those of the full-batch decode (on this model, bit for
    # bit; elsewhere a kernel may round differently at another row count: docs/performance.md).
    # _COMPACT=1: a drop whenever a row finished; 0: never.
    from tether.policy import sampling

    pol = _stopping_policy(policy)
    prompts = [p for p in _prompts(tok) for _ in range(4)]
    drops = []
    real = decode.LeanDecoder.keep_rows
    monkeypatch.setattr(decode.LeanDecoder, "keep_rows", lambda self, rows: drops.append(len(rows)) or real(self, rows))
    for cfg, greedy in [(SamplingConfig(max_new_tokens=decode.LeanDecoder.GROW + 12), False),
                        (SamplingConfig(max_new_tokens=20, top_k=7, temperature=0.8), False),
                        (SamplingConfig(max_new_tokens=20), True)]:
        out = {}
        for share in (1.0, 0.0):
            monkeypatch.setattr(sampling, "_COMPACT", share)
            drops.clear()
            out[share] = run_generate(pol, prompts, cfg, torch.Generator().manual_seed(2), greedy=greedy)
            if share == 1.0 and not greedy:
                assert len(drops) >= 3 and drops == sorted(drops, reverse=True) and drops[0] < len(prompts)
            if share == 0.0:
                assert drops == []
        same = sum((a.token_ids, a.finish, a.kept) == (b.token_ids, b.finish, b.kept) for a, b in zip(out[1.0], out[0.0]))
        assert same >= 0.9 * len(prompts)
        assert all(_agree(a, b, 1e-5) for a, b in zip(out[1.0], out[0.0]))
    assert max(len(s.token_ids) for s in out[1.0]) > 1


def test_compiled_decode_step_matches_the_eager_step(policy, tok, monkeypatch):
    # rollout.compile: the step through torch.compile, one graph for every step although the
    # window grows and finished rows leave the batch. fp32: the eager step's tokens (but where a
    # fused kernel's rounding moves a draw) and log-probs within 1e-4. bf16: log-probs within 5e-3
    # of the bf16 trainer's (the eager bf16 step's bound is 2.5e-3 above; measured here: 1.2e-3).
    from torch._dynamo.utils import counters

    from tether.policy import sampling

    monkeypatch.setattr(sampling, "_COMPACT", 1.0)
    pol = _stopping_policy(policy)
    prompts = [p for p in _prompts(tok) for _ in range(4)]
    cfg = SamplingConfig(max_new_tokens=decode.LeanDecoder.GROW + 12)
    eager = run_generate(pol, prompts, cfg, torch.Generator().manual_seed(0))
    counters.clear()
    compiled = run_generate(dataclasses.replace(pol, compile_decode=True), prompts, cfg, torch.Generator().manual_seed(0))
    assert counters["stats"]["unique_graphs"] == 1
    one = run_generate(dataclasses.replace(pol, compile_decode=True), prompts[:1], cfg, torch.Generator().manual_seed(0))
    assert counters["stats"]["unique_graphs"] == 1  # a batch of one row decodes eagerly: no graph specialised to it
    assert one[0].token_ids == run_generate(pol, prompts[:1], cfg, torch.Generator().manual_seed(0))[0].token_ids
    assert max(len(s.token_ids) for s in compiled) > decode.LeanDecoder.GROW  # crossed a growth
    assert sum(a.token_ids == b.token_ids for a, b in zip(compiled, eager)) >= 0.9 * len(prompts)
    assert all(_agree(a, b, 1e-4) for a, b in zip(compiled, eager))
    p16 = dataclasses.replace(pol, autocast_bf16=True, compile_decode=True)
    worst = 0.0
    for s in run_generate(p16, prompts, SamplingConfig(max_new_tokens=16), torch.Generator().manual_seed(0)):
        seq = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
        lp, _ = compute_logprobs(p16, seq, torch.ones_like(seq, dtype=torch.bool))  # the bf16 trainer's scorer
        worst = max(worst, float((lp.detach()[0, len(s.prompt_ids):] - torch.tensor(s.logprobs)).abs().max()))
    assert worst < 5e-3, worst


def test_a_failing_decode_compilation_falls_back_to_the_eager_step(policy, tok, monkeypatch):
    # rollout.compile (or its auto) must not end a run when the compiler fails: a warning, then the
    # same math eagerly for the rest of the process.
    def broken():
        def fail(*a, **k):
            raise RuntimeError("inductor exploded")
        return fail

    monkeypatch.setattr(decode, "compiled_step", broken)
    monkeypatch.delitem(decode._COMPILED, "failed", raising=False)
    prompts = [p for p in _prompts(tok, 3) for _ in range(2)]
    cfg = SamplingConfig(max_new_tokens=10)
    want = run_generate(policy, prompts, cfg, torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="compiling the decode step failed.*inductor exploded"):
        got = run_generate(dataclasses.replace(policy, compile_decode=True), prompts, cfg, torch.Generator().manual_seed(1))
    assert "failed" in decode._COMPILED
    assert all(_agree(a, b, 1e-5) for a, b in zip(got, want))
    monkeypatch.delitem(decode._COMPILED, "failed")


def test_lean_decoder_adopts_the_prefill_buffers_and_decodes_the_same(policy, tok):
    # fp32: the decoder takes transformers' preallocated buffers over (no copy of the prompt's keys/values;
    # with a row map, a shared prefill, one gather), or copies them into its own window. Same logits.
    from tether.policy.sampling import _left_pad, next_token_logits

    ids, mask = _left_pad(_prompts(tok), policy.pad_id, "cpu")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    B, W = ids.shape
    bias = torch.zeros((B, W + 20)).masked_fill_(torch.cat([mask, torch.ones(B, 20, dtype=mask.dtype)], 1) == 0, float("-inf"))
    got = {}
    for adopt in ("whole", "gather", False):
        first, cache = next_token_logits(policy.model, ids, mask, pos, _make_decode_cache(policy.model, W + 16), False)
        if not adopt:  # no room past the prompt in the prefill's buffers: the decoder copies into a window of its own
            for la in cache.layers:
                la._k = la._k[:, :, :W]
        lean = decode.make_lean_decoder(policy, B, W + 20, cache, torch.arange(B) if adopt == "gather" else None)
        assert (lean.k[0].data_ptr() == cache.layers[0]._k.data_ptr()) is (adopt == "whole")
        assert lean.window == (W + 16 if adopt else W + 20), adopt
        steps, tok_B = [first], first.argmax(-1)
        for t in range(18):  # past the adopted window of 16: it grows as the copied one does
            steps.append(lean.step(tok_B, pos[:, -1] + 1 + t, bias))
            tok_B = steps[-1].argmax(-1)
        got[adopt] = torch.stack(steps)
    assert torch.allclose(got["whole"], got[False], atol=1e-5) and torch.allclose(got["gather"], got[False], atol=1e-5)
