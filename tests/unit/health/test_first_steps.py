"""First-steps findings (tether.health.first_steps) in `tether doctor`: why a reward is flat, each
with its fix; a run that learns has none."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from tether.config import load_doctor_config
from tether.health.doctor import examine as _examine, format_report
from tether.health.first_steps import find_first_step_findings


def examine(run: Path) -> dict:
    return _examine(run, load_doctor_config(run))


def make_run(root: Path, rows: list[dict], config: dict | None = None, summary: dict | None = None,
             samples: list[dict] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    (root / "config.yaml").write_text(yaml.safe_dump(config or {}))
    if summary is not None:
        (root / "summary.json").write_text(json.dumps(summary))
    if samples:
        (root / "samples").mkdir()
        with gzip.open(root / "samples" / "step_000001.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
    return root


HEALTHY = {"reward/mean": 0.5, "reward/std": 0.4, "frac_zero_variance_groups": 0.2, "truncation_rate": 0.0}
MV = {"reward": {"components": [{"name": "math_verify"}]}, "rollout": {"sampling": {"max_new_tokens": 16},
                                                                       "max_prompt_tokens": 32}}


def names(run: Path) -> list[str]:
    return [f.name for f in find_first_step_findings(run)]


def test_a_run_that_learns_has_no_first_step_finding(tmp_path):
    run = make_run(tmp_path / "ok", [HEALTHY] * 5, MV, {"prompts_skipped": {"training": 0, "held_out": 0}},
                   [{"completion": "The answer is 4", "answer": "4", "reward": 1.0}] * 6)
    assert names(run) == []
    rep = examine(run)
    assert rep["first_steps"] == [] and "first steps" not in format_report(rep)


def test_every_reward_zero_with_exact_answers_blames_the_reward_function(tmp_path):
    """The own-data case: words scored by math_verify; the samples hold a completion equal to the answer."""
    samples = [{"completion": "dcba", "answer": "dcba", "reward": 0.0}] + \
              [{"completion": "xyz", "answer": "abc", "reward": 0.0}] * 5
    run = make_run(tmp_path / "r", [{"reward/mean": 0.0, "reward/std": 0.0, "frac_zero_variance_groups": 1.0}] * 4,
                   MV, samples=samples)
    found = {f.name: f for f in find_first_step_findings(run)}
    assert set(found) == {"all_rewards_zero", "answers_unparsed"}
    assert "equal to the gold answer ('dcba') 0" in found["all_rewards_zero"].fix and "exact_match" in found["all_rewards_zero"].fix
    assert "math_verify) finds no answer in 6 of 6" in found["answers_unparsed"].message
    text = format_report(examine(run))
    assert "first steps (each with its fix):" in text and "fix: " in text and "HEALTHY" not in text.replace("UNHEALTHY", "")


def test_every_reward_zero_without_any_right_answer_points_at_a_cold_start(tmp_path):
    run = make_run(tmp_path / "r", [{"reward/mean": 0.0, "reward/std": 0.0}] * 3,
                   {"reward": {"components": [{"name": "exact_match"}]}},
                   samples=[{"completion": "nope", "answer": "yes", "reward": 0.0}] * 5)
    (f,) = find_first_step_findings(run)
    assert f.name == "all_rewards_zero" and "SFT" in f.fix


def test_most_groups_without_variance(tmp_path):
    run = make_run(tmp_path / "r", [dict(HEALTHY, **{"frac_zero_variance_groups": 0.9})] * 4, MV)
    (f,) = find_first_step_findings(run)
    assert f.name == "zero_variance_groups" and "90%" in f.message and "rollout.n" in f.fix
    solved = make_run(tmp_path / "s", [dict(HEALTHY, **{"frac_zero_variance_groups": 0.95, "reward/mean": 0.99})] * 3, MV)
    assert "harder" in find_first_step_findings(solved)[0].fix


def test_truncated_completions_and_skipped_prompts(tmp_path):
    run = make_run(tmp_path / "r", [dict(HEALTHY, truncation_rate=0.8)] * 3, MV,
                   {"prompts_skipped": {"training": 120, "held_out": 3}})
    found = {f.name: f for f in find_first_step_findings(run)}
    assert set(found) == {"completions_truncated", "prompts_skipped"}
    assert "max_new_tokens=16" in found["completions_truncated"].message
    assert "123 prompts" in found["prompts_skipped"].message and "max_prompt_tokens" in found["prompts_skipped"].fix


def test_answers_the_reward_cannot_read(tmp_path):
    samples = [{"completion": "I think it is some words", "answer": "7", "reward": 0.0}] * 8
    run = make_run(tmp_path / "r", [dict(HEALTHY, **{"reward/mean": 0.05})] * 3, MV, samples=samples)
    (f,) = find_first_step_findings(run)
    assert f.name == "answers_unparsed" and "math_verify" in f.fix


def test_a_prompt_format_mismatch(tmp_path):
    run = make_run(tmp_path / "r", [dict(HEALTHY, **{"rollout/prompt_format_mismatch": 1.0})] * 3, MV,
                   {"model_prompt_format": "raw"})
    (f,) = find_first_step_findings(run)
    assert f.name == "prompt_format_mismatch" and "trained on raw text prompts" in f.message
    assert "client.completions.create" in f.fix


def test_an_sft_run_with_empty_targets(tmp_path):
    run = make_run(tmp_path / "sft", [{"sft/loss": 1.0}] * 3, {}, {"kind": "sft", "sft_empty_targets": 0.75})
    (f,) = find_first_step_findings(run)
    assert f.name == "sft_target_empty" and "75%" in f.message and "`completion` column" in f.fix


@pytest.mark.slow
def test_own_data_with_word_answers_and_math_verify_is_explained(tmp_path):
    """The documented own-data command on word answers (math_verify cannot read them): before, the
    run was flat and `tether doctor` said HEALTHY; now it names the cause and the fix."""
    import datasets
    from typer.testing import CliRunner

    from tether.cli import app
    from tether.policy.families import build_family_model, family_shape
    from tether.tasks import make_problems

    problems = make_problems("reverse", 40, 0)
    rows = [{"prompt": [{"role": "user", "content": p["prompt"]}], "reward_model": {"ground_truth": p["answer"]}}
            for p in problems]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "t.parquet"))
    model = build_family_model("qwen2", tmp_path / "q", [p["prompt"] + p["answer"] for p in problems],
                               family_shape(hidden_size=32, intermediate_size=64))
    byo = Path(__file__).resolve().parents[3] / "configs" / "byo.yaml"
    small = ["train.steps=3", "rollout.n=4", "rollout.problems_per_step=4", "eval.samples=1", "eval.problems=4",
             "reward.isolation=inline", "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0",
             "run.threads=1"]
    rd = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", str(byo), f"model.path={model}", f"data.path={tmp_path / 't.parquet'}",
                                 *small, "--run-dir", str(rd)])
    assert r.exit_code == 0, r.output
    assert json.loads((rd / "summary.json").read_text())["prompt_format"] == "chat"
    found = names(rd)
    assert "all_rewards_zero" in found and "answers_unparsed" in found
    r = CliRunner().invoke(app, ["doctor", str(rd)])
    assert "answers_unparsed" in r.output and "exact_match" in r.output
