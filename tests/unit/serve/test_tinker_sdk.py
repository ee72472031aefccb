"""The real `tinker` SDK (PyPI, 0.38) against tether's Tinker-compatible service: one test per call.

Every number the service returns is checked against an independent computation on the same local
model (transformers' own forward), not against the service itself."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

# in the `tinker` extra, which `make test` installs (a venv built before it was added skips these)
tinker = pytest.importorskip("tinker", reason="pip install -e '.[tinker]' (make test installs it)")
from tinker import types  # noqa: E402


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32, local_files_only=True).eval()


def ref_logprobs(model, tokens, targets):
    """log p(targets[i] | tokens[:i+1]) by transformers' forward (the independent reference)."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(targets)), torch.tensor(targets)]


def lm_datum(ids, weights=None):
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": weights or [1.0] * (len(ids) - 1)})


@pytest.fixture(scope="module")
def tok(client):
    tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    return tc.get_tokenizer()


def test_capabilities_and_model_listing(service):
    caps = tinker.RestClient(base_url=service.base_url, api_key=service.api_key).get_server_capabilities().result()
    names = {m.model_name: m for m in caps.supported_models}
    assert set(names) == {"tiny", "Org/Tiny-Alias"}
    assert names["tiny"].trainable and names["tiny"].sampleable and names["tiny"].max_context_length == 128


def test_create_lora_client_info_and_tokenizer(client, tiny_dir):
    tc = client.create_lora_training_client(base_model="Org/Tiny-Alias", rank=8, seed=1).result()
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 8 and info.model_data.model_name == "Org/Tiny-Alias"
    tokenizer = tc.get_tokenizer()  # loaded by the SDK from the served model's directory
    assert tokenizer.encode("hello olleh") and str(tiny_dir) == info.model_data.tokenizer_id
    with pytest.raises(Exception, match="not served here"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()


def test_forward_logprobs_match_transformers(client, tok, hf_model):
    tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()  # B = 0: the base model
    ids = tok.encode("the cat sat on the mat")
    targets = [0] * 3 + ids[4:]  # arbitrary targets, as the cookbook pads prompts with 0
    out = tc.forward([types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                  loss_fn_inputs={"target_tokens": targets})], "cross_entropy").result()
    got = out.loss_fn_outputs[0]["logprobs"].to_torch()
    ref = ref_logprobs(hf_model, ids[:-1], targets)
    assert torch.allclose(got, ref, atol=1e-5)
    assert out.metrics["loss:sum"] == pytest.approx(-float(ref.sum()), rel=1e-5)


def test_forward_backward_cross_entropy_and_optim_step_learn(client, tok):
    tc = client.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    data = [lm_datum(tok.encode(t)) for t in ("hello olleh", "abc cba")]
    losses = []
    for _ in range(8):
        fb = tc.forward_backward(data, "cross_entropy")  # submitted before waiting: the SDK's futures
        opt = tc.optim_step(types.AdamParams(learning_rate=0.01))
        losses.append(fb.result().metrics["loss:sum"])
        assert opt.result().metrics["grad_norm"] > 0
    # a LoRA on a random 32-wide model moves the loss slowly (its tied unembedding bounds the logits)
    assert min(losses[4:]) < losses[0] - 1.0


def test_weights_are_sums_and_elementwise_loss(client, tok, hf_model):
    tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    ids = tok.encode("reverse esrever")
    w = [0.0, 2.0] + [0.5] * (len(ids) - 3)
    out = tc.forward([lm_datum(ids, w)], "cross_entropy").result()
    ref = ref_logprobs(hf_model, ids[:-1], ids[1:])
    assert np.allclose(out.loss_fn_outputs[0]["elementwise_loss"].to_numpy(), (-ref * torch.tensor(w)).numpy(), atol=1e-5)
    assert out.metrics["loss:sum"] == pytest.approx(float(-(ref * torch.tensor(w)).sum()), rel=1e-5)


@pytest.mark.parametrize("loss_fn, config", [("importance_sampling", None), ("ppo", None),
                                             ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
                                             ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.1})])
