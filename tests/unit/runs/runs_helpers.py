"""Tiny runs for the run-model tests: a 1-layer, 32-wide Llama on the reverse task, a few steps."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

TINY = {
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 256}},
    "data": {"task": "reverse", "train_size": 40, "eval_size": 4, "seed": 3},
    "sft": {"steps": 5, "lr": 3.0e-3, "batch_size": 8, "warmup_steps": 0},
    "rollout": {"n": 2, "problems_per_step": 2, "sampling": {"max_new_tokens": 4}},
    "train": {"steps": 3, "lr": 1.0e-3},
    "eval": {"samples": 1, "problems": 2, "sampling": {"max_new_tokens": 4}},
    "checkpoint": {"every": 2},
    "reward": {"isolation": "inline"},
    "logging": {"tensorboard": False, "progress": False, "samples_per_step": 0},
    "health": {"mode": "off"},
    "run": {"threads": 1},
}
LORA = {"r": 4, "alpha": 8}

runner = CliRunner()


def write_config(path: Path, **sections) -> Path:
    """TINY with `sections` merged in (one level deep), as YAML."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(data))
    return path


def tether(*args: str):
    """Run the `tether` command in this process; returns the click Result (exit_code, output)."""
    from tether.cli import app

    return runner.invoke(app, [str(a) for a in args])
