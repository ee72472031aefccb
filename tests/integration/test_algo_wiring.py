"""Every algorithm option is selectable from the config and runs through the real RL step."""

import json

import pytest
import torch

from tether.config import load_config
from tether.recipes.rl import run_rl

BASE = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "logging.samples_per_step=0", "run.threads=1", "checkpoint.every=0", "eval.samples=1", "eval.problems=2",
        "data.task=reverse", "data.train_size=16", "data.eval_size=2", "train.steps=2", "train.lr=1e-3",
        "rollout.problems_per_step=2", "rollout.n=4", "rollout.sampling.max_new_tokens=5",
        "eval.sampling.max_new_tokens=5", "reward.isolation=inline",
        "reward.components=[{name: 'tests.integration.flaky_reward:letter_fraction'}]"]

CASES = {
    "grpo_seq_mean": ["algo.agg.mode=seq_mean_token_mean"],
    "dr_grpo_constant_norm": ["algo.advantage.name=dr_grpo", "algo.agg.mode=constant_norm"],
    "rloo_seq_sum": ["algo.advantage.name=rloo", "algo.agg.mode=seq_mean_token_sum"],
    "reinforce_pp_kl_reward": ["algo.advantage.name=reinforce_pp", "algo.kl.coef=0.05", "algo.kl.placement=reward",
                               "algo.kl.estimator=k1"],
    "reinforce_pp_baseline": ["algo.advantage.name=reinforce_pp_baseline"],
    "remax": ["algo.advantage.name=remax"],
    "gae_ppo": ["algo.advantage.name=gae", "algo.epochs=2", "algo.mini_batches=2"],
    "gspo": ["algo.policy_loss.name=gspo", "algo.policy_loss.clip_low=3e-4", "algo.policy_loss.clip_high=4e-4",
             "algo.agg.mode=seq_mean_token_mean"],
    "cispo": ["algo.policy_loss.name=cispo", "algo.policy_loss.clip_low=10", "algo.policy_loss.clip_high=0.2"],
    "dual_clip_k3_loss": ["algo.policy_loss.dual_clip_c=3", "algo.kl.coef=0.04", "algo.kl.estimator=k3"],
    "k3_iw_adaptive_reset": ["algo.kl.coef=0.01", "algo.kl.estimator=k3_iw", "algo.kl.adaptive_target=0.1",
                             "algo.kl.reset_every=1"],
    "k2_entropy_bonus": ["algo.kl.coef=0.01", "algo.kl.estimator=k2", "algo.entropy_coef=0.01"],
    "tis_sequence_mask": ["algo.correction.mode=mask", "algo.correction.level=sequence",
                          "algo.correction.threshold_low=0.5", "algo.correction.off_policy_mask_delta=0.5"],
    "no_correction": ["algo.correction.mode=none"],
    "dynamic_sampling_shaping": ["algo.dynamic_sampling.enable=true", "algo.dynamic_sampling.max_gen_batches=2",
                                 "algo.shaping.overlong_cache_len=2", "algo.shaping.length_penalty_coef=0.1",
                                 "algo.compact_filter={length: mask}"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_option_runs_and_reports(tmp_path, name):
    summary = run_rl(load_config(None, BASE + CASES[name]), tmp_path)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r for r in rows if "pg_loss" in r]
    assert len(steps) == 2 and summary["nonfinite_steps"] == 0
    for r in steps:
        assert r["pg_loss"] is not None and r["grad_norm"] is not None  # finite (nulls mark non-finite)
    if "kl.coef" in " ".join(CASES[name]) and "placement=reward" not in " ".join(CASES[name]):
        assert all("kl_loss" in r for r in steps)
    if name == "reinforce_pp_kl_reward":
        assert all("kl_reward" in r for r in steps)
    if name == "gae_ppo":
        assert all("value_loss" in r and r["optimizer_steps"] == 4 for r in steps)
    if name == "k3_iw_adaptive_reset":
        assert all(r.get("kl/reference_reset") == 1.0 for r in steps)
        ckpt = torch.load(sorted((tmp_path / "checkpoints").glob("step_*"))[-1] / "optimizer.pt", weights_only=False)
        assert ckpt["state"] == {}  # ProRL: the optimizer state is re-initialised with the reference
        assert steps[-1]["kl_coef"] != 0.01  # the controller moved beta
    if name == "tis_sequence_mask":
        assert all("off_policy_mask_frac" in r and "is_weight_mean" in r for r in steps)
    if name == "dynamic_sampling_shaping":
        assert all("dynamic_sampling/rounds" in r and "compact/masked_frac" in r for r in steps)


def test_zero_advantage_skip_gives_the_same_run(tmp_path):
    """Through the real RL step: with `train.skip_zero_advantage` (the default) the groups whose rewards
    are all equal run forward only, and the run is the one without it: the same samples and rewards
    at every step (which the weights decide after the first) and the same losses and gradient norms."""
    base = BASE + ["reward.components=[{name: 'tests.integration.flaky_reward:starts_with_letter'}]",
                   "rollout.n=2", "rollout.problems_per_step=6", "train.steps=3"]
    runs = {}
    for skip in ("true", "false"):
        run_rl(load_config(None, base + [f"train.skip_zero_advantage={skip}"]), tmp_path / skip)
        rows = [json.loads(line) for line in open(tmp_path / skip / "metrics.jsonl")]
        runs[skip] = [r for r in rows if "pg_loss" in r]
    assert any(0 < r["no_grad_token_frac"] < 1 for r in runs["true"])  # some groups were skipped, not all
    assert all("no_grad_token_frac" not in r for r in runs["false"])
    for a, b in zip(runs["true"], runs["false"]):
        assert a["frac_zero_variance_groups"] == b["frac_zero_variance_groups"]
        for k in ("reward/mean", "pg_loss", "entropy", "grad_norm", "clip_frac", "logp_gap_mean", "rollout_kl_k3"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