def test_policy_gradient_losses_match_tinker_formulas(client, tok, hf_model, loss_fn, config):
    tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    ids = tok.encode("the cat sat on the mat")
    n = len(ids) - 1
    ref = ref_logprobs(hf_model, ids[:-1], ids[1:])
    gen = torch.Generator().manual_seed(3)
    sampling = (ref + 0.3 * torch.randn(n, generator=gen)).tolist()  # a sampler that differs: ratios far from 1
    adv = [0.0, 0.0] + torch.randn(n - 2, generator=gen).tolist()
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": sampling, "advantages": adv})
    out = tc.forward([datum], loss_fn, config).result()
    r, a = torch.exp(ref - torch.tensor(sampling)), torch.tensor(adv)
    lo, hi = (config or {}).get("clip_low_threshold", 0.8), (config or {}).get("clip_high_threshold", 1.2)
    expected = {"importance_sampling": -(r * a),
                "ppo": -torch.minimum(r * a, r.clamp(lo, hi) * a),
                "cispo": -(r.clamp(lo, hi) * ref * a)}[loss_fn]  # Tinker's docs, token by token, summed
    assert out.metrics["loss:sum"] == pytest.approx(float(expected.sum()), rel=1e-4, abs=1e-5)


def test_unknown_loss_or_config_is_a_user_error(client, tok):
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    d = lm_datum(tok.encode("abc cba"))
    with pytest.raises(tinker.RequestFailedError, match="not served by tether") as e:
        tc.forward([d], "dro").result()
    assert e.value.category == types.RequestErrorCategory.User
    tc2 = client.create_lora_training_client(base_model="tiny", rank=4).result()  # a failed request poisons its client
    with pytest.raises(tinker.RequestFailedError, match="unknown loss_fn_config keys"):
        tc2.forward([types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": [0.0] * d.model_input.length,
            "advantages": [1.0] * d.model_input.length})], "ppo", {"beta": 0.1}).result()


def test_custom_loss_callable_and_handle_equal_cross_entropy(client, tok):
    """The SDK's custom-loss path (a forward, then cross_entropy with weights = -dL/dlogp) trains
    exactly as the built-in loss it mirrors."""
    data = [lm_datum(tok.encode(t)) for t in ("hello olleh", "abc cba")]

    def nll(data, logprobs_list):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() for d, lp in zip(data, logprobs_list))
        return loss, {"custom/nll:sum": loss.detach()}

    def neg_ll(logprobs, weights):
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    handle = client.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()
    outs = []
    for fn in ("cross_entropy", nll, handle):
        tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
        first = tc.forward_backward(data, fn) if isinstance(fn, str) else tc.forward_backward_custom(data, fn)
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        after = tc.forward(data, "cross_entropy").result()
        outs.append((first.result().metrics["loss:sum"], after.metrics["loss:sum"]))
    assert outs[1] == pytest.approx(outs[0], rel=1e-4) and outs[2] == pytest.approx(outs[0], rel=1e-4)


def test_optim_step_adam_parameters_and_clipping(client, tok):
    data = [lm_datum(tok.encode("hello olleh"))]
    deltas = []
    for params in (types.AdamParams(learning_rate=0.01), types.AdamParams(learning_rate=0.01, grad_clip_norm=1e-3),
                   types.AdamParams(learning_rate=0.0)):
        tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
        before = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
        tc.forward_backward(data, "cross_entropy").result()
        m = tc.optim_step(params).result().metrics
        after = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
        deltas.append((before - after, m["grad_norm"], m["learning_rate"]))
    assert deltas[0][0] > 0 and deltas[0][2] == 0.01
    assert deltas[1][1] == pytest.approx(deltas[0][1])  # the norm before clipping is reported
    assert deltas[2][0] == pytest.approx(0.0, abs=1e-6)  # lr 0: nothing moves


