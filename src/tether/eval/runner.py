"""Held-out evaluation of a policy: sampled pass@k (unbiased) and greedy accuracy.

pass@1 is the unbiased estimate from `samples` draws per problem at the evaluation sampling
settings (kept separate from training sampling — verl PR#553); greedy accuracy is reported too.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import torch

from tether.config import EvalConfig, RewardConfig
from tether.eval.passk import mean_pass_at_k
from tether.policy.hf import HFPolicy
from tether.rollout import run_rollouts


def run_eval(
    policy: HFPolicy,
    problems: Sequence[Mapping[str, Any]],
    eval_cfg: EvalConfig,
    reward_cfg: RewardConfig,
    seed: int = 0,
    batch_size: int = 256,
    chat: bool = False,
    greedy: bool = True,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics (`eval/pass@1`, `eval/pass@k`, `eval/greedy_accuracy`, `eval/reward_mean`) and
    per-sample rows for `samples/eval_*.jsonl.gz`."""
    t0 = time.perf_counter()
    probs = list(problems[: eval_cfg.problems] if eval_cfg.problems else problems)
    gen = torch.Generator().manual_seed(seed)
    was_training = policy.model.training
    policy.model.eval()
    n = eval_cfg.samples
    groups, _ = run_rollouts(policy, probs, n, eval_cfg.sampling, reward_cfg, gen, batch_size, chat=chat)
    counts = [(n, sum(bool(t.reward.correct) for t in g.trajectories)) for g in groups]
    metrics: dict[str, float] = {"eval/problems": float(len(groups)), "eval/pass@1": mean_pass_at_k(counts, 1)}
    k = 2
    while k <= n:
        metrics[f"eval/pass@{k}"] = mean_pass_at_k(counts, k)
        k *= 2
    rewards = [t.reward.total for g in groups for t in g.trajectories]
    metrics["eval/reward_mean"] = sum(rewards) / max(len(rewards), 1)
    rows = [
        {"task_id": g.task_id, "prompt": g.task.get("prompt"), "answer": g.task.get("answer"),
         "completion": t.info.get("text"), "reward": t.reward.total, "correct": t.reward.correct}
        for g in groups for t in g.trajectories
    ]
    if greedy:
        from tether.config import SamplingConfig

        sampling = SamplingConfig(max_new_tokens=eval_cfg.sampling.max_new_tokens)
        ggroups, _ = run_rollouts(policy, probs, 1, sampling, reward_cfg, None, batch_size, chat=chat, greedy=True)
        metrics["eval/greedy_accuracy"] = sum(bool(g.trajectories[0].reward.correct) for g in ggroups) / max(len(ggroups), 1)
    metrics["time/eval"] = time.perf_counter() - t0
    if was_training:
        policy.model.train()
    return metrics, rows
