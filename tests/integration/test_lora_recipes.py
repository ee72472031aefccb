"""LoRA (model.lora) through the recipes: RL and SFT run from the config on the tiny model, the KL
reference is the base with adapters off (no second parameter copy), checkpoints hold the adapter
and resume exactly, and `tether export` writes a plain model that AutoModelForCausalLM loads."""

import json

import pytest
import torch

pytest.importorskip("peft")

from tether.config import load_config  # noqa: E402
from tether.recipes.rl import run_rl  # noqa: E402
from tether.recipes.sft import run_sft  # noqa: E402

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "run.threads=1", "checkpoint.every=0", "eval.samples=2", "eval.problems=4"]
LORA = ["model.lora={r: 4, alpha: 8}"]
RL = TINY + LORA + ["data.task=reverse", "data.train_size=8", "data.eval_size=4", "train.lr=1e-2",
                    "rollout.problems_per_step=4", "rollout.n=4", "rollout.sampling.max_new_tokens=6",
                    "eval.sampling.max_new_tokens=6", "reward.isolation=inline", "algo.kl.coef=0.05",
                    "reward.components=[{name: 'tests.integration.flaky_reward:letter_fraction'}]"]


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):  # matplotlib takes most of a short run's time; the plots are not under test here
    monkeypatch.setattr("tether.recipes.rl.plot_metrics", lambda *a, **k: None)


def rows(path):
    return [json.loads(line) for line in open(path / "metrics.jsonl")]


def test_lora_rl_trains_adapters_only_and_saves_an_adapter(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load_config(None, RL + ["train.steps=2"])
    run_rl(cfg, tmp_path / "rl")
    steps = [r for r in rows(tmp_path / "rl") if "pg_loss" in r]
    assert len(steps) == 2 and all(r["kl_loss"] == r["kl_loss"] for r in steps)
    assert steps[-1]["kl_loss"] > 0  # the adapter moved the policy away from the base (reference)
    ckpt = tmp_path / "rl" / "checkpoints" / "step_000002"
    assert (ckpt / "adapter_model.safetensors").is_file() and not list(ckpt.glob("model*.safetensors"))
    adapter_cfg = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["base_model_name_or_path"] == str((tmp_path / "rl" / "base_model").resolve())
    # tether export: a plain HF model (no peft needed to load it) equal to base + adapter
    from typer.testing import CliRunner

    from tether.cli import app
    from tether.policy.hf import load_policy

    res = CliRunner().invoke(app, ["export", str(tmp_path / "rl"), "--out", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "plain"))
    assert type(plain).__name__ == "LlamaForCausalLM" and not any("lora" in n for n, _ in plain.named_parameters())
    merged = load_policy(ckpt).model  # what tether eval / plan read
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-6)
    res = CliRunner().invoke(app, ["export", str(tmp_path / "rl"), "--out", str(tmp_path / "plain")])
    assert res.exit_code == 2 and "not empty" in res.output  # never overwrites


def test_lora_reference_shares_the_base_weights(tmp_path):
    from tether.policy.hf import make_policy
    from tether.policy.lora import is_lora
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state
    from tether.train.setup import attach_lora

    cfg = load_config(None, RL + ["train.steps=1"])
    tok = build_tokenizer(["abc cba", "hello olleh"], 64)
    policy = make_policy(build_tiny_model(cfg.model.tiny, tok, tmp_path / "base", seed=0), tok)
    before = sum(p.numel() for p in policy.model.parameters())
    attach_lora(policy, cfg.model.lora, tmp_path / "base")
    st = build_rl_state(RunSettings(cfg), policy, [{"prompt": "abc", "answer": "cba"}])
    assert is_lora(policy.model) and st.ref.base_only and st.ref.model is policy.model
    ptrs = {p.data_ptr() for p in policy.model.parameters()}
    assert all(p.data_ptr() in ptrs for p in st.ref.model.parameters())  # no second copy
    lora = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    assert sum(p.numel() for p in policy.model.parameters()) == before + lora
    assert {id(p) for g in st.optimizer.param_groups for p in g["params"]} == \
        {id(p) for n, p in policy.model.named_parameters() if "lora_" in n}  # the optimizer holds adapters only
    assert st.extra_state()["ref"] is None  # nothing to checkpoint for the reference