def test_save_state_load_state_restores_weights_and_optimizer(client, tok):
    data = [lm_datum(tok.encode("reverse esrever"))]
    adam = types.AdamParams(learning_rate=0.02)
    tc = client.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(adam).result()
    path = tc.save_state("step1").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/step1")

    def two_more(client_):
        for _ in range(2):
            client_.forward_backward(data, "cross_entropy").result()
            client_.optim_step(adam).result()
        return client_.forward(data, "cross_entropy").result().metrics["loss:sum"]

    continued = two_more(tc)
    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    assert two_more(resumed) == pytest.approx(continued, rel=1e-5)  # Adam's moments came back too
    weights_only = client.create_training_client_from_state(path).result()
    assert two_more(weights_only) != pytest.approx(continued, rel=1e-5)  # fresh moments: another trajectory
    with pytest.warns(FutureWarning):
        tc.load_state(path).result()  # the deprecated in-place load: back to step 1's weights
    assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        client.create_training_client_from_state(path).result().forward(data, "cross_entropy").result().metrics["loss:sum"])
    ckpts = tinker.RestClient(base_url=client._base_url, api_key=client._api_key).list_checkpoints(tc.model_id).result()
    assert [c.tinker_path for c in ckpts.checkpoints] == [path]


def test_sample_logprobs_are_exact_n_samples_and_max_tokens(client, tok, hf_model):
    sc = client.create_sampling_client(base_model="tiny").result()
    prompt = tok.encode("the cat")
    res = sc.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(max_tokens=6, seed=1)).result()
    assert len(res.sequences) == 4 and len({s.sequence_id for s in res.sequences}) == 4
    for s in res.sequences:
        assert 1 <= len(s.tokens) <= 6 and len(s.logprobs) == len(s.tokens)
        full = prompt + list(s.tokens)
        ref = ref_logprobs(hf_model, full[:-1], full[1:])[len(prompt) - 1:]
        assert np.allclose(s.logprobs, ref.numpy(), atol=1e-4)  # log-probs of the distribution sampled from
    again = sc.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(max_tokens=6, seed=1)).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in res.sequences]  # seeded: reproducible


def test_sample_stop_tokens_stop_strings_and_greedy(client, tok):
    sc = client.create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tok.encode("abc"))
    greedy = sc.sample(prompt, 2, types.SamplingParams(max_tokens=12, temperature=0.0, stop=[])).result()
    a, b = (list(s.tokens) for s in greedy.sequences)
    assert a == b and len(a) == 12 and greedy.sequences[0].stop_reason == "length"  # [] disables EOS too
    stop_id = a[3]
    cut = sc.sample(prompt, 1, types.SamplingParams(max_tokens=12, temperature=0.0, stop=[stop_id])).result()
    assert list(cut.sequences[0].tokens) == a[:a.index(stop_id) + 1] and cut.sequences[0].stop_reason == "stop"
    text = tok.decode(a[4:7])
    by_text = sc.sample(prompt, 1, types.SamplingParams(max_tokens=12, temperature=0.0, stop=[text])).result().sequences[0]
    assert text in tok.decode(list(by_text.tokens)) and text not in tok.decode(list(by_text.tokens)[:-1])
    assert by_text.stop_reason == "stop"


def test_compute_logprobs_of_a_prompt(client, tok, hf_model):
    sc = client.create_sampling_client(base_model="tiny").result()
    ids = tok.encode("hello olleh")
    lps = sc.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    assert lps[0] is None
    assert np.allclose(lps[1:], ref_logprobs(hf_model, ids[:-1], ids[1:]).numpy(), atol=1e-5)


def test_save_weights_and_get_sampling_client_follows_training(client, tok):
    tc = client.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    ids = tok.encode("hello olleh")
    before = tc.save_weights_and_get_sampling_client().result()
    for _ in range(10):
        tc.forward_backward([lm_datum(ids)], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=0.05))
    after = tc.save_weights_and_get_sampling_client().result()
    lp_before = before.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    lp_after = after.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    assert sum(lp_after[1:]) > sum(lp_before[1:]) + 1.0  # the snapshot carries the trained adapter
    named = tc.save_weights_for_sampler("trained").result().path
    assert named.endswith("/sampler_weights/trained")
    from_path = client.create_sampling_client(model_path=named).result()
    assert from_path.compute_logprobs(types.ModelInput.from_ints(ids)).result()[1:] == pytest.approx(lp_after[1:], rel=1e-5)


