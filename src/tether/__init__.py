"""tether: reinforcement fine-tuning of LLMs and LLM agents.

The Python API (the `tether` command is a thin layer over it):

    import tether

    cfg = tether.load_config("configs/reverse.yaml", ["sft.steps=20"])  # a YAML path or a packaged config; overrides
    run = tether.sft(cfg, run_dir="runs/rev-sft")      # -> tether.Run; tether.train(cfg, ...) for RL
    run.kind, run.path, run.config, run.summary        # run.result_model(): the directory of its result model
    metrics = tether.evaluate(run)                     # held-out metrics of the run's result
    run = tether.open_run("runs/rev-sft")              # any run directory, any kind, from any folder

    tether.export(run, "my-model")                     # a plain Hugging Face model (LoRA merged)
    tether.doctor(run), tether.show(run)               # health per kind; the `tether show` text

    tether.Env, tether.RewardFn, tether.Rollout        # the protocols a user implements

Names are imported on first use, so `import tether` stays cheap (no torch until a run needs it).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "load_config": "tether.api.training", "sft": "tether.api.training", "train": "tether.api.training",
    "evaluate": "tether.api.evaluate", "export": "tether.api.export", "open_run": "tether.api.run", "Run": "tether.api.run",
    "doctor": "tether.api.doctor", "Env": "tether.envs.base", "RewardFn": "tether.rewards.base",
    "Rollout": "tether.rollout",
}


def show(run: Any) -> str:
    """The `tether show` text of a run (a path or a Run)."""
    from tether.show import render_run_summary

    return render_run_summary(getattr(run, "path", run))


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tether' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = ["__version__", "show", *_API]
