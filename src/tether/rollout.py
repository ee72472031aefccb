"""Drive the policy over problems into TrajectoryGroups (single-turn tasks).

All B_p x n generations of a step run as one batched sampling call; texts are decoded from the
sampled ids cut at the stop token (rewards never see tokens after EOS — dllm#118) and scored in
isolation (tether.rewards). Multi-turn environments extend this in `tether.envs`.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import torch

from tether.config import RewardConfig, SamplingConfig
from tether.policy.hf import HFPolicy, run_generate
from tether.rewards import run_rewards
from tether.types import Sample, Trajectory, TrajectoryGroup, Turn


def encode_prompt(tokenizer, problem: Mapping[str, Any], chat: bool = False) -> list[int]:
    """Prompt token ids: raw text, or the chat template with a generation prompt (always for a
    problem whose prompt is a list of chat messages, e.g. verl's parquet layout)."""
    if chat or problem.get("messages"):
        msgs = problem.get("messages") or [{"role": "user", "content": problem["prompt"]}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    return list(tokenizer.encode(problem["prompt"], add_special_tokens=True))


def decode_completion(tokenizer, sample: Sample, stop_ids: Sequence[int]) -> str:
    """Completion text cut at (and without) the stop token."""
    ids = list(sample.token_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


def run_rollouts(
    policy: HFPolicy,
    problems: Sequence[Mapping[str, Any]],
    n: int,
    sampling: SamplingConfig,
    reward_cfg: RewardConfig,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
    max_prompt_tokens: int | None = None,
    chat: bool = False,
    greedy: bool = False,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """n samples for each problem -> rewarded TrajectoryGroups, plus rollout metrics."""
    t0 = time.perf_counter()
    kept, prompts, skipped = [], [], 0
    for p in problems:
        ids = encode_prompt(policy.tokenizer, p, chat)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            skipped += 1  # counted, not fatal; a run of only over-long prompts fails below
            continue
        kept.append(p)
        prompts.append(ids)
    if not kept:
        raise ValueError(f"all {len(problems)} prompts exceed rollout.max_prompt_tokens={max_prompt_tokens}")
    flat = [ids for ids in prompts for _ in range(n)]
    samples = run_generate(policy, flat, sampling, generator, batch_size=batch_size, greedy=greedy)
    t_gen = time.perf_counter() - t0
    texts = [decode_completion(policy.tokenizer, s, policy.stop_ids) for s in samples]
    tasks = [p for p in kept for _ in range(n)]
    t1 = time.perf_counter()
    results, reward_metrics = run_rewards(texts, tasks, reward_cfg)
    t_reward = time.perf_counter() - t1
    groups = []
    for g, problem in enumerate(kept):
        trajs = []
        for j in range(n):
            k = g * n + j
            s = samples[k]
            turn = Turn(context_ids=s.prompt_ids, action_ids=s.token_ids, action_logprobs=s.logprobs,
                        finish=s.finish, policy_version=s.policy_version)
            trajs.append(Trajectory(task_id=str(problem.get("id", g)), turns=(turn,), reward=results[k],
                                    stop=s.finish, info={"text": texts[k]}))
        groups.append(TrajectoryGroup(task_id=str(problem.get("id", g)), trajectories=tuple(trajs), task=problem))
    gen_tokens = sum(len(s.token_ids) for s in samples)
    metrics = {
        "rollout/prompts_skipped": float(skipped),
        "rollout/gen_tokens": float(gen_tokens),
        "rollout/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "time/generate": t_gen,
        "time/reward": t_reward,
    }
    metrics.update(reward_metrics)
    return groups, metrics


def compute_rollout_stats(groups: Sequence[TrajectoryGroup], tol: float = 1e-6) -> dict[str, float]:
    """Response length, truncation rate and zero-variance-group fraction of a step's rollouts."""
    lengths = [t.num_action_tokens for g in groups for t in g.trajectories]
    truncated = [t.stop.truncated for g in groups for t in g.trajectories]
    zero_var = [max(g.rewards_G) - min(g.rewards_G) <= tol for g in groups if g.trajectories]
    correct = [t.reward.correct for g in groups for t in g.trajectories if t.reward.correct is not None]
    out = {
        "response_length/mean": sum(lengths) / max(len(lengths), 1),
        "response_length/max": float(max(lengths, default=0)),
        "response_length/min": float(min(lengths, default=0)),
        "truncation_rate": sum(truncated) / max(len(truncated), 1),
        "frac_zero_variance_groups": sum(zero_var) / max(len(zero_var), 1),
    }
    if correct:
        out["accuracy"] = sum(bool(c) for c in correct) / len(correct)
    return out
