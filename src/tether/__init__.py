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

import sys
from importlib import import_module
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

_API = {
    "load_config": "tether.api.training", "sft": "tether.api.training", "train": "tether.api.training",
    "evaluate": "tether.api.evaluate", "export": "tether.api.export", "open_run": "tether.api.run", "Run": "tether.api.run",
    "doctor": "tether.api.doctor", "show": "tether.api.show", "Env": "tether.envs.base", "RewardFn": "tether.rewards.base",
    "Rollout": "tether.rollout",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tether' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


class _CallablePackage(ModuleType):
    """A subpackage that shares its name with an API function: `tether.train` is both `tether.train(cfg)`
    and the engine package `tether/train/`. Importing `tether.train.setup` binds the package on `tether`
    in place of the function; a call of the package is the function's (so `tether.sft(...)`, which imports
    the engine, then `tether.train(...)` works, and `tether.train.setup` still names the module)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__name__.rsplit(".", 1)[1]
        return getattr(import_module(_API[name]), name)(*args, **kwargs)


class _Tether(ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, ModuleType) and not isinstance(value, _CallablePackage):
            value.__class__ = _CallablePackage  # the import system binding a subpackage (see _CallablePackage)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Tether


__all__ = ["__version__", *_API]
