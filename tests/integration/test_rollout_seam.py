"""The one rollout seam (tether.rollout): every command works on an environment task's run.

A tiny SFT -> RL pipeline on `qa` (the README demo's task: multi-turn, a search tool), then
`tether eval` and `tether plan` on its run directory, as a user would type them. Before the
seam both looked the task up among single-turn tasks and ended in a traceback."""

import json

import pytest
from typer.testing import CliRunner

from tether.cli import app
from tether.config import load_config
from tether.recipes.pipeline import run_pipeline
from tether.rollout import make_rollout

TINY = ["model.tiny.hidden_size=48", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=96", "model.tiny.vocab_size=600", "model.tiny.max_position_embeddings=320",
        "logging.progress=false", "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0"]
QA = TINY + ["data.task=qa", "data.train_size=16", "data.eval_size=4", "env.max_turns=3", "env.max_context_tokens=290",
             "sft.steps=4", "sft.lr=3e-3", "sft.batch_size=8", "sft.warmup_steps=1", "train.steps=1",
             "rollout.n=2", "rollout.problems_per_step=2", "rollout.sampling.max_new_tokens=24",
             "eval.samples=4", "eval.sampling.max_new_tokens=24", "logging.samples_per_step=0"]


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    summary = run_pipeline(load_config(None, QA), root, log=lambda *_: None)
    return root, summary


def test_make_rollout_picks_the_kind_once():
    assert make_rollout(load_config(None, ["data.task=qa"])).kind == "multi-turn environment"
    assert make_rollout(load_config(None, ["data.task=reverse"])).kind == "single-turn"


def test_eval_on_an_env_run_reproduces_its_final_pass_at_1(qa_run):
    root, summary = qa_run
    r = CliRunner().invoke(app, ["eval", str(root), "--no-plot"])  # the pipeline dir: eval resolves <root>/rl
    assert r.exit_code == 0, r.output
    assert "multi-turn environment" in r.output  # says which rollout kind it ran
    payload = json.loads((root / "rl" / "eval.json").read_text())
    assert payload["rollout"] == "multi-turn environment" and payload["task"] == "qa"
    # same checkpoint, same seed, same rollout as the run's own final evaluation: the same number
    assert payload["metrics"]["eval/pass@1"] == pytest.approx(summary["final_accuracy"], abs=1e-9)
    episode_stops = {"done", "max_turns", "context_overflow", "timeout", "env_error", "parse_error"}
    assert payload["samples"] and {row["stop"] for row in payload["samples"]} <= episode_stops  # episodes, not completions


def test_plan_on_an_env_run_pilots_with_real_episodes(qa_run):
    root, _ = qa_run
    r = CliRunner().invoke(app, ["plan", str(root), "--budget", "64", "--pilot-problems", "3", "--pilot-samples", "2",
                                 "--min-steps", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert out["pilot"]["rollout"] == "multi-turn environment" and out["pilot"]["problems"] == 3
    assert 0 < out["pilot"]["tokens_per_rollout"]
    assert set(out["pilot"]["pass_rates"]) and all(0 <= v <= 1 for v in out["pilot"]["pass_rates"].values())
