"""The lean training forward (tether.policy.lean_train) must not change results: log-probs,
entropies and every gradient equal transformers' forward, eager and compiled, for the model
families it accepts; models it cannot reproduce exactly use transformers' forward."""

import copy
import dataclasses

import pytest
import torch

from tiny_policy_helpers import gqa_models, make_tiny_policy, right_pad

from tether.policy import lean_train
from tether.policy.hf import enable_checkpointing
from tether.policy.prefix import compute_logprobs_shared


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(hidden=64, heads=4, inter=128, seed=2)


def _batch(vocab, seed=0, suffixes=((5, 1, 8, 3), (4, 9, 2)), prefixes=(10, 6)):
    """Groups of sequences sharing a prefix (an earlier turn), right-padded, plus one loner."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(4, vocab, (n,), generator=g)  # noqa: E731
    seqs, group = [], []
    for k, (P, ns) in enumerate(zip(prefixes, suffixes)):
        p = rand(P)
        seqs += [torch.cat([p, rand(n)]) for n in ns]
        group += [k] * len(ns)
    seqs.append(rand(7))
    group.append(len(prefixes))
    ids, mask = right_pad(seqs)
    return ids, mask, torch.tensor(group)


def _run(policy, mode, bf16, ids, mask, group):
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model), autocast_bf16=bf16, lean_train=mode)
    lp, ent = compute_logprobs_shared(pol, ids, mask, group, temperature=0.9, with_entropy=True)
    w = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    ((lp + 0.1 * ent) * w).sum().backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in pol.model.named_parameters()}


def _assert_same(a, b, mask, tol, rtol):
    keep = mask.clone()
    keep[:, 0] = False
    assert torch.allclose(a[0][keep], b[0][keep], atol=tol)
    assert torch.allclose(a[1][keep], b[1][keep], atol=tol)
    assert set(a[2]) == set(b[2])
    for n in a[2]:
        assert torch.allclose(a[2][n], b[2][n], atol=tol, rtol=rtol), n


def test_lean_forward_equals_transformers(policy):
    ids, mask, group = _batch(len(policy.tokenizer))
    assert lean_train.supports(policy.model)
    _assert_same(_run(policy, "off", False, ids, mask, group), _run(policy, "eager", False, ids, mask, group), mask, 1e-5, 1e-4)


def _rel_err(x, ref):
    return float((x - ref).norm() / ref.norm().clamp(min=1e-12))


def test_lean_forward_under_bf16_is_as_accurate_as_transformers(policy):
    """Under bf16 autocast neither path equals fp32; the lean one must be no further from it
    than transformers' own bf16 forward is (log-probs and every gradient)."""
    ids, mask, group = _batch(len(policy.tokenizer))
    exact = _run(policy, "off", False, ids, mask, group)
    hf, lean = _run(policy, "off", True, ids, mask, group), _run(policy, "eager", True, ids, mask, group)
    assert _rel_err(lean[0], exact[0]) <= 1.5 * _rel_err(hf[0], exact[0]) + 1e-3
    for n in exact[2]:
        assert _rel_err(lean[2][n], exact[2][n]) <= 1.5 * _rel_err(hf[2][n], exact[2][n]) + 1e-3, n
        assert _rel_err(lean[2][n], exact[2][n]) < 0.03, n


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias"])
def test_lean_forward_grouped_query_and_biases(policy, name):
    model = gqa_models(len(policy.tokenizer))[name]
    pol = dataclasses.replace(policy, model=model)
    assert lean_train.supports(model)
    ids, mask, group = _batch(len(policy.tokenizer), seed=3)
    _assert_same(_run(pol, "off", False, ids, mask, group), _run(pol, "eager", False, ids, mask, group), mask, 1e-5, 1e-4)


