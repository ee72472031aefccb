"""LoRA through peft: only adapters train, the reference is the base with adapters off (no second
copy), and a saved adapter merges into a plain HF model with the same outputs."""

import pytest
import torch

pytest.importorskip("peft")

from tether.config import LoraConfig  # noqa: E402
from tether.policy.lora import (  # noqa: E402
    adapters_disabled, apply_lora, count_parameters, export_merged, is_adapter_dir, is_lora, load_adapter_into,
    load_adapter_merged, save_adapter,
)


def _tiny(tmp_path, seed=0):
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer

    tok = build_tokenizer([f"{a}+{b}={a + b}" for a in range(20) for b in range(20)], 256)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                             tmp_path / "base", seed=seed)
    return model, tok


def _step(model, ids):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_only_adapters_train_and_the_reference_shares_the_base(tmp_path):
    model, _ = _tiny(tmp_path)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits.clone()
    base_ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    lora = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    assert is_lora(lora) and lora is model  # injected in place: the same module, no copy
    trainable, total = count_parameters(lora)
    # r x (in + out) per adapted projection: 2 layers x 2 projections x 4 x (32 + 32)
    assert trainable == 2 * 2 * 4 * (32 + 32) and total > 20 * trainable
    assert all(("lora_" in n) == p.requires_grad for n, p in lora.named_parameters())
    with torch.no_grad():  # B starts at zero: the LoRA model starts as the base model
        assert torch.equal(lora(input_ids=ids).logits, base_logits)
    _step(lora, ids)
    with torch.no_grad():
        after = lora(input_ids=ids).logits
        with adapters_disabled(lora):
            ref = lora(input_ids=ids).logits
    assert not torch.allclose(after, base_logits, atol=1e-4)  # the adapter learned something
    assert torch.equal(ref, base_logits)  # adapters off = the untouched base
    # the base weights were neither updated nor copied (same storage as before injection)
    shared = {n.replace(".base_layer", ""): p.data_ptr() for n, p in lora.named_parameters() if "lora_" not in n}
    assert {k: v for k, v in shared.items() if k in base_ptrs} == {k: v for k, v in base_ptrs.items() if k in shared}
    assert all(("lora_" in n) == p.requires_grad for n, p in lora.named_parameters())  # restored after the context


def test_adapter_saves_reloads_and_merges(tmp_path):
    model, tok = _tiny(tmp_path)
    lora = apply_lora(model, LoraConfig(r=2, alpha=4))
    ids = torch.tensor([[3, 4, 5, 6]])
    _step(lora, ids)
    with torch.no_grad():
        want = lora(input_ids=ids).logits
    out = save_adapter(lora, tmp_path / "ckpt", tmp_path / "base")
    assert is_adapter_dir(out) and (out / "adapter_model.safetensors").stat().st_size < 200_000
    merged = load_adapter_merged(out)
    assert not is_lora(merged) and type(merged).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
    # resume: a fresh injected model of the same shape takes the saved adapter exactly
    fresh, _ = _tiny(tmp_path / "again")
    fresh = apply_lora(fresh, LoraConfig(r=2, alpha=4))
    load_adapter_into(fresh, out)
    with torch.no_grad():
        assert torch.allclose(fresh(input_ids=ids).logits, want, atol=1e-6)
    plain = export_merged(out, tmp_path / "export", tokenizer=tok)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(plain))
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, want, atol=1e-5)


def test_fast_paths_step_aside_for_lora(tmp_path):
    """tether.policy.decode / lean_train read raw projection weights; a LoRA layer's `.weight` is its
    base weight, so they must refuse a LoRA model, else rollouts would silently ignore the adapters."""
    from tether.config import SamplingConfig
    from tether.policy import decode, lean_train
    from tether.policy.hf import compute_logprobs, make_policy, run_generate

    model, tok = _tiny(tmp_path)
    assert decode.supports(model) and lean_train.supports(model)
    lora = apply_lora(model, LoraConfig(r=4, alpha=8))
    assert not decode.supports(lora) and not lean_train.supports(lora)
    torch.manual_seed(1)
    for _ in range(3):
        _step(lora, torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]))
    policy = make_policy(lora, tok)
    sample = run_generate(policy, [[5, 6, 7]], SamplingConfig(max_new_tokens=6), greedy=True)[0]
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.token_ids)])
    with torch.no_grad():
        logp, _ = compute_logprobs(policy, ids, torch.ones_like(ids))
    # the sampler's log-probs are those of the adapted model (the trainer's forward runs the adapters)
    assert torch.allclose(torch.tensor(sample.logprobs), logp[0, 3:], atol=1e-4)