def test_several_adapters_on_one_base_stay_apart(client, tok, hf_model):
    a_ids, b_ids = tok.encode("abc cba"), tok.encode("the cat sat")
    ta = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    tb = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    for _ in range(6):
        ta.forward_backward([lm_datum(a_ids)], "cross_entropy")
        ta.optim_step(types.AdamParams(learning_rate=0.05))
    la = ta.forward([lm_datum(b_ids)], "cross_entropy").result().metrics["loss:sum"]
    lb = tb.forward([lm_datum(b_ids)], "cross_entropy").result().metrics["loss:sum"]  # untouched adapter
    assert lb == pytest.approx(-float(ref_logprobs(hf_model, b_ids[:-1], b_ids[1:]).sum()), rel=1e-5)
    assert la != pytest.approx(lb, rel=1e-3)
    base = client.create_sampling_client(base_model="tiny").result()  # the base: adapters off
    lp = base.compute_logprobs(types.ModelInput.from_ints(b_ids)).result()
    assert -sum(lp[1:]) == pytest.approx(lb, rel=1e-5)


def test_full_weight_training_with_rank_zero(client, tok):
    tc = client.create_lora_training_client(base_model="tiny", rank=0).result()
    assert not tc.get_info().is_lora
    data = [lm_datum(tok.encode("hello olleh"))]
    first = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=0.01)).result()
    assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] < first
    base = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()  # the shared base is untouched
    assert base.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(first, rel=1e-6)


def test_async_flow(client, tok):
    async def main():
        tc = await client.create_lora_training_client(base_model="tiny", rank=4, seed=0)
        data = [lm_datum(tok.encode("abc cba"))]
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=0.01))
        first, _ = await fb, await opt
        sampler = await tc.save_weights_and_get_sampling_client()
        res = await sampler.sample(types.ModelInput.from_ints(tok.encode("abc")), 2, types.SamplingParams(max_tokens=3))
        return first.metrics["loss:sum"], res

    loss, res = asyncio.run(main())
    assert loss > 0 and len(res.sequences) == 2


def test_unserved_sampling_options_are_user_errors(client, tok):
    sc = client.create_sampling_client(base_model="tiny").result()
    with pytest.raises(tinker.RequestFailedError, match="not served by tether"):
        sc.sample(types.ModelInput.from_ints(tok.encode("abc")), 1, types.SamplingParams(max_tokens=2),
                  topk_sample_logprobs=3).result()


def test_api_key_required_off_loopback_and_checked(tiny_dir, tmp_path):
    from tether.errors import InputError
    from tether.serve.tinker import TinkerService, TinkerSettings

    with pytest.raises(InputError, match="not a loopback address"):
        TinkerService({"tiny": tiny_dir}, tmp_path, TinkerSettings(host="0.0.0.0"))
    with TinkerService({"tiny": tiny_dir}, tmp_path, TinkerSettings(token="tml-secret")) as svc:
        with pytest.raises(Exception):
            tinker.RestClient(base_url=svc.base_url, api_key="tml-wrong").get_server_capabilities().result()
        ok = tinker.RestClient(base_url=svc.base_url, api_key="tml-secret").get_server_capabilities().result()
        assert ok.supported_models[0].model_name == "tiny"


@pytest.mark.parametrize("merge", [True, False], ids=["merged-copy", "adapter-copy"])
def test_lora_snapshot_samples_what_was_trained(tiny_dir, tmp_path, merge):
    """A LoRA snapshot is sampled either from a merged copy of its base (small bases: tether's fast
    decoder) or from a copy of the adapter (large bases); both score a sequence as the trainer does."""
    from tether.serve.tinker import TinkerService, TinkerSettings

    settings = TinkerSettings(merge_max_params=10**12 if merge else 0)
    with TinkerService({"tiny": tiny_dir}, tmp_path, settings) as svc:
        sc = tinker.ServiceClient(base_url=svc.base_url, api_key=svc.api_key)
        tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
        tok = tc.get_tokenizer()
        ids = tok.encode("the cat sat on the mat")
        for _ in range(3):
            tc.forward_backward([lm_datum(ids)], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.05))
        trainer = tc.forward([lm_datum(ids)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        sampler = tc.save_weights_and_get_sampling_client().result()
        assert (svc.store.sampler(sampler._sampling_session_id).adapter is None) == merge
        lps = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
        assert np.allclose(lps[1:], trainer, atol=1e-5)
        sc.close("success").result()
