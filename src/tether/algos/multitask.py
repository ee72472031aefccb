"""Multi-task advantage normalisation: the configured estimator, then (optionally) per task.

    adv = compute_advantages(inputs, cfg.algo.advantage)   # what the RL recipe calls

`cfg.task_norm` (task_B = the environment / task type of each sequence):
- `none`: the estimator alone (ADVANTAGES[cfg.name]).
- `task`: AgentRL task advantage normalisation (Zhang et al., arXiv 2510.04206, "task advantage
  normalization"): the estimator's advantages are whitened separately per task type, so tasks
  with different reward scales contribute comparably (`normalize_by_task`).
- `env`: ERPO environment-level advantage estimation (AutoForge, arXiv 2512.22857): baselines
  and scales come from all rollouts of the same environment instead of the problem's group —
  the estimator runs with group_B := task_B. The paper's exact formula is not public; this
  is the reading (R_i - mean_env) / std_env for `grpo`.
"""

from __future__ import annotations

import dataclasses

import torch

from tether.algos.advantages import normalize_by_task
from tether.algos.base import ADVANTAGES, AdvantageInputs, AdvantageOutputs
from tether.algos.config import AdvantageConfig


def compute_advantages(inp: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutputs:
    """ADVANTAGES[cfg.name] with the multi-task normalisation `cfg.task_norm` (see module)."""
    estimator = ADVANTAGES[cfg.name]
    if cfg.task_norm == "none":
        return estimator(inp, cfg)
    task_B = inp.task_B if inp.task_B is not None else torch.zeros_like(inp.group_B)
    if cfg.task_norm == "env":
        return estimator(dataclasses.replace(inp, group_B=task_B), cfg)
    out = estimator(inp, cfg)
    keep_BT = inp.mask_BT * inp.valid_B[:, None].to(inp.mask_BT.dtype)
    return dataclasses.replace(out, advantages_BT=normalize_by_task(out.advantages_BT, keep_BT, task_B, cfg.eps))
