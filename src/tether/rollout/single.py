"""Single-turn rollouts: a one-turn episode per sample, all B_p x n of a step in ONE sampling call.

Texts are decoded from the sampled ids cut at the stop token (rewards never see tokens after EOS
— dllm#118) and scored in isolation (tether.rewards). `SingleTurnRollout` is this module behind
the `tether.rollout.Rollout` interface; multi-turn environments are `tether.rollout.episodes`.
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from tether.train.batching import SeqRecord
from tether.policy.config import SamplingConfig
from tether.rewards.config import RewardConfig
from tether.errors import InputError
from tether.policy.chat import decode_completion, encode_prompt
from tether.policy.hf import HFPolicy, run_generate
from tether.rewards import run_rewards
from tether.types import Sample, Trajectory, TrajectoryGroup, Turn


def _make_groups(kept: Sequence[Mapping[str, Any]], samples: Sequence[Sample], texts: Sequence[str],
                 results: Sequence[Any], n: int) -> list[TrajectoryGroup]:
    """One-turn trajectories, n per problem, in the order they were sampled."""
    groups = []
    for g, problem in enumerate(kept):
        trajs = []
        for j in range(n):
            k = g * n + j
            s = samples[k]
            turn = Turn(context_ids=s.prompt_ids, action_ids=s.token_ids, action_logprobs=s.logprobs,
                        finish=s.finish, policy_version=s.policy_version, action_kept=s.kept,
                        action_versions=s.token_versions)
            trajs.append(Trajectory(task_id=str(problem.get("id", g)), turns=(turn,), reward=results[k],
                                    stop=s.finish, info={"text": texts[k]}))
        groups.append(TrajectoryGroup(task_id=str(problem.get("id", g)), trajectories=tuple(trajs), task=problem))
    return groups


def build_single_turn_demo_records(policy: HFPolicy, problems: Sequence[Mapping[str, Any]], task: str, chat: bool,
                                   noise: float, seed: int) -> list[SeqRecord]:
    """prompt + demonstration + stop token per problem, the loss on the completion (and the stop
    token). The demonstration is the problem's "completion" field, else the task's scripted one."""
    from tether.tasks import demonstration
    from tether.tasks.sources import is_file_task

    tok, eos = policy.tokenizer, policy.stop_ids[0]
    if getattr(tok, "eos_token_id", None) in policy.stop_ids:
        eos = tok.eos_token_id
    records = []
    rng = random.Random(seed)
    for i, p in enumerate(problems):
        demo = p.get("completion") or (p["answer"] if is_file_task(task) else demonstration(task, p, noise, rng))
        prompt = encode_prompt(tok, p, chat)
        completion = list(tok.encode(demo, add_special_tokens=False)) + [eos]
        ids = prompt + completion
        mask = [0] * len(prompt) + [1] * len(completion)
        records.append(SeqRecord(tuple(ids), tuple(mask), (0.0,) * len(ids), (0.0,) * len(ids), i, i, 0.0, True))
    return records


@dataclass(frozen=True)
class SingleTurnRollout:
    """A task whose episode is one sampled completion scored by the configured rewards."""

    reward: RewardConfig
    batch_size: int = 256
    max_prompt_tokens: int | None = None
    chat: bool = False
    kind: str = "single-turn"
    multi_turn: bool = False  # a fact for input checks: contexts come from the prompt, not a chat history

    def run(self, policy: HFPolicy, problems: Sequence[Mapping[str, Any]], n: int, sampling: SamplingConfig,
            generator: torch.Generator | None = None, greedy: bool = False,
            generate: Callable[..., list[Sample]] = run_generate) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """n samples for each problem -> rewarded TrajectoryGroups, plus rollout metrics."""
        t0 = time.perf_counter()
        kept, prompts, skipped = [], [], 0
        for p in problems:
            ids = encode_prompt(policy.tokenizer, p, self.chat)
            if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
                skipped += 1  # counted, not fatal; a run of only over-long prompts fails below
                continue
            kept.append(p)
            prompts.append(ids)
        if not kept:
            raise ValueError(f"all {len(problems)} prompts exceed rollout.max_prompt_tokens={self.max_prompt_tokens}")
        flat = [ids for ids in prompts for _ in range(n)]
        samples = generate(policy, flat, sampling, generator, batch_size=self.batch_size, greedy=greedy)
        t_gen = time.perf_counter() - t0
        texts = [decode_completion(policy.tokenizer, s.token_ids, policy.stop_ids) for s in samples]
        t1 = time.perf_counter()
        results, reward_metrics = run_rewards(texts, [p for p in kept for _ in range(n)], self.reward)
        t_reward = time.perf_counter() - t1
        gen_tokens = sum(len(s.token_ids) for s in samples)
        metrics = {
            "rollout/prompts_skipped": float(skipped),
            "rollout/gen_tokens": float(gen_tokens),
            "rollout/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
            "time/generate": t_gen,
            "time/reward": t_reward,
        }
        metrics.update(reward_metrics)
        return _make_groups(kept, samples, texts, results, n), metrics

    def fit_problems(self, problems: Sequence[Mapping[str, Any]], policy: HFPolicy, cfg: Any, what: str) -> list:
        """The problems whose prompt fits the context; the others skipped with a count or refused (data.on_overlong)."""
        limit = compute_prompt_limit(cfg, policy.max_positions)
        return fit_prompts(problems, policy.tokenizer, limit, self.chat, cfg.data.on_overlong, what)

    def build_demo_records(self, policy: HFPolicy, problems: Sequence[Mapping[str, Any]], cfg: Any) -> list[SeqRecord]:
        return build_single_turn_demo_records(policy, problems, cfg.data.task, self.chat, cfg.sft.demo_noise, cfg.run.seed)


def fit_prompts(problems: Sequence[dict[str, Any]], tokenizer, limit: int, chat: bool, on_overlong: str,
                what: str) -> list[dict[str, Any]]:
    """The problems whose prompt fits in `limit` tokens; the others are skipped with one warning
    that counts them (`on_overlong="skip"`) or refused (`"error"`, and always when none fit)."""
    kept, over = [], []
    for p in problems:
        n = len(encode_prompt(tokenizer, p, chat))
        (over if n > limit else kept).append((p, n))
    if over:
        (first, n) = over[0]
        msg = (f"{len(over)} of {len(problems)} {what} prompts are longer than {limit} tokens "
               f"(first: id {first.get('id')!r}, {n} tokens)")
        if on_overlong == "error" or not kept:
            raise InputError(f"{msg}: raise rollout.max_prompt_tokens, shorten the prompts, or set data.on_overlong=skip")
        warnings.warn(f"{msg}: skipped (data.on_overlong=skip; set data.on_overlong=error to refuse)", stacklevel=2)
    return [p for p, _ in kept]


def compute_prompt_limit(cfg: Any, max_positions: int) -> int:
    """Prompt tokens that fit: rollout.max_prompt_tokens, and the model's context minus the longest completion."""
    new = max(cfg.rollout.sampling.max_new_tokens, cfg.eval.sampling.max_new_tokens)
    room = max_positions - new
    if room <= 0 and not cfg.model.path:  # the tiny model stands in for a forgotten model.path: say that first
        raise InputError(f"model.path is not set, so tether built its tiny model (model.tiny: {max_positions} positions), "
                         f"where max_new_tokens={new} leaves no room for a prompt: set model.path=<your model directory>, "
                         "or lower rollout/eval.sampling.max_new_tokens for the tiny model")
    if room <= 0:
        raise InputError(f"rollout/eval.sampling.max_new_tokens={new} leaves no room for a prompt in the model's "
                         f"context of {max_positions} positions: lower max_new_tokens")
    return min(cfg.rollout.max_prompt_tokens, room)

