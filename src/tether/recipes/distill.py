"""On-policy distillation: the student samples, a teacher scores every sampled token, and the
per-token reverse KL is the advantage (`tether.algos.distill`; MiniLLM arXiv 2306.08543, GKD
arXiv 2306.13649, Thinking Machines' "On-Policy Distillation" 2025; DeepSeek-V3.2 arXiv
2512.02556 distils specialists into one model, then mixes in RL).

    tether pipeline CONFIG     with a stage {kind: distill, overrides: {distill: {teacher: rl}}}

This is recipes/rl.py's loop with one piece swapped: the batch builder. Everything else — the
rollouts (single-turn or environment episodes), the update (algo.policy_loss, algo.agg), health
monitoring, checkpoints, exact resume, evaluation — is the RL recipe's. Per step:
  rollouts -> rl.build_train_batch (sequences, masks, task-reward advantages)
  -> teacher log-probs of the sampled token ids -> A_t = kl_coef * (log pi_T - log pi_s)
     + reward_weight * A_task -> update

Supported teachers: any local causal LM directory whose tokenizer has the student's vocabulary,
id for id (checked before the first rollout). Teachers with another tokenizer would need the
student's text re-tokenised and the log-probs aligned across tokenisations; that is not
supported — the error says what to use instead.

Deliberate simplifications: the student's log-probs are the ones recorded at sampling
(rollout.sampling.temperature), and the teacher is scored at the same temperature; the teacher
stays in memory next to the student (two tiny models on a CPU).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tether.algos.distill import compute_reverse_kl_advantages
from tether.config import ConfigError, TetherConfig
from tether.policy.hf import HFPolicy
from tether.recipes.rl import RLVariant, build_train_batch, run_rl
from tether.recipes.stage_common import load_model_dir
from tether.train.state import RLState
from tether.train.update import compute_batch_logprobs
from tether.types import TrajectoryGroup


def make_distill_batch(st: RLState, cfg: TetherConfig, groups: list[TrajectoryGroup],
                       teacher: HFPolicy) -> tuple[Any, dict[str, float]]:
    """The RL batch with its advantages replaced by the reverse-KL advantage (plus the weighted
    task advantage); logs the sampled reverse KL per token."""
    d = cfg.distill
    batch, metrics = build_train_batch(st, cfg, groups)
    teacher_logp = compute_batch_logprobs(teacher, batch, cfg.rollout.sampling.temperature, cfg.train.micro_batch_tokens)
    kl_adv = compute_reverse_kl_advantages(batch.rollout_logp_BT, teacher_logp, batch.loss_mask_BT, d.kl_coef)
    mask = batch.loss_mask_BT > 0
    n = mask.sum().clamp(min=1)
    metrics["distill/reverse_kl"] = float(torch.where(mask, batch.rollout_logp_BT - teacher_logp, 0.0).sum() / n)
    metrics["distill/teacher_logp"] = float(torch.where(mask, teacher_logp, 0.0).sum() / n)
    adv = kl_adv + d.reward_weight * batch.advantages_BT
    return dataclasses.replace(batch, advantages_BT=adv), metrics


def run_distill(cfg: TetherConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """`train.steps` distillation steps of `model.path` towards `distill.teacher`."""
    if not cfg.distill.teacher:
        raise ConfigError("distill needs a teacher: set distill.teacher=<model dir> (or an earlier stage's name)")
    teacher = load_model_dir(cfg.distill.teacher, cfg, "distill.teacher")
    from tether.policy.checks import check_same_vocab
    from tether.preflight_stages import Lineage

    student = Lineage(cfg)  # model.path's tokenizer, or the tiny model's as run_rl will build it: any stage order
    check_same_vocab(student.tokenizer, teacher.tokenizer, f"distill.teacher={cfg.distill.teacher}", student.where)
    teacher.model.eval()
    for p in teacher.model.parameters():
        p.requires_grad_(False)
    return run_rl(cfg, run_dir, resume=resume, variant=RLVariant(build=partial(make_distill_batch, teacher=teacher), kind="distill"))
