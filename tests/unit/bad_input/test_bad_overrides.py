"""`key.path=value` overrides on the command line (tether.config_text): list items by index, values
that open a YAML list or mapping but do not parse, keys that step into a scalar, and user task
factories that cannot be called (docs/errors.md, "Command-line overrides")."""

from __future__ import annotations

import pytest
from bad_input_helpers import params, write

OVERRIDE_CASES = [  # (id, override, field, fragment)
    ("list index out of range", "reward.components.3.name=format", "reward.components", "index 3 is out of range"),
    ("list addressed by a name", "reward.components.name=format", "reward.components", "address an item by its index"),
    ("unclosed list value", "reward.components=[{name: exact_match", "reward.components", "is not valid YAML"),
    ("unclosed mapping value", "data.task_kwargs={digits: 2", "data.task_kwargs", "is not valid YAML"),
    ("key through a number", "train.lr.warmup=3", "train.lr", "Input should be a valid number"),
    ("blank key segment", "train. .steps=3", "train. .steps", "empty key segment"),
    ("unknown item key", "reward.components.0.wieght=2", "reward.components.0.wieght", "did you mean"),
    ("item value of the wrong type", "reward.components.0.weight=heavy", "reward.components.0.weight",
     "valid number"),
    ("task factory that needs arguments", "data.task=builtins:open", "data.task='builtins:open'",
     "calling the factory failed"),
]


@pytest.mark.parametrize("override, field, fragment", params(OVERRIDE_CASES))
def test_override(bad_input, tmp_path, override, field, fragment):
    cfg = write(tmp_path / "c.yaml", "train:\n  steps: 1\n")
    bad_input.cli(["train", cfg, override, "--run-dir", str(tmp_path / "run")], field, fragment)
    assert not (tmp_path / "run").exists()


def test_override_parser_alone(bad_input):
    from tether.config_text import ConfigError, apply_overrides

    bad_input.call(apply_overrides, {"pipeline": {"stages": []}}, ["pipeline.stages.0.kind=sft"],
                   field="pipeline.stages", fragments=["has 0 item(s)"], exc=ConfigError)


def test_list_items_and_dates_are_read_as_meant(bad_input):
    """What the refusals above point to works: an item by index (from the defaults), a date-like name."""
    from tether.config import ConfigError, load_config

    cfg = load_config(None, ["reward.components.0.weight=2", "run.name=2024-01-01",
                             "reward.components.0.kwargs.ignore_case=true"])
    assert cfg.reward.components[0].weight == 2.0 and cfg.reward.components[0].kwargs == {"ignore_case": True}
    assert cfg.run.name == "2024-01-01"
    bad_input.call(load_config, None, ["reward.components.1.weight=2"], field="reward.components", exc=ConfigError)
