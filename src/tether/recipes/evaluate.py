"""`tether eval`: evaluate a run's latest checkpoint (or a config's model) on held-out problems."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tether.config import TetherConfig, load_config
from tether.eval.runner import run_eval
from tether.io.checkpoint import find_latest_checkpoint
from tether.policy.hf import load_policy
from tether.recipes.common import seed_everything, setup_problems


def resolve_run(target: Path) -> Path:
    """A run directory, or the `rl/` (else `sft/`) sub-run of a pipeline directory like the demo's."""
    if (target / "config.yaml").is_file():
        return target
    for sub in ("rl", "sft"):
        if (target / sub / "config.yaml").is_file():
            return target / sub
    raise FileNotFoundError(f"{target}: no config.yaml here (nor in rl/ or sft/): not a tether run directory")


def find_model_dir(run: Path) -> Path:
    ckpt = find_latest_checkpoint(run)
    if ckpt is not None:
        return ckpt
    if (run / "final_model" / "config.json").is_file():
        return run / "final_model"
    raise FileNotFoundError(f"{run}: no checkpoint and no final_model/ to evaluate")


def run_eval_command(target: Path, overrides: list[str], out: Path | None = None) -> tuple[dict[str, Any], Path]:
    """Evaluate and write eval.json (metrics plus what was evaluated); returns (metrics, path)."""
    target = Path(target)
    if target.is_dir():
        run = resolve_run(target)
        cfg: TetherConfig = load_config(run / "config.yaml", overrides)
        model_dir = find_model_dir(run)
        out_dir = out or run
    else:
        cfg = load_config(target, overrides)
        if not cfg.model.path:
            raise FileNotFoundError(f"{target}: model.path is not set; evaluate a run directory or set model.path=DIR")
        model_dir, out_dir = Path(cfg.model.path), out or Path(".")
    seed_everything(cfg.run.seed, cfg.run.deterministic, cfg.run.threads)
    policy = load_policy(model_dir, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    _, held_out = setup_problems(cfg)
    metrics, rows = run_eval(policy, held_out, cfg.eval, cfg.reward, seed=cfg.run.seed + 17,
                             batch_size=cfg.rollout.batch_size, chat=cfg.data.chat)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval.json"
    path.write_text(json.dumps({"model": str(model_dir), "metrics": metrics, "samples": rows[:50]}, indent=2))
    return {"model": str(model_dir), **metrics}, path
