"""Prompt-format consistency (tether.rollout.prompt_format): every run records whether it trained
through the chat template, and the endpoint, `tether train`, `tether eval` and `tether doctor` say
so when a model meets prompts in the other format."""

from __future__ import annotations

import json

import pytest
import yaml

from tether.rollout.prompt_format import compute_prompt_format, read_trained_prompt_format


def test_the_format_of_a_run_and_of_a_model_directory(tmp_path):
    assert compute_prompt_format(False, [{"prompt": "x"}]) == "raw"
    assert compute_prompt_format(True, [{"prompt": "x"}]) == "chat"
    assert compute_prompt_format(False, [{"prompt": "x", "messages": [{"role": "user", "content": "x"}]}]) == "chat"
    assert compute_prompt_format(False, [], multi_turn=True) == "chat"
    run = tmp_path / "run"
    (run / "final_model").mkdir(parents=True)
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    assert read_trained_prompt_format(run / "final_model") is None  # not a tether run
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"task": "reverse", "chat": False}}))
    assert read_trained_prompt_format(run / "final_model") == "raw"
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"task": "hf", "chat": False}}))
    assert read_trained_prompt_format(run / "final_model") is None  # verl rows may be chat messages: the record says
    (run / "summary.json").write_text(json.dumps({"prompt_format": "chat"}))
    assert read_trained_prompt_format(run / "checkpoints" / "step_000002") == "chat"
    assert read_trained_prompt_format(None) is None


def test_the_endpoint_counts_requests_in_the_other_format(tmp_path, capsys):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    import tether.policy.prompt_format as pf
    from tether.config import SamplingConfig
    from tether.policy.families import build_family_model, family_shape
    from tether.policy.hf import load_policy
    from tether.serve.endpoint import RolloutServer

    pf._warned.clear()
    policy = load_policy(build_family_model("qwen2", tmp_path / "q", shape=family_shape(hidden_size=32, intermediate_size=64)))
    with RolloutServer(policy, SamplingConfig(max_new_tokens=2), prompt_format="chat") as s:
        client = openai.OpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
        for _ in range(2):
            client.completions.create(model="tether", prompt="1+1=", max_tokens=2)
        client.chat.completions.create(model="tether", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
        client.completions.create(model="tether", prompt=[1, 2, 3], max_tokens=2)  # token ids: the caller's format
        assert s.format_requests == {"chat": 1, "raw": 2} and s.format_mismatches == 2
    out = capsys.readouterr().out
    assert out.count("WARNING: prompt format mismatch: the agent (POST /v1/completions) uses raw text prompts") == 1
    assert "client.chat.completions.create(messages=" in out


TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
        "data.train_size=32", "data.eval_size=4", "eval.samples=1", "rollout.n=2", "rollout.problems_per_step=2",
        "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0", "run.threads=1",
        "reward.isolation=inline"]


@pytest.mark.slow
def test_a_raw_prompt_model_met_through_the_chat_template_is_warned_everywhere(tmp_path):
    """SFT on raw prompts; then RL and an evaluation through the chat template: both warn at the
    start, the RL steps carry the mismatch, and `tether doctor` names it with the fix."""
    from typer.testing import CliRunner

    from tether.cli import app

    runner = CliRunner()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: {name: fmt}\n")
    sft = tmp_path / "sft"
    r = runner.invoke(app, ["sft", str(cfg), "data.task=reverse", "sft.steps=2", *TINY, "--run-dir", str(sft)])
    assert r.exit_code == 0, r.output
    assert json.loads((sft / "summary.json").read_text())["prompt_format"] == "raw"

    r = runner.invoke(app, ["eval", str(sft), "data.chat=true"])
    assert r.exit_code == 0, r.output
    assert "WARNING: prompt format mismatch: this evaluation uses the chat template" in r.output
    assert "trained on raw text prompts" in r.output
    assert "prompt_format_warning" in json.loads((sft / "eval.json").read_text())

    rl = tmp_path / "rl"
    r = runner.invoke(app, ["train", str(cfg), "data.task=reverse", f"model.path={sft / 'final_model'}", "data.chat=true",
                            "train.steps=2", *TINY, "--run-dir", str(rl)])
    assert r.exit_code == 0, r.output
    assert r.output.index("prompt format mismatch: this run uses the chat template") < r.output.index("baseline_accuracy")
    rows = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()]
    assert [row["rollout/prompt_format_mismatch"] for row in rows if "pg_loss" in row] == [1.0, 1.0]
    summary = json.loads((rl / "summary.json").read_text())
    assert summary["prompt_format"] == "chat" and summary["model_prompt_format"] == "raw"
    r = runner.invoke(app, ["doctor", str(rl)])
    assert "prompt_format_mismatch" in r.output and "fix: " in r.output
