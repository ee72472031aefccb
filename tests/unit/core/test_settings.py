"""The frozen config and the run settings (tether.section, tether.settings): nothing assigns into a
config during a run; what changes is an override that is logged, checkpointed and restored."""

from __future__ import annotations

import io

import pytest
import torch
from pydantic import ValidationError

from tether.config import RewardComponentConfig, TetherConfig, load_config
from tether.settings import RunSettings


def test_a_validated_config_is_frozen_all_the_way_down():
    cfg = load_config(None, ["algo.kl.coef=0.01"])
    for section, field, value in ((cfg, "train", None), (cfg.algo, "epochs", 2), (cfg.algo.kl, "coef", 0.5),
                                  (cfg.rollout.sampling, "temperature", 0.3), (cfg.health, "mode", "auto"),
                                  (cfg.dist, "max_staleness", 1), (cfg.pipeline, "stages", [])):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(section, field, value)


def test_a_change_is_an_override_the_config_in_force_shows():
    cfg = TetherConfig()
    s = RunSettings(cfg)
    assert s.config is cfg and s.set("algo.kl.coef", 0.05, source="health", step=3) == 0.0
    assert s.config.algo.kl.coef == 0.05 and cfg.algo.kl.coef == 0.0  # the run's own config never changes
    assert s.config.algo.kl.estimator == cfg.algo.kl.estimator and s.config.rollout is cfg.rollout  # the rest shared
    assert s.drain() == [{"step": 3, "path": "algo.kl.coef", "old": 0.0, "new": 0.05, "source": "health"}]
    assert s.drain() == []
    assert s.set("algo.kl.coef", 0.05, source="health") == 0.05 and s.drain() == []  # no change: no event
    s.set("algo.kl.coef", 0.0, source="health: revert")
    assert s.overrides == {} and s.config.model_dump() == cfg.model_dump()  # back to the run's value: no override


def test_setting_a_section_replaces_the_overrides_inside_it():
    s = RunSettings(TetherConfig())
    s.set("rollout.sampling.temperature", 0.5, source="a")
    s.set("rollout.sampling", s.config.rollout.sampling.model_copy(update={"max_new_tokens": 7}), source="b")
    assert list(s.overrides) == ["rollout.sampling"]
    assert (s.config.rollout.sampling.temperature, s.config.rollout.sampling.max_new_tokens) == (0.5, 7)
    with pytest.raises(KeyError, match="no field 'tempreature'"):
        s.set("rollout.sampling.tempreature", 0.5, source="typo")


def test_overrides_survive_a_checkpoint_as_plain_data():
    cfg = TetherConfig()
    s = RunSettings(cfg)
    comps = [*cfg.reward.components, RewardComponentConfig(name="format", weight=0.0)]
    s.set("reward.components", comps, source="reward cap")
    s.set("algo.epochs", 1, source="health")
    s.set("algo.correction.threshold_low", 0.5, source="health")  # valid only with mode=mask: set next
    s.set("algo.correction.mode", "mask", source="health")
    buf = io.BytesIO()
    torch.save({"settings": s.state_dict()}, buf)  # what a checkpoint's trainer_state.pt holds
    buf.seek(0)
    resumed = RunSettings(cfg)
    resumed.load_state_dict(torch.load(buf, weights_only=True)["settings"])
    assert resumed.config.model_dump() == s.config.model_dump()
    assert isinstance(resumed.config.reward.components[1], RewardComponentConfig)
    assert list(resumed.overrides) == list(s.overrides)  # the order they were made in
    resumed.load_state_dict(None)  # a checkpoint without run settings: the config as it was
    assert resumed.config.model_dump() == cfg.model_dump()
