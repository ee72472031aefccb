"""The environment configs in configs/: each starts with the command that runs it, validates,
names a registered environment and builds its problems (held-out split included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.config import load_config
from tether.envs import sandbox
from tether.envs.sandbox_backends import ENV_VAR
from tether.rollout import is_episode_task
from tether.train.setup import setup_problems

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ENV_CONFIGS = ["household.yaml", "shop.yaml", "qa.yaml", "codefix.yaml", "calc.yaml", "multitask.yaml"]


@pytest.mark.parametrize("name", ENV_CONFIGS)
def test_env_config_runs_as_documented(name, monkeypatch):
    if name == "codefix.yaml" and sandbox._probe("bwrap") is not None:
        monkeypatch.setenv(ENV_VAR, "rlimits")  # without bubblewrap the code environment needs the opt-in
    path = CONFIGS / name
    if not path.is_file():
        pytest.skip(f"{name} not shipped")
    first = path.read_text().splitlines()[0]
    assert first.startswith("# tether ") and f"configs/{name}" in first
    cfg = load_config(path)
    assert is_episode_task(cfg.data.task) and cfg.sft.demo_noise > 0
    train, held = setup_problems(cfg.data)
    assert len(train) == cfg.data.train_size and len(held) == cfg.data.eval_size
    assert cfg.rollout.sampling.max_new_tokens == cfg.eval.sampling.max_new_tokens


def test_the_demo_is_agentic_and_the_single_turn_demo_stays_runnable():
    from tether.recipes.demo import demo_config_path

    demo = load_config(demo_config_path())
    assert is_episode_task(demo.data.task) and demo.sft.demo_noise > 0 and demo.checkpoint.every > 0
    assert demo.env.max_turns > 1  # multi-turn, tool-using (qa's `search`)
    reverse = CONFIGS / "reverse.yaml"
    assert reverse.read_text().splitlines()[0].startswith("# tether pipeline configs/reverse.yaml")
    cfg = load_config(reverse)
    assert cfg.data.task == "reverse" and not is_episode_task(cfg.data.task)
    train, held = setup_problems(cfg.data)
    assert len(train) == cfg.data.train_size and len(held) == cfg.data.eval_size
