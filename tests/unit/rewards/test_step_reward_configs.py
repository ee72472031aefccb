"""configs/step_rewards/*.yaml (docs/rewards.md, outcome-only vs step rewards on household): every arm
of each sweep block is a valid config, and the two RL arms differ only in the subgoal reward."""

from __future__ import annotations

from pathlib import Path

import yaml

from tether.config import load_config
from tether.sweep import load_sweep_config

DIR = Path(__file__).resolve().parents[3] / "configs" / "step_rewards"


def _arms(name, tmp_path):
    base, block = load_sweep_config(DIR / name)
    path = tmp_path / f"{name}.base.yaml"
    path.write_text(yaml.safe_dump(base))
    return block, [load_config(str(path), list(arm)) for arm in block["arms"]]


def test_step_reward_configs_validate_and_differ_only_in_the_reward(tmp_path):
    block, (sft,) = _arms("sft.yaml", tmp_path)
    assert block["command"] == "sft" and sft.data.task == "household"
    block, (outcome, step) = _arms("rl.yaml", tmp_path)
    assert block["command"] == "train" and len(block["seeds"]) >= 3
    assert outcome.data.task_kwargs["subgoal_reward"] == 0.0 and step.data.task_kwargs["subgoal_reward"] == 0.25
    assert outcome.env.credit == step.env.credit == "step" and outcome.model.path == step.model.path
    a, b = outcome.model_dump(), step.model_dump()
    a["data"]["task_kwargs"], b["data"]["task_kwargs"] = {}, {}
    assert a == b


def test_broadcast_arms_differ_only_in_the_reward(tmp_path):
    block, (outcome, step) = _arms("rl_broadcast.yaml", tmp_path)
    assert block["command"] == "train" and len(block["seeds"]) >= 3
    assert outcome.env.credit == step.env.credit == "broadcast" and outcome.algo.advantage.name == "grpo"
    assert outcome.data.task_kwargs["subgoal_reward"] == 0.0 and step.data.task_kwargs["subgoal_reward"] == 0.25
    a, b = outcome.model_dump(), step.model_dump()
    a["data"]["task_kwargs"], b["data"]["task_kwargs"] = {}, {}
    assert a == b