@pytest.mark.parametrize("k", [1])
def test_lora_resume_is_exact(tmp_path, k):
    base = RL + ["algo.epochs=2"]
    full = run_rl(load_config(None, base + ["train.steps=3"]), tmp_path / "full")
    run_rl(load_config(None, base + [f"train.steps={k}"]), tmp_path / "part")
    resumed = run_rl(load_config(None, base + ["train.steps=3"]), tmp_path / "part", resume=True)
    a = {r["step"]: r for r in rows(tmp_path / "full") if "pg_loss" in r}
    b = {r["step"]: r for r in rows(tmp_path / "part") if "pg_loss" in r}
    assert sorted(b) == [1, 2, 3]
    for step in range(k + 1, 4):
        for key in ("pg_loss", "reward/mean", "grad_norm", "kl_loss"):
            assert a[step][key] == pytest.approx(b[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert full["final_accuracy"] == pytest.approx(resumed["final_accuracy"])


def test_lora_sft_learns_and_final_model_is_an_adapter(tmp_path):
    from tether.policy.hf import load_policy

    cfg = load_config(None, TINY + LORA + ["model.lora.r=16", "data.task=reverse", "data.train_size=64",
                                           "data.eval_size=4", "sft.steps=20", "sft.lr=5e-2", "sft.batch_size=16",
                                           "sft.warmup_steps=0"])
    policy, summary = run_sft(cfg, tmp_path / "sft")
    losses = [r["sft/loss"] for r in rows(tmp_path / "sft")]
    # a random-init base leaves LoRA little to adapt (measured: 5.53 -> 5.36 nats in 20 steps; full
    # fine-tuning halves the loss): the adapter learns, slowly — see docs/lora.md
    assert sum(losses[-3:]) / 3 < losses[0] - 0.1, losses
    final = tmp_path / "sft" / "final_model"
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    merged = load_policy(final)  # model.path=final_model / tether eval read it merged
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(merged.model(input_ids=ids).logits, policy.model(input_ids=ids).logits, atol=1e-5)


def test_reset_every_with_lora_is_refused():
    with pytest.raises(ValueError, match="reset_every cannot work with model.lora"):
        load_config(None, RL + ["algo.kl.reset_every=2"])


@pytest.mark.parametrize("override, match", [
    (["dist.backend=vllm", "dist.placement.rollout.gpus=1"], "model.lora cannot be combined with dist.backend=vllm"),
    (["dist.cross_policy.pool_size=2", "dist.correction=tis"], "model.lora cannot be combined with dist.cross_policy"),
    (["dist.trainer_workers=2", "dist.trainer_sharding=fsdp2"], "model.lora cannot be combined with dist.trainer_sharding"),
])
def test_lora_async_combinations_that_are_not_wired_are_refused(override, match):
    from tether.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, RL + override)


def test_stage_recipes_save_a_lora_policy_as_an_adapter_that_loads_merged(tmp_path):
    from tether.policy.hf import make_policy
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.train.setup import attach_lora
    from tether.recipes.stage_common import load_model_dir, save_model

    cfg = load_config(None, RL + ["train.steps=1"])
    tok = build_tokenizer(["abc cba", "hello olleh"], 64)
    policy = make_policy(build_tiny_model(cfg.model.tiny, tok, tmp_path / "base", seed=0), tok)
    attach_lora(policy, cfg.model.lora, tmp_path / "base")
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)  # a non-trivial adapter
    out = save_model(policy, tmp_path / "final_model")
    assert (out / "adapter_config.json").is_file() and not (out / "config.json").exists()
    loaded = load_model_dir(out, cfg, "model.path")  # the next stage's model.path
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, policy.model(input_ids=ids).logits, atol=1e-5)
