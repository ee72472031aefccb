"""Step caps on reward components (`max_steps`, `at_max_steps`; tether.rewards.cap): a learned
reward is paid for at most N RL steps, then the run stops there or the component is dropped."""

from __future__ import annotations

import json

import pytest

from tether.config import ConfigError, load_config
from tether.rewards.cap import apply_reward_caps, reward_cap_metrics, stops_run
from tether.settings import RunSettings

RM = "{name: reward_stubs:constant, kwargs: {value: 0.5}"


def _cfg(extra: str, more: list[str] = ()):
    return load_config(None, ["reward.components=[{name: exact_match}, " + RM + extra + "}]", *more])


def test_stop_fires_at_the_cap_and_not_before(capsys):
    settings = RunSettings(_cfg(", max_steps: 3"))
    assert apply_reward_caps(settings, 0) == [] and apply_reward_caps(settings, 2) == []
    events = apply_reward_caps(settings, 3)
    assert [(e["component"], e["action"], e["step"], e["max_steps"]) for e in events] == [
        ("reward_stubs:constant", "stop", 3, 3)]
    assert stops_run(events) and not stops_run([])
    assert reward_cap_metrics(events) == {"reward/capped/reward_stubs:constant": 1.0}
    assert "paid for 3 steps (max_steps=3): stopping the run" in capsys.readouterr().out
    assert [c.weight for c in settings.config.reward.components] == [1.0, 1.0]  # stop leaves the weights alone
    assert settings.drain() == []


def test_drop_sets_the_weight_to_zero_once():
    cfg = _cfg(", weight: 0.5, max_steps: 2, at_max_steps: drop")
    settings = RunSettings(cfg)
    assert apply_reward_caps(settings, 1, verbose=False) == []
    events = apply_reward_caps(settings, 2, verbose=False)
    assert [(e["action"], e["weight"]) for e in events] == [("drop", 0.5)] and not stops_run(events)
    assert [c.weight for c in settings.config.reward.components] == [1.0, 0.0]
    assert [c.weight for c in cfg.reward.components] == [1.0, 0.5]  # a run-settings change: the config stays
    assert apply_reward_caps(settings, 3, verbose=False) == []  # dropped already: no second event
    assert settings.config.reward.components[1].kwargs == {"value": 0.5}  # only the weight changed
    [change] = settings.drain()  # logged once, as the run's settings.jsonl records it
    assert (change["step"], change["path"], change["source"]) == (2, "reward.components", "reward cap")
    assert [c["weight"] for c in change["new"]] == [1.0, 0.0]


@pytest.mark.parametrize("bad", [", max_steps: 0", ", max_steps: -5", ", max_steps: 2, at_max_steps: halt"])
def test_bad_cap_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="max_steps|at_max_steps"):
        _cfg(bad)


TINY_RL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
           "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
           "logging.samples_per_step=0", "run.threads=1", "checkpoint.every=0", "eval.samples=1", "eval.problems=2",
           "data.task=reverse", "data.train_size=16", "data.eval_size=2", "train.steps=4", "eval.every=0",
           "rollout.problems_per_step=2", "rollout.n=2", "rollout.sampling.max_new_tokens=4",
           "eval.sampling.max_new_tokens=4", "reward.isolation=inline"]


@pytest.mark.parametrize("action", ["stop", "drop"])
def test_rl_run_honours_the_cap(tmp_path, action):
    """stop: the run ends at step 2 of 4 with an evaluation there; drop: all 4 steps run, the
    component is logged as capped at step 2 and pays nothing on steps 3-4."""
    from tether.recipes.rl import run_rl

    cfg = _cfg(f", max_steps: 2, at_max_steps: {action}", TINY_RL)
    summary = run_rl(cfg, tmp_path / "run")
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
    assert [(e["step"], e["action"]) for e in summary["reward_caps"]] == [(2, action)]
    assert rows[2]["reward/capped/reward_stubs:constant"] == 1.0
    assert not any("reward/capped/reward_stubs:constant" in r for s, r in rows.items() if s != 2)
    if action == "stop":
        assert summary["steps"] == 2 and not summary["interrupted"]
        assert "eval/pass@1" in rows[2] and summary["final_accuracy"] is not None
    else:
        assert summary["steps"] == 4
        # exact_match is 0 or 1; the constant 0.5 is in the total up to the cap and not after it
        for step in (1, 2):
            assert rows[step]["reward/total/mean"] == pytest.approx(rows[step]["reward/exact_match/mean"] + 0.5)
        for step in (3, 4):
            assert rows[step]["reward/total/mean"] == pytest.approx(rows[step]["reward/exact_match/mean"])
        changes = [json.loads(x) for x in (tmp_path / "run" / "settings.jsonl").read_text().splitlines()]
        assert [(c["step"], c["path"], c["source"]) for c in changes] == [(2, "reward.components", "reward cap")]