def test_long_sequences_use_sdpa_with_the_same_result(policy, monkeypatch):
    """bf16: the matmul-softmax attention up to EAGER_MAX_SCORES, fp32 SDPA above (fp32 runs SDPA always)."""
    ids, mask, group = _batch(len(policy.tokenizer), seed=4)
    eager = _run(policy, "eager", True, ids, mask, group)
    calls = []
    sdpa = lean_train.F.scaled_dot_product_attention
    monkeypatch.setattr(lean_train.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    monkeypatch.setattr(lean_train, "EAGER_MAX_SCORES", 0)  # every layer takes the SDPA branch
    _assert_same(eager, _run(policy, "eager", True, ids, mask, group), mask, 5e-2, 5e-2)
    assert calls


def test_fp32_attention_is_sdpa_and_compiles(policy):
    """fp32 attention goes through SDPA, eager and compiled, with transformers' fp32 results."""
    ids, mask, group = _batch(len(policy.tokenizer), seed=2)
    exact = _run(policy, "off", False, ids, mask, group)
    _assert_same(exact, _run(policy, "eager", False, ids, mask, group), mask, 1e-5, 1e-4)
    _assert_same(exact, _run(policy, "compile", False, ids, mask, group), mask, 1e-4, 1e-3)


def test_models_it_cannot_reproduce_use_transformers(policy):
    m = copy.deepcopy(policy.model)
    assert lean_train.supports(m) and not lean_train.supports(m, "cuda")

    class Adapter(torch.nn.Linear):  # e.g. a LoRA or quantised layer: its weight is not the whole story
        pass

    a = copy.deepcopy(m)
    q = a.model.layers[0].self_attn.q_proj
    a.model.layers[0].self_attn.q_proj = Adapter(q.in_features, q.out_features, bias=False)
    assert not lean_train.supports(a)
    d = copy.deepcopy(m)
    d.config.attention_dropout = 0.1
    assert not lean_train.supports(d)
    c = copy.deepcopy(m)
    enable_checkpointing(c)
    assert not lean_train.supports(c)


def test_compiled_forward_matches_and_reuses_one_graph_per_shape_family(policy):
    """torch.compile of the layer stack: same results as eager within bf16 rounding, and batches
    of other shapes (other bucket sizes, prefix lengths) reuse the graphs instead of recompiling;
    so do batches of one group, and calls without gradients (zero-advantage rows, scoring), with the
    same log-probs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # reset() leaves the counters: another test's graphs (the compiled decode step) would count
    ids, mask, group = _batch(len(policy.tokenizer))
    eager = _run(policy, "eager", True, ids, mask, group)
    compiled = _run(policy, "compile", True, ids, mask, group)
    _assert_same(eager, compiled, mask, 5e-2, 5e-2)
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2  # the prefix forward (no cache) and the suffix forward (with one)
    for seed, suffixes, prefixes in ((5, ((6, 2, 9, 4, 7), (3, 11)), (12, 5)), (6, ((2, 3), (8, 8, 1)), (9, 7))):
        ids, mask, group = _batch(len(policy.tokenizer), seed, suffixes, prefixes)
        compiled = _run(policy, "compile", True, ids, mask, group)
        _assert_same(_run(policy, "eager", True, ids, mask, group), compiled, mask, 5e-2, 5e-2)
    assert counters["stats"]["unique_graphs"] == graphs
    one = group == 0  # one group: an attention bucket of one row, which torch.compile would specialise
    _assert_same(_run(policy, "eager", True, ids[one], mask[one], group[one]),
                 _run(policy, "compile", True, ids[one], mask[one], group[one]), mask[one], 5e-2, 5e-2)
    short_ids, short_mask, short_group = _batch(len(policy.tokenizer), 7, ((1, 1), (1, 1, 1)), (9, 6))
    short = short_group < 2  # one-token suffixes only (the loner left out): a suffix bucket of width 1
    _assert_same(_run(policy, "eager", True, short_ids[short], short_mask[short], short_group[short]),
                 _run(policy, "compile", True, short_ids[short], short_mask[short], short_group[short]),
                 short_mask[short], 5e-2, 5e-2)
    assert counters["stats"]["unique_graphs"] == graphs
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model), autocast_bf16=True, lean_train="compile")
    with torch.no_grad():
        lp, ent = compute_logprobs_shared(pol, ids, mask, group, temperature=0.9, with_entropy=True)
    assert not lp.requires_grad and torch.equal(lp, compiled[0]) and torch.equal(ent, compiled[1])
    assert counters["stats"]["unique_graphs"] == graphs  # torch.compile guards on the grad mode: not a second graph


def test_rotary_step_is_transformers_bit_for_bit():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    N, H, d = 37, 4, 16
    x = torch.randn(N, H, d, generator=torch.Generator().manual_seed(0))
    freqs = torch.arange(N).float()[:, None] / (10000 ** (torch.arange(0, d, 2).float() / d))[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    ref, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos[None], sin[None])
    assert torch.equal(lean_train._rope(x, *lean_train.rope_tables(cos, sin)), ref[0].transpose(0, 1))


def test_flat_layout_places_every_token_once():
    """The lean forward's flat tokens: every real token once (prefixes once per group), padding
    slots pointing at the zero row N, and each token's query found exactly where `inv` says."""
    from tether.policy.prefix import _pad_rows

    p_ids, p_mask = _pad_rows([torch.tensor([5, 6, 7]), torch.tensor([8, 9])], 0, torch.long)
    s_ids, s_mask = _pad_rows([torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 4, 4, 4])], 0, torch.long)
    row_g, P_B = torch.tensor([0, 0, 1]), torch.tensor([3, 3, 2])
    lay = lean_train.shared_layout(p_ids, p_mask, s_ids, s_mask, row_g, P_B, [[1], [0, 2]])
    N = 3 + 2 + 2 + 1 + 4
    assert lay.ids.tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4, 4, 4, 4]
    assert lay.pos.tolist() == [0, 1, 2, 0, 1, 3, 4, 3, 2, 3, 4, 5]
    assert len(lay.buckets) == 3 and lay.inv.shape == (N,)
    queries = torch.cat([q.reshape(-1) for q, _, _ in lay.buckets])
    assert torch.equal(queries[lay.inv], torch.arange(N))  # each token's own query slot
    assert sorted(queries[queries < N].tolist()) == list(range(N))  # every token exactly once
    q, k, keep = lay.buckets[2]  # rows 0 and 2: group 0's prefix (3) and group 1's (2, padded), then suffixes
    assert k[1].tolist() == [3, 4, N, 8, 9, 10, 11] and keep[1, 0, 0].tolist() == [True, True, False, True, False, False, False]


