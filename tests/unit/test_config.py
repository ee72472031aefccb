import pytest

from tether.config import ConfigError, dump_config, load_config


def test_defaults_validate():
    cfg = load_config(None)
    assert cfg.rollout.n == 8
    assert cfg.algo.advantage.name == "grpo"


def test_override_types_are_parsed():
    cfg = load_config(None, ["train.steps=7", "algo.kl.coef=0.04", "logging.tensorboard=false"])
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.algo.kl.coef == pytest.approx(0.04)
    assert cfg.logging.tensorboard is False


def test_unknown_key_suggests_nearest():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.stepz=3"])
    assert "train.stepz" in str(e.value)
    assert "did you mean 'train.steps'" in str(e.value)


def test_unknown_section_suggests_nearest():
    with pytest.raises(ConfigError, match="did you mean 'algo.advantage'"):
        load_config(None, ["algo.advantag.name=grpo"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"train\.lr: .*number"):
        load_config(None, ["train.lr=abc"])


def test_noop_combination_rejected():
    with pytest.raises(ConfigError, match="needs a reference policy"):
        load_config(None, ["algo.kl.coef=0.1", "algo.kl.reference=none"])
    with pytest.raises(ConfigError, match="reset_every does nothing"):
        load_config(None, ["algo.kl.reset_every=10"])
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_config(None, ["rollout.n=1"])


def test_yaml_file_and_roundtrip(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_text("train:\n  steps: 5\nrollout:\n  n: 4\n")
    cfg = load_config(p, ["rollout.n=6"])
    assert cfg.run.name == "exp"
    assert cfg.train.steps == 5 and cfg.rollout.n == 6
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(again) .model_dump() == cfg.model_dump()


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
