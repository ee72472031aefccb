"""Checkpoints: k steps + save + resume into fresh objects == uninterrupted run (losses and RNG),
atomicity (.tmp-* leftovers ignored), pruning, and a Hugging Face-loadable export."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tether.io.checkpoint import (
    CheckpointError,
    _load_via_from_pretrained,
    checkpoint_step,
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tether.io.run_dir import make_run_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_model(seed: int, tie: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      vocab_size=64, max_position_embeddings=64, attention_dropout=0.1,
                      tie_word_embeddings=tie)
    cfg._attn_implementation = "eager"  # dropout in eager attention consumes the torch RNG
    return LlamaForCausalLM(cfg)


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2, **{str(i): i + 3 for i in range(10)}, "+": 13, "=": 14}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")


def make_training(seed: int, tie: bool = False):
    model = make_model(seed, tie)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))
    return model, opt, sched


def do_train_steps(model, opt, sched, steps: int) -> list[float]:
    """Each step draws from python random, numpy and torch (batch + dropout) RNGs."""
    model.train()
    losses = []
    for _ in range(steps):
        shift = random.randint(0, 2) + int(np.random.randint(0, 3))
        ids = torch.randint(3, 58, (4, 12)) + shift
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def draw_rngs() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_reproduces_losses_and_rng(tmp_path):
    run = make_run_dir(tmp_path / "run")
    seed_all(0)
    model, opt, sched = make_training(seed=0)
    do_train_steps(model, opt, sched, 3)
    extra = {"step": 3, "data_pos": 12, "kl": {"coef": torch.tensor(0.05), "target": 6.0}}
    path = save_checkpoint(run, 3, model, make_tokenizer(), opt, sched, extra, keep=2)
    assert path.name == "step_000003" and checkpoint_step(path) == 3
    losses_a = do_train_steps(model, opt, sched, 2)
    draws_a = draw_rngs()
    params_a = {k: v.clone() for k, v in model.state_dict().items()}

    seed_all(999)  # different init and RNG streams: everything must come from the checkpoint
    model_b, opt_b, sched_b = make_training(seed=123)
    assert find_latest_checkpoint(run) == path
    got = load_checkpoint(path, model_b, opt_b, sched_b)
    assert got["data_pos"] == 12 and got["kl"]["target"] == 6.0
    assert torch.equal(got["kl"]["coef"], torch.tensor(0.05))
    assert sched_b.last_epoch == 3
    losses_b = do_train_steps(model_b, opt_b, sched_b, 2)
    torch.testing.assert_close(torch.tensor(losses_b), torch.tensor(losses_a), rtol=0, atol=1e-7)
    assert draw_rngs() == draws_a
    for k, v in model_b.state_dict().items():
        torch.testing.assert_close(v, params_a[k], rtol=0, atol=1e-7)


def test_export_loads_with_auto_classes(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model, opt, sched = make_training(seed=1)
    do_train_steps(model, opt, sched, 1)
    tok = make_tokenizer()
    path = save_checkpoint(run, 1, model, tok, opt, sched, {}, keep=2)
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(path)
    loaded.config._attn_implementation = "eager"
    model.eval(), loaded.eval()
    ids = torch.randint(3, 60, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-6)
    tok2 = AutoTokenizer.from_pretrained(path)
    assert tok2("1 + 2 =")["input_ids"] == tok("1 + 2 =")["input_ids"]


def test_crash_leftover_tmp_is_ignored_and_cleaned(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model = make_model(0)
    good = save_checkpoint(run, 2, model, None, None, None, {"step": 2}, keep=3)
    crashed = run.checkpoints_dir / ".tmp-step_000005"  # save of step 5 died half-way
    crashed.mkdir()
    (crashed / "config.json").write_text("{}")
    assert find_latest_checkpoint(run) == good
    (run.checkpoints_dir / "latest").unlink()  # pointer gone too: fall back to the highest step
    assert find_latest_checkpoint(run.root) == good
    (run.checkpoints_dir / "latest").write_text("step_000009\n")  # stale pointer
    assert find_latest_checkpoint(run) == good
    save_checkpoint(run, 4, model, None, None, None, {}, keep=3)
    assert not crashed.exists()
    assert find_latest_checkpoint(run).name == "step_000004"


def test_find_latest_none_when_empty(tmp_path):
    assert find_latest_checkpoint(make_run_dir(tmp_path / "run")) is None
    assert find_latest_checkpoint(tmp_path / "nowhere") is None


def test_keep_prunes_oldest_never_the_new_one(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model = make_model(0)
    for step in (1, 2, 3, 4):
        save_checkpoint(run, step, model, None, None, None, {}, keep=2)
    names = sorted(p.name for p in run.checkpoints_dir.iterdir() if p.is_dir())
    assert names == ["step_000003", "step_000004"]
    # resumed from an older step: the checkpoint just written survives even with keep=1
    path = save_checkpoint(run, 2, model, None, None, None, {}, keep=1)
    assert path.is_dir() and find_latest_checkpoint(run) == path
    # re-saving an existing step replaces it atomically
    assert save_checkpoint(run, 2, model, None, None, None, {"again": True}, keep=1) == path
    assert load_checkpoint(path, make_model(5))["again"] is True
    assert not [p for p in run.checkpoints_dir.iterdir() if p.name.startswith(".tmp-")]
    with pytest.raises(ValueError):
        save_checkpoint(run, 9, model, keep=0)


def test_missing_optimizer_state_is_an_error(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model, opt, _ = make_training(0)
    path = save_checkpoint(run, 1, model, None, None, None, {}, keep=1)
    with pytest.raises(FileNotFoundError, match="optimizer.pt"):
        load_checkpoint(path, model, opt)
    with pytest.raises(FileNotFoundError, match="trainer_state"):
        load_checkpoint(tmp_path, model)


def test_tied_embeddings_load_in_place(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model = make_model(0, tie=True)
    path = save_checkpoint(run, 1, model, None, None, None, {}, keep=1)
    fresh = make_model(7, tie=True)
    load_checkpoint(path, fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight


def test_from_pretrained_fallback_loads_same_weights(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model = make_model(0)
    path = save_checkpoint(run, 1, model, None, None, None, {}, keep=1)
    fresh = make_model(3)
    _load_via_from_pretrained(path, fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


# ----------------------------------------------------------------------------- verification (issue 14)


def _two_checkpoints(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model, opt, sched = make_training(seed=0)
    good = save_checkpoint(run, 1, model, None, opt, sched, {"step": 1}, keep=3)
    do_train_steps(model, opt, sched, 1)
    newest = save_checkpoint(run, 2, model, None, opt, sched, {"step": 2}, keep=3)
    return run, good, newest


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt", "trainer_state.pt"])
def test_truncated_newest_checkpoint_falls_back_to_the_previous_and_is_kept_aside(tmp_path, victim):
    run, good, newest = _two_checkpoints(tmp_path)
    f = newest / victim
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    messages = []
    assert find_latest_checkpoint(run, move_aside=True, log=messages.append) == good
    assert len(messages) == 1 and victim in messages[0] and "truncated" in messages[0]
    aside = run.checkpoints_dir / "step_000002.corrupt"
    assert not newest.exists() and (aside / victim).is_file()  # moved aside, never deleted
    model, opt, sched = make_training(seed=5)
    assert load_checkpoint(good, model, opt, sched)["step"] == 1  # the previous one loads
    save_checkpoint(run, 2, model, None, opt, sched, {"step": 2}, keep=1)  # a later save does not touch it
    assert (aside / victim).is_file()


def test_corrupted_bytes_are_caught_by_the_hash_and_reported_without_moving(tmp_path):
    run, good, newest = _two_checkpoints(tmp_path)
    f = newest / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF  # same size, one flipped byte in a weight
    f.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="model.safetensors: sha256 differs"):
        assert find_latest_checkpoint(run) == good
    assert newest.is_dir()  # without move_aside (e.g. `tether eval`), nothing is renamed
    assert verify_checkpoint(good) is None


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    run, good, _ = _two_checkpoints(tmp_path)
    files = json.loads((good / "manifest.json").read_text())["files"]
    on_disk = {p.name for p in good.iterdir() if p.name != "manifest.json"}
    assert set(files) == on_disk >= {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.pt"}
    assert files["optimizer.pt"]["size"] == (good / "optimizer.pt").stat().st_size
    assert len(files["optimizer.pt"]["sha256"]) == 64


def test_a_model_with_nonfinite_weights_is_never_saved(tmp_path):
    run = make_run_dir(tmp_path / "run")
    model = make_model(0)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="non-finite weights"):
        save_checkpoint(run, 3, model, None, None, None, {}, keep=2)
    assert find_latest_checkpoint(run) is None and not list(run.checkpoints_dir.iterdir())
