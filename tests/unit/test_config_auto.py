"""Settings that follow the model and the data (tether.config.fit, configs/byo.yaml) and the clear
error for a forgotten `model.path`."""

from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from tether.config import ConfigError, load_config  # noqa: E402
from tether.config.fit import compute_loglinear, compute_percentile  # noqa: E402

BYO = Path(__file__).resolve().parents[2] / "configs" / "byo.yaml"


def verl_rows(n: int, answer=lambda i: "dcba"[: 1 + i % 4]):
    return [{"data_source": "t", "prompt": [{"role": "user", "content": f"reverse {'abcd'[: 1 + i % 4]}:"}],
             "reward_model": {"style": "rule", "ground_truth": answer(i)}, "extra_info": {"index": i}} for i in range(n)]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    from tether.policy.families import build_family_model, family_shape

    root = tmp_path_factory.mktemp("byo")
    parquet = root / "train.parquet"
    datasets.Dataset.from_list(verl_rows(40)).to_parquet(str(parquet))
    model = build_family_model("qwen2", root / "qwen", ["reverse abcd: dcba"], family_shape(hidden_size=32, intermediate_size=64))
    return model, parquet


def test_the_byo_config_fits_a_tiny_model_and_short_answers(example, capsys):
    model, parquet = example
    cfg = load_config(BYO, [f"model.path={model}", f"data.path={parquet}"])
    out = capsys.readouterr().out
    # a ~30k-parameter model: the learning rates are the small-model ends of the rules, not byo's old 1e-6
    assert cfg.train.lr == 3e-4 and cfg.sft.lr == 2e-3
    assert "train.lr=0.0003 (auto: a 0.0" in out and "log-linear" in out
    # answers of 1-4 characters (+ the stop token): a budget of a few tokens, not 512
    assert 8 <= cfg.rollout.sampling.max_new_tokens <= 24 and cfg.eval.sampling.max_new_tokens == cfg.rollout.sampling.max_new_tokens
    assert "twice the 99th percentile" in out
    assert 8 <= cfg.rollout.max_prompt_tokens <= 64 and "the longest of 40 prompts" in out
    assert cfg.train.steps == 20 and cfg.sft.steps == 50  # the lower ends: 40 rows are few
    assert cfg.data.chat is True  # set for a chat model


def test_rl_steps_are_one_pass_over_the_rows_up_to_200(example):
    """2,000 generated rows at 8 problems a step would be 250 steps: capped at 200 (100 left the
    example of docs/byo.md under +10 points on two of three seeds, benchmarks/results/byo_lift_rl100.json)."""
    model, _ = example
    cfg = load_config(BYO, [f"model.path={model}", "data.task=reverse", "data.train_size=4000", "data.chat=false"])
    assert cfg.train.steps == 200 and cfg.sft.steps == 188  # sft: three passes over 2,000 rows at batch 32
    cfg = load_config(BYO, [f"model.path={model}", "data.task=reverse", "data.train_size=1000", "data.chat=false"])
    assert cfg.train.steps == 125


def test_an_explicit_value_is_never_changed(example):
    model, parquet = example
    cfg = load_config(BYO, [f"model.path={model}", f"data.path={parquet}", "train.lr=1e-5",
                            "rollout.sampling.max_new_tokens=64", "train.steps=7"])
    assert cfg.train.lr == 1e-5 and cfg.rollout.sampling.max_new_tokens == 64 and cfg.train.steps == 7
    assert cfg.sft.lr == 2e-3  # the keys left at auto still follow the model


def test_the_rules_at_their_anchors():
    assert compute_loglinear(3.3e6, 1e-4, 1e-6, 5e-7, 3e-4) == pytest.approx(1e-4)
    assert compute_loglinear(5e8, 1e-4, 1e-6, 5e-7, 3e-4) == pytest.approx(1e-6)
    assert compute_loglinear(7e9, 1e-4, 1e-6, 5e-7, 3e-4) == pytest.approx(5e-7)  # clamped
    assert 1e-6 < compute_loglinear(5e7, 1e-4, 1e-6, 5e-7, 3e-4) < 1e-4
    assert compute_percentile([1] * 99 + [50], 0.99) == 1 and compute_percentile([3, 1, 2], 1.0) == 3


def test_a_large_model_on_answer_only_rows_keeps_room_to_reason(example, monkeypatch):
    import tether.config.fit as fit

    model, parquet = example
    monkeypatch.setattr(fit, "compute_param_count", lambda _: 500_000_000)
    cfg = load_config(BYO, [f"model.path={model}", f"data.path={parquet}"])
    assert cfg.rollout.sampling.max_new_tokens == 512 and cfg.train.lr == 1e-6 and cfg.sft.lr == 1e-5


def test_a_forgotten_model_path_is_one_clear_error_before_anything_is_built(example):
    _, parquet = example
    with pytest.raises(ConfigError, match=r"model.path is not set: .*train.lr.*set model.path=<a local Hugging Face "):
        load_config(BYO, [f"data.path={parquet}"])


def test_the_cli_says_model_path_not_max_new_tokens(example, tmp_path):
    """Before: a tiny Llama was built and the run failed with a misleading max_new_tokens message."""
    from typer.testing import CliRunner

    from tether.cli import app

    _, parquet = example
    r = CliRunner().invoke(app, ["train", str(BYO), f"data.path={parquet}", "--run-dir", str(tmp_path / "r")])
    assert r.exit_code == 2 and "model.path is not set" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r").exists()


def test_a_tiny_model_without_room_names_model_path():
    """Numbers instead of auto, still no model.path: the message names the tiny model and model.path."""
    from tether.errors import UserError
    from tether.rollout.single import compute_prompt_limit

    cfg = load_config(None, ["rollout.sampling.max_new_tokens=600"])
    with pytest.raises(UserError, match=r"model.path is not set, so tether built its tiny model .*512 positions.*"
                                        r"leaves no room for a prompt: set model.path="):
        compute_prompt_limit(cfg, cfg.model.tiny.max_position_embeddings)


def test_model_path_that_is_not_a_model_and_an_environment_task_are_refused(example, tmp_path):
    model, parquet = example
    with pytest.raises(ConfigError, match=r"model.path=.*: not a model directory \(no config.json\)"):
        load_config(BYO, [f"model.path={tmp_path}", f"data.path={parquet}"])
    with pytest.raises(ConfigError, match=r"data.task='calc' is an environment: `auto` settings read single-turn"):
        load_config(BYO, [f"model.path={model}", "data.task=calc"])
