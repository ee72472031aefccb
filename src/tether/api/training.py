"""`tether.load_config`, `tether.sft`, `tether.train`: a config and a run from Python.

    cfg = tether.load_config("configs/reverse.yaml", ["sft.steps=20"])   # a YAML path, or a packaged config ("demo")
    run = tether.sft(cfg, run_dir="runs/rev-sft")                        # -> tether.Run
    run = tether.train(cfg, run_dir="runs/rev-rl")                       # RL (GRPO by default)

The same checks as the `tether sft` / `tether train` commands run first (bad paths, data, tokenizer:
one UserError before a model is built); an existing run directory needs `resume=True` (continue it,
under `tether train --resume`'s rules) or `overwrite=True` (replace it).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Sequence

from tether.api.run import Run, open_run
from tether.runs.lifecycle import default_run_dir


def packaged_configs() -> list[str]:
    """The names of the configs shipped inside the package (`tether.load_config("demo")`)."""
    return sorted(p.name[:-5] for p in resources.files("tether.configs").iterdir() if p.name.endswith(".yaml"))


def load_config(source=None, overrides: Sequence[str] = ()):
    """A validated, frozen config: `source` is a YAML path, the name of a packaged config, a config
    (returned with `overrides` applied) or None (the defaults); `overrides` are `key.path=value`."""
    from tether.config import ConfigError, TetherConfig, build_config, load_config as load_yaml
    from tether.config_text import apply_overrides

    if isinstance(source, TetherConfig):
        return build_config(apply_overrides(source.model_dump(mode="json"), list(overrides)), "<config>")
    if isinstance(source, str) and not Path(source).exists() and "/" not in source and not source.endswith(".yaml"):
        if source not in packaged_configs():
            raise ConfigError(f"config {source!r}: no such file and no packaged config of that name "
                              f"(packaged: {', '.join(packaged_configs())})")
        return load_yaml(Path(str(resources.files("tether.configs") / f"{source}.yaml")), list(overrides))
    return load_yaml(source, list(overrides))


def _run(kind: str, cfg, run_dir, resume: bool, overwrite: bool) -> Run:
    from tether.preflight import check_run_inputs

    rd = Path(run_dir) if run_dir is not None else default_run_dir(cfg.run.name + ("-sft" if kind == "sft" else ""))
    check_run_inputs(cfg, rd, kind)  # bad paths, data, tokenizer: one line before a model is built
    if kind == "sft":
        from tether.recipes.sft import run_sft

        run_sft(cfg, rd, resume=resume, overwrite=overwrite)
    else:
        from tether.recipes.rl import run_rl

        run_rl(cfg, rd, resume=resume, overwrite=overwrite)
    return open_run(rd)


def sft(cfg, run_dir: str | Path | None = None, *, resume: bool = False, overwrite: bool = False) -> Run:
    """Supervised fine-tuning on the task's demonstrations (`sft.*`); returns the run. Its result
    model is final_model/ (`run.result_model()`)."""
    return _run("sft", cfg, run_dir, resume, overwrite)


def train(cfg, run_dir: str | Path | None = None, *, resume: bool = False, overwrite: bool = False) -> Run:
    """RL (`algo.*`, GRPO by default) from `model.path` or a new tiny model; returns the run."""
    return _run("rl", cfg, run_dir, resume, overwrite)


__all__ = ["default_run_dir", "load_config", "packaged_configs", "sft", "train"]
