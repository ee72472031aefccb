"""Keys/values carried from one generate call to the next (tether.policy.kv_reuse): the store's
lookup and lifetime, and a second turn sampled with reuse equals one sampled without."""

import dataclasses

import pytest
import torch

from tiny_policy_helpers import gqa_models, make_tiny_policy

from tether.config import SamplingConfig
from tether.policy import kv_reuse
from tether.policy.hf import run_generate
from tether.policy.kv_reuse import TurnKV, carry_turn_kv


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(hidden=64, heads=4, inter=128, seed=1)


def _save(store, tokens):
    """Save `tokens` with keys/values 0, 1, 2, ... along positions (2 layers, 1 head of size 1), at
    column 3 of row 1 of a 2-row buffer."""
    n = len(tokens)
    buf = torch.full((2, 1, n + 5, 1), -1.0)
    buf[1, 0, 3:3 + n, 0] = torch.arange(n, dtype=torch.float32)
    store.save(tuple(tokens), [buf, buf], [buf, buf], 1, 3)


def test_lookup_takes_the_longest_saved_prefix_and_leaves_the_last_token_to_run():
    store, pol = TurnKV(), make_tiny_policy()
    store.begin_call(pol)
    _save(store, (1, 2, 3))
    _save(store, (1, 2, 3, 4, 5))
    _save(store, (1, 2, 9, 9, 9, 9))
    assert store.lookup([1, 2, 3, 4, 5, 6]).tokens == (1, 2, 3, 4, 5)
    assert store.lookup([1, 2, 3, 4, 5]).tokens == (1, 2, 3)  # the prompt's last position must run
    assert store.lookup([1, 2, 3]) is None and store.lookup([7, 1, 2, 3, 4]) is None
    # plan: rows left-padded to width 8; S = the longest uncached suffix (the second row: 7 - 3 = 4)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 0, 0, 0]]
    s, past = store.plan(prompts, 8)
    assert s == 4 and past.length == 4 and past.layers == 2
    keys, values = torch.full((2, 1, 6, 1), 9.0), torch.full((2, 1, 6, 1), 9.0)
    past.fill(1, keys, values)
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 9, 9]  # row 0 keeps 4 of its 5 saved positions
    assert values[1, 0, :, 0].tolist() == [0, 0, 1, 2, 9, 9]  # row 1: one pad column, then 3 saved positions
    assert store.lookup([1, 2, 3, 4, 5, 6]) is None and store.lookup([1, 2, 3, 4]) is None  # matched: gone
    assert store.plan([[4, 4, 4]], 3) is None  # nothing saved for it: the whole prompt runs


def test_entries_live_two_calls_and_die_with_the_weights():
    store, pol = TurnKV(), make_tiny_policy()
    store.begin_call(pol)
    _save(store, (1, 2))
    store.begin_call(pol)
    store.begin_call(pol)
    assert store.lookup([1, 2, 3]) is not None  # saved two calls ago (a summary call may sit between turns)
    store.begin_call(pol)
    assert store.lookup([1, 2, 3]) is None
    _save(store, (1, 2))
    pol.version += 1  # an optimizer step
    store.begin_call(pol)
    assert store.lookup([1, 2, 3]) is None
    _save(store, (1, 2))
    store.begin_call(dataclasses.replace(pol, autocast_bf16=not pol.autocast_bf16))
    assert store.lookup([1, 2, 3]) is None


def test_scope_owns_the_store_and_an_inflight_feed_disables_it(policy):
    with carry_turn_kv(policy) as store:
        assert policy.turn_kv is store and kv_reuse.active(policy) is store
        with carry_turn_kv(policy) as inner:
            assert inner is None  # the outer scope keeps its store
        assert policy.turn_kv is store
        fed = dataclasses.replace(policy, weight_feed=object())
        assert kv_reuse.active(fed) is None
    assert policy.turn_kv is None
    off = dataclasses.replace(policy, reuse_turn_kv=False)
    with carry_turn_kv(off) as store:
        assert store is None and off.turn_kv is None


def _two_turns(pol, reuse: bool, seed: int = 0):
    pol = dataclasses.replace(pol, reuse_turn_kv=reuse)
    tok = pol.tokenizer
    prompts = [tok.encode(t) for t in ["12+3=", "1+2=", "29+29=", "7+", "3", "10+11="]] * 2
    sp = SamplingConfig(max_new_tokens=10)
    g = torch.Generator().manual_seed(seed)
    with carry_turn_kv(pol) as store:
        first = run_generate(pol, prompts, sp, g)
        # the next turn: each context extends the previous one and its action (append-only)
        second = run_generate(pol, [[*s.prompt_ids, *s.token_ids, *tok.encode("4+5=")] for s in first], sp, g)
        stats = dict(store.stats) if store is not None else None
    return first, second, stats


@pytest.mark.parametrize("lean", [True, False], ids=["lean-decoder", "transformers-step"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_second_turn_with_reused_keys_values_equals_a_whole_prefill(policy, lean, bf16):
    pol = dataclasses.replace(policy, lean_decode=lean, autocast_bf16=bf16)
    a1, a2, stats = _two_turns(pol, True)
    b1, b2, none = _two_turns(pol, False)
    assert none is None
    # the second call reused every row's first turn and ran only the window of new tokens
    assert stats["reused_rows"] == 12 and 0 < stats["run_positions"] < stats["prompt_positions"]
    assert stats["reused_positions"] > 0.4 * stats["prompt_positions"]
    tol = 3e-3 if bf16 else 2e-5  # bf16: saved keys/values are the decoder's bf16 cache, a whole prefill recomputes
    for x, y in zip(a1 + a2, b1 + b2):
        assert x.token_ids == y.token_ids and x.finish == y.finish
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=tol)


def test_grouped_query_and_biased_models_reuse_exactly(policy):
    for name, model in gqa_models(len(policy.tokenizer)).items():
        pol = dataclasses.replace(policy, model=model.eval())
        a = _two_turns(pol, True)
        b = _two_turns(pol, False)
        assert a[2]["reused_rows"] == 12, name
        for x, y in zip(a[1], b[1]):
            assert x.token_ids == y.token_ids, name
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=2e-5), name


def test_changed_weights_are_never_served_from_the_store(policy):
    pol = dataclasses.replace(policy, model=make_tiny_policy(hidden=64, heads=4, inter=128, seed=1).model)
    tok, sp = pol.tokenizer, SamplingConfig(max_new_tokens=8)
    prompts = [tok.encode(t) for t in ["12+3=", "1+2="]]
    with carry_turn_kv(pol) as store:
        first = run_generate(pol, prompts, sp, torch.Generator().manual_seed(0))
        with torch.no_grad():
            for p in pol.model.parameters():
                p.mul_(1.5)
        pol.version += 1  # what the RL recipe does after an optimizer step
        nxt = [[*s.prompt_ids, *s.token_ids, *tok.encode("4+5=")] for s in first]
        got = run_generate(pol, nxt, sp, torch.Generator().manual_seed(1))
        assert store.stats["reused_rows"] == 0
    want = run_generate(dataclasses.replace(pol, reuse_turn_kv=False), nxt, sp, torch.Generator().manual_seed(1))
    assert [s.logprobs for s in got] == [s.logprobs for s in want]
