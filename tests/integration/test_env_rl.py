"""CPU smoke test of the agentic loop: SFT on the calc expert's conversations, then 2 RL steps of
multi-turn tool-using rollouts with a tiny model, through the real recipes."""

import json
import math

from tether.config import load_config
from tether.recipes.rl import run_rl
from tether.recipes.sft import run_sft

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=128", "model.tiny.vocab_size=600", "model.tiny.max_position_embeddings=1024",
        "logging.progress=false", "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0"]


def rows(path):
    return [json.loads(line) for line in open(path / "metrics.jsonl")]


def test_sft_then_two_rl_steps_on_calc(tmp_path):
    cfg = load_config(None, TINY + [
        "data.task=calc", "data.train_size=64", "data.eval_size=4", "env.max_turns=3",
        "sft.steps=8", "sft.lr=3e-3", "sft.batch_size=8", "sft.warmup_steps=1",
        "train.steps=2", "train.lr=1e-3", "rollout.n=4", "rollout.problems_per_step=2",
        "rollout.sampling.max_new_tokens=32", "eval.samples=2", "eval.sampling.max_new_tokens=32",
        "algo.advantage.name=gigpo", "algo.compact_filter={max_turns: mask, parse_error: keep}"])
    policy, sft = run_sft(cfg, tmp_path / "sft")
    losses = [r["sft/loss"] for r in rows(tmp_path / "sft")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]

    summary = run_rl(cfg, tmp_path / "rl", policy=policy)
    steps = [r for r in rows(tmp_path / "rl") if "pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and summary["nonfinite_steps"] == 0
    for r in steps:
        assert math.isfinite(r["pg_loss"]) and math.isfinite(r["grad_norm"]) and r["batch/loss_tokens"] > 0
        stop_fracs = [v for k, v in r.items() if k.startswith("env/stop/")]
        assert len(stop_fracs) == 6 and abs(sum(stop_fracs) - 1.0) < 1e-9
        assert 1 <= r["env/turns_mean"] <= 3 and r["env/episodes"] == 8
        assert r["rollout/tokenization_drift_count"] == 0 and r["rollout/template_prefix_preserving"] == 1
        assert r["compact/masked_frac"] == r["compact/max_turns_frac"]
        assert 0 <= r["env/success_rate"] <= 1 and 0 <= r["reward/mean"] <= 1
    assert 0 <= summary["final_accuracy"] <= 1 and "eval/turns_mean" in summary["final_eval"]
    samples = list((tmp_path / "rl" / "samples").glob("step_*.jsonl.gz"))
    assert samples