def test_token_rows_are_rounded_to_a_coarse_grid():
    """Spare rows keep the matmul shapes of later steps on a grid (oneDNN reuses its kernels)."""
    for n in (1, 7, 55, 3300, 3391, 3500, 4097, 10_000):
        r = lean_train.padded_rows(n)
        assert n <= r <= n * 1.07
    assert len({lean_train.padded_rows(n) for n in range(3300, 3500)}) <= 3


def test_a_failing_training_compilation_falls_back_to_the_eager_forward(policy, monkeypatch):
    # train.compile (or its auto) must not end a run when the compiler fails: a warning, then the same
    # forward eagerly (fp32 log-probs, entropies and gradients as the eager mode's, up to the compiled
    # mode's single suffix bucket summing in another order) for the rest of the process.
    def fail(*a, **k):
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(lean_train, "_compiled_stack", lambda: fail)
    monkeypatch.delitem(lean_train._COMPILED, "failed", raising=False)
    ids, mask, group = _batch(len(policy.tokenizer))
    eager = _run(policy, "eager", False, ids, mask, group)
    with pytest.warns(UserWarning, match="compiling the training forward failed.*inductor exploded"):
        fell_back = _run(policy, "compile", False, ids, mask, group)
    assert "failed" in lean_train._COMPILED
    _assert_same(eager, fell_back, mask, 1e-5, 1e-5)
    monkeypatch.delitem(lean_train._COMPILED, "failed")


def test_compiled_bf16_forward_keeps_its_projections_in_bf16(policy, monkeypatch):
    """Under bf16 the projections are autocast's bf16 matmuls, compiled or not; the fp32 oneDNN
    linear (tether.policy.cpu_gemm) is for fp32 only (the LM head is fp32 in both)."""
    from tether.policy import cpu_gemm

    seen = []
    real = cpu_gemm.linear
    monkeypatch.setattr(cpu_gemm, "linear", lambda x, w, b=None: seen.append(tuple(w.shape)) or real(x, w, b))
    torch._dynamo.reset()
    ids, mask, group = _batch(len(policy.tokenizer))
    vocab = policy.model.lm_head.weight.shape[0]
    for mode in ("eager", "compile"):
        seen.clear()
        _run(policy, mode, True, ids, mask, group)
        assert seen and all(s[0] == vocab for s in seen), (mode, seen)  # the LM head only
    seen.clear()
    _run(policy, "eager", False, ids, mask, group)
    assert any(s[0] != vocab for s in seen)  # fp32: the projections too
