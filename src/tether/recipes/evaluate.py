"""`tether eval`: evaluate a run's latest checkpoint, one checkpoint, or a config's model on
held-out problems; writes eval.json (metrics, test-time-scaling curves, per-problem pass rates,
samples) and plots/eval_tts.png (pass@k, maj@k, best@k against k)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tether.config import TetherConfig, load_config
from tether.eval.runner import run_eval
from tether.io.checkpoint import find_latest_checkpoint
from tether.io.run_dir import sanitize_json
from tether.policy.hf import load_policy
from tether.policy.lora import is_adapter_dir
from tether.train.setup import configure_process, seed_run, setup_problems
from tether.rollout import make_rollout
from tether.rollout.prompt_format import run_format_check


def resolve_run(target: Path) -> Path:
    """A run directory, or the `rl/` (else `sft/`) sub-run of a pipeline directory like the demo's."""
    has_model = find_latest_checkpoint(target) is not None or (target / "final_model" / "config.json").is_file()
    if (target / "config.yaml").is_file() and has_model:
        return target
    for sub in ("rl", "sft"):
        if (target / sub / "config.yaml").is_file():
            return target / sub
    if (target / "config.yaml").is_file():
        return target  # a run without a model yet: find_model_dir says so
    raise FileNotFoundError(f"{target}: no config.yaml here (nor in rl/ or sft/): not a tether run directory")


def find_model_dir(run: Path) -> Path:
    ckpt = find_latest_checkpoint(run)
    if ckpt is not None:
        return ckpt
    if (run / "final_model" / "config.json").is_file() or is_adapter_dir(run / "final_model"):
        return run / "final_model"
    raise FileNotFoundError(f"{run}: no checkpoint and no final_model/ to evaluate")


def resolve_target(target: Path, overrides: list[str]) -> tuple[TetherConfig, Path, Path]:
    """(config, model directory, default output directory) for a run directory (its latest
    checkpoint), a model directory inside a run (`checkpoints/step_N/`, `final_model/`: the run's
    config), or a YAML config whose `model.path` names the model."""
    target = Path(target)
    if target.is_dir() and ((target / "config.json").is_file() or is_adapter_dir(target)):  # a model (or LoRA adapter)
        for parent in target.parents:
            if (parent / "config.yaml").is_file():
                return load_config(parent / "config.yaml", overrides), target, parent
        raise FileNotFoundError(f"{target}: a model directory outside any run (no config.yaml above it); "
                                "pass a YAML config with model.path instead")
    if target.is_dir():
        run = resolve_run(target)
        return load_config(run / "config.yaml", overrides), find_model_dir(run), run
    cfg = load_config(target, overrides)
    if not cfg.model.path:
        raise FileNotFoundError(f"{target}: model.path is not set; evaluate a run directory or set model.path=DIR")
    return cfg, Path(cfg.model.path), Path(".")


def run_eval_command(target: Path, overrides: list[str], out: Path | None = None,
                     plot: bool = True) -> tuple[dict[str, Any], Path]:
    """Evaluate and write eval.json (metrics, curves, what was evaluated); returns (metrics, path)."""
    cfg, model_dir, default_out = resolve_target(Path(target), overrides)
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    policy = load_policy(model_dir, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    _, held_out = setup_problems(cfg.data)
    extra: dict[str, Any] = {}
    rollout = make_rollout(cfg)  # the run's own rollout: single-turn samples or environment episodes
    fmt = run_format_check(cfg, rollout, held_out, "this evaluation", model_dir)  # chat vs raw (a warning)
    if getattr(rollout, "checks_prompt_format", False):  # an agent harness: its endpoint checks against this model
        rollout.prompt_format = fmt["model_prompt_format"]
    metrics, rows = run_eval(policy, held_out, cfg.eval, rollout, cfg.reward, seed=cfg.run.seed + 17, curves_out=extra)
    out_dir = Path(out or default_out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    if plot:
        from tether.io.plots import plot_eval_curve

        named = {name + (f" ({extra['best_of']})" if name == "best@k" else ""): curve
                 for name, curve in extra["curves"].items() if name != "mean@k"}
        plots.append(str(plot_eval_curve(named, out_dir / "plots" / "eval_tts.png", title="test-time scaling",
                                          ylabel="fraction of problems solved")))
    payload = {"model": str(model_dir), "task": cfg.data.task, "rollout": rollout.kind, "metrics": metrics, "best_of": extra["best_of"],
               "sampling": cfg.eval.sampling.model_dump(), "samples_per_problem": cfg.eval.samples,
               "curves": {name: {str(k): v for k, v in curve.items()} for name, curve in extra["curves"].items()},
               "pass_rates": extra["pass_rates"], "plots": plots, "samples": rows[:50], **fmt}
    path = out_dir / "eval.json"
    path.write_text(json.dumps(sanitize_json(payload)[0], indent=2))
    return {"model": str(model_dir), "task": cfg.data.task, "rollout": rollout.kind, **metrics}, path
