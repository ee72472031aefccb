"""The public Python API (src/tether/__init__.py): the names the README documents exist, the
README's ```python example runs as written (and docs/api.md's), and the CLI's train/sft go through it."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_the_documented_names_are_importable_from_tether():
    import tether

    for name in ("load_config", "sft", "train", "evaluate", "open_run", "Run", "Env", "RewardFn", "Rollout",
                 "export", "doctor", "show"):
        assert getattr(tether, name) is not None, name
    assert {"kind", "path"} <= set(tether.Run.__dataclass_fields__) and {"config", "summary", "result_model"} <= set(dir(tether.Run))
    with pytest.raises(AttributeError):
        tether.no_such_name  # noqa: B018


def test_tether_train_stays_the_api_function_after_the_engine_package_is_imported(tmp_path, monkeypatch):
    """`tether/train/` (the engine) shares its name with `tether.train(cfg)`: importing the engine (as any
    run does: tether.sft first, then tether.train) must leave the function callable and the package usable."""
    import tether
    import tether.train.setup  # binds the package on `tether`, as every run's import of the engine does
    from tether.api import training

    calls = []
    monkeypatch.setattr(training, "train", lambda *a, **k: calls.append((a, k)) or "run")
    assert tether.train("cfg", "runs/x", resume=True) == "run" and calls == [(("cfg", "runs/x"), {"resume": True})]
    assert tether.train.setup.setup_problems is not None and callable(tether.sft)


def test_a_user_reward_function_satisfies_the_protocol():
    import tether

    def score(text, task, **kwargs):
        return float(text == task["answer"])

    assert isinstance(score, tether.RewardFn)


def test_load_config_takes_a_path_a_packaged_name_or_a_config(tmp_path):
    import tether
    from tether.config import ConfigError

    cfg = tether.load_config(ROOT / "configs" / "reverse.yaml", ["sft.steps=3"])
    assert cfg.sft.steps == 3 and cfg.data.task == "reverse"
    assert tether.load_config("demo", ["train.steps=2"]).train.steps == 2  # shipped inside the package
    assert tether.load_config(cfg, ["sft.steps=4"]).sft.steps == 4 and cfg.sft.steps == 3
    with pytest.raises(ConfigError, match="no packaged config"):
        tether.load_config("no-such-config")


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path, monkeypatch):
    """The README's Python block, as written, from a fresh folder holding the config it names."""
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "README.md has no ```python block"
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "reverse.yaml", tmp_path / "configs" / "reverse.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102 - the documented example itself
    run, metrics = scope["run"], scope["metrics"]
    assert run.kind == "sft" and run.result_model() == Path("runs/readme-sft/final_model")
    assert 0.0 <= metrics["eval/pass@1"] <= 1.0 and scope["again"].kind == "sft"
    assert (tmp_path / "runs" / "readme-sft" / "eval.json").is_file()


def test_docs_api_examples_run(tmp_path, monkeypatch):
    """docs/api.md's examples run too (on a smaller model: its first block sets tiny sizes)."""
    blocks = python_blocks(ROOT / "docs" / "api.md")
    assert blocks
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {i + 1}", "exec"), scope)  # noqa: S102
    assert scope["run"].kind == "sft" and os.path.isdir(scope["run"].result_model())
