"""`tether pipeline` (SFT -> RL, one summary) and `tether compare-context` (Agent-R1's
context-management comparison) end to end with a tiny model, and the ordering they print."""

import json

from typer.testing import CliRunner

from tether.cli import app
from tether.recipes.pipeline import compute_ordering, format_ordering

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300", "model.tiny.max_position_embeddings=512",
        "logging.progress=false", "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0",
        "data.task=household", "data.train_size=16", "data.eval_size=3", "env.max_turns=3", "env.context.window=1",
        "sft.steps=3", "sft.batch_size=4", "sft.warmup_steps=1", "sft.demo_noise=0.5", "train.steps=1",
        "rollout.n=2", "rollout.problems_per_step=2", "rollout.sampling.max_new_tokens=6", "eval.samples=2",
        "eval.sampling.max_new_tokens=6"]


def test_ordering_is_best_first_and_prints_ties():
    runs = {"sliding_window": [{"final_accuracy": 0.5}, {"final_accuracy": 0.7}], "append": [{"final_accuracy": 0.7}],
            "summary": [{"final_accuracy": 0.2}]}
    order = compute_ordering(runs)
    assert [b for b, _ in order] == ["append", "sliding_window", "summary"]  # 0.7 > 0.6 > 0.2
    assert format_ordering([("a", 0.5), ("b", 0.5), ("c", 0.1)]) == "a (0.500) = b (0.500) > c (0.100)"


def test_pipeline_and_compare_context_commands(tmp_path):
    runner = CliRunner()
    cfg = tmp_path / "household.yaml"
    cfg.write_text("run: {name: hh}\n")
    r = runner.invoke(app, ["pipeline", str(cfg), *TINY, "--run-dir", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["kind"] == "pipeline" and summary["accuracy_lift"] == summary["final_accuracy"] - summary["baseline_accuracy"]
    assert (tmp_path / "p" / "sft" / "final_model").is_dir() and (tmp_path / "p" / "rl" / "metrics.jsonl").is_file()

    r = runner.invoke(app, ["compare-context", str(cfg), *TINY, "--run-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "ordering by final held-out pass@1:" in r.output
    comp = json.loads((tmp_path / "c" / "comparison.json").read_text())
    assert sorted(comp["ordering_final"]) == ["append", "sliding_window", "summary"]
    assert set(comp["by_builder"]) == {"append", "sliding_window", "summary"}
    for b in comp["by_builder"]:
        cfg_b = (tmp_path / "c" / f"{b}-s0" / "rl" / "config.yaml").read_text()
        assert f"builder: {b}" in cfg_b

    r = runner.invoke(app, ["compare-context", str(cfg), "--builders", "window"])
    assert r.exit_code == 2 and "unknown" in r.output
