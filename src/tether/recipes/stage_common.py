"""Pieces shared by the stage recipes (rs_sft, dpo, distill, merge, eval) and the pipeline:
sampling k answers per problem, selective masking of error turns, held-out evaluation of a
model, and the hand-off of a stage's model to the next one (a Hugging Face directory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import torch

from tether.train.batching import SeqRecord
from tether.config import ConfigError, TetherConfig
from tether.eval.runner import run_eval
from tether.policy.hf import HFPolicy, load_policy
from tether.rollout import compute_tokenizer_corpus, make_rollout
from tether.tasks import read_jsonl_fields  # noqa: F401  (re-exported for the stage recipes)
from tether.types import Trajectory, TrajectoryGroup


def start_stage(cfg: TetherConfig, run_dir: str | Path, kind: str):
    """A stage recipe's opening: its run directory (config and run record written), seeds, the
    train problems and the starting policy (`model.path`, or a new tiny model). Returns (run dir,
    train, policy)."""
    from tether.io.run_dir import make_run_dir
    from tether.runs.lifecycle import do_start_record
    from tether.train.setup import configure_process, seed_run, setup_policy, setup_problems

    rd = make_run_dir(run_dir)
    rd.write_config(cfg)
    do_start_record(rd.root, cfg, kind)
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    train, _ = setup_problems(cfg.data)
    return rd, train, setup_policy(cfg.model, cfg.run.seed, rd.root, lambda: compute_tokenizer_corpus(cfg.data.task, train))


def run_sampling(policy: HFPolicy, problems: Sequence[dict[str, Any]], k: int, cfg: TetherConfig,
                 generator: torch.Generator | None) -> list[TrajectoryGroup]:
    """k rewarded samples per problem from `policy`, through the rollout seam (any task kind)."""
    was_training = policy.model.training
    policy.model.eval()
    try:
        groups, _ = make_rollout(cfg).run(policy, problems, k, cfg.rollout.sampling, generator)
    finally:
        if was_training:
            policy.model.train()
    return groups


def find_error_turns(traj: Trajectory) -> set[int]:
    """Indices of turns whose action was a malformed tool call (parse errors) or whose tool call
    failed (tool_errors in the environment's step info). Single-turn samples have none."""
    bad = {k for k, t in enumerate(traj.turns) if t.info.get("parse_errors", 0)}
    for k, tr in enumerate(traj.info.get("transitions", ()) or ()):
        if getattr(tr, "info", {}).get("tool_errors", 0):
            bad.add(k)
    return bad


def mask_error_turns(record: SeqRecord, error_turns: set[int]) -> SeqRecord:
    """The record with its loss mask zeroed on the tokens of `error_turns` (selective RFT, the
    SWE-agent RL recipe: train on accepted trajectories but not on the turns that erred)."""
    if not error_turns or not record.turn_ids:
        return record
    mask = tuple(0 if t in error_turns else m for m, t in zip(record.loss_mask, record.turn_ids))
    return dataclasses.replace(record, loss_mask=mask)


def evaluate_policy(cfg: TetherConfig, policy: HFPolicy) -> dict[str, float]:
    """Held-out metrics of `policy` (the same call and seed as recipes/rl.py's evaluation) plus
    `eval/answer_tokens`: mean sampled tokens per answer (long2short)."""
    from tether.train.setup import configure_process, setup_problems

    configure_process(cfg.sandbox, cfg.model)
    _, held_out = setup_problems(cfg.data)
    m, rows = run_eval(policy, held_out, cfg.eval, make_rollout(cfg), cfg.reward, seed=cfg.run.seed + 17)
    tokens = [r["tokens"] for r in rows if "tokens" in r]
    if tokens:
        m["eval/answer_tokens"] = sum(tokens) / len(tokens)
    return {k: v for k, v in m.items() if not k.startswith("time/")}


def save_model(policy: HFPolicy, out: Path) -> Path:
    """The policy as a Hugging Face directory (weights in safetensors + tokenizer); a LoRA policy
    as its adapter (peft format), which load_policy / `model.path=` read merged (docs/lora.md)."""
    from tether.policy.lora import is_lora, save_adapter

    out = Path(out)
    if is_lora(policy.model):
        save_adapter(policy.model, out)
    else:
        policy.model.save_pretrained(str(out), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(out))
    return out


def load_model_dir(path: str | Path, cfg: TetherConfig, what: str) -> HFPolicy:
    """Load a model directory, or fail with one line naming the setting that pointed at it."""
    p = Path(path)
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():  # a model or a LoRA adapter
        raise ConfigError(f"{what}={path}: not a model directory (no config.json); point it at a trained "
                          "model (a run's final_model/ or checkpoints/step_N/) or an earlier stage's name")
    return load_policy(p, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)

