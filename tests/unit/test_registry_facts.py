"""Registry entries carry facts; every registry name is checked when a config loads (exit 2,
one line, the nearest name) and a combination the facts rule out is refused."""

import pytest
from typer.testing import CliRunner

from tether.algos import ADVANTAGES
from tether.cli import app
from tether.config import ConfigError, load_config

runner = CliRunner()


def test_advantage_facts_replace_name_lists():
    assert ADVANTAGES.facts("gae").needs_critic and not ADVANTAGES.facts("grpo").needs_critic
    assert ADVANTAGES.facts("remax").needs_greedy_baseline
    assert {n for n in ADVANTAGES if ADVANTAGES.facts(n).group_relative} == {
        "grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "gigpo", "step_grpo"}
    assert {n for n in ADVANTAGES if not ADVANTAGES.facts(n).reads_token_rewards} == {
        "grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "remax"}


@pytest.mark.parametrize("override, nearest", [
    ("algo.advantage.name=grpoo", "'grpo'"), ("algo.policy_loss.name=ppo_clp", "'ppo_clip'"),
    ("algo.kl.estimator=k4", "Did you mean 'k"), ("data.task=revers", "'reverse'"),
    ("reward.components=[{name: exact_matc}]", "'exact_match'"), ("eval.best_of=logprb", "'logprob'"),
])
def test_unknown_registry_name_exits_2_with_the_nearest_name(tmp_path, override, nearest):
    r = runner.invoke(app, ["train", "configs/reverse.yaml", override, "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("tether: error")]
    assert len(errors) == 1 and nearest in errors[0] and override.split("=")[0] in errors[0]
    assert not (tmp_path / "run").exists()  # refused before a run directory or a model exists


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "remax"])
def test_kl_in_reward_with_a_sequence_score_estimator_is_refused(estimator):
    with pytest.raises(ConfigError, match="algo.kl.placement=reward .* reads only sequence scores"):
        load_config(None, [f"algo.advantage.name={estimator}", "algo.kl.coef=0.1", "algo.kl.placement=reward"])


def test_kl_in_reward_with_a_token_reward_estimator_is_accepted(tmp_path):
    cfg = load_config(None, ["algo.advantage.name=reinforce_pp", "algo.kl.coef=0.1", "algo.kl.placement=reward"])
    assert cfg.algo.kl.placement == "reward"
    r = runner.invoke(app, ["train", "configs/reverse.yaml", "algo.kl.coef=0.1", "algo.kl.placement=reward",
                            "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2 and "penalty would be dropped" in r.output
