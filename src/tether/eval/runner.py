"""Held-out evaluation of a policy: sampled pass@k / maj@k / best@k (unbiased) and greedy accuracy.

pass@1 is the unbiased estimate from `samples` draws per problem at the evaluation sampling
settings (kept separate from training sampling — verl PR#553); greedy accuracy is reported too.
The same draws give the test-time-scaling curves for k = 1..samples (`tether.eval.tts`); best@k
ranks samples with the selector named by `eval.best_of` (see `SELECTORS`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import torch

from tether.eval.config import EvalConfig
from tether.policy.config import SamplingConfig
from tether.rewards.config import RewardComponentConfig, RewardConfig
from tether.eval.tts import ProblemSamples, compute_pass_rates, compute_power_of_two_metrics, compute_tts_curves
from tether.policy.hf import HFPolicy
from tether.rewards import extract_answer
from tether.types import Trajectory, TrajectoryGroup


def compute_pred(text: str | None) -> str | None:
    """The answer a sample votes for in maj@k: the stated final answer (`extract_answer`), else
    the whole stripped completion; None (abstains) when empty."""
    if not text:
        return None
    found = extract_answer(text)
    pred = (found if found is not None else text).strip()
    return pred or None


def _mean_logprob(t: Trajectory) -> float:
    """Mean log-probability per sampled token (at the sampling temperature) over all turns."""
    lps = [lp for turn in t.turns for lp in turn.action_logprobs]
    return sum(lps) / len(lps) if lps else float("-inf")


# best@k selectors over one evaluation's trajectories: name -> scores (higher is preferred).
# "verifier" ranks by verified correctness, so best@k equals pass@k (the oracle upper bound);
# "reward" uses the run's reward total (the verifier plus any shaping); "logprob" is the model's
# own confidence (no extra model). Any other name is a reward function (registry name or
# `package.module:function`, e.g. a wrapped reward model) scored on the completion text.
SELECTORS: dict[str, Callable[[list[Trajectory]], list[float]]] = {
    "verifier": lambda ts: [1.0 if t.reward.correct else 0.0 for t in ts],
    "reward": lambda ts: [t.reward.total for t in ts],
    "logprob": lambda ts: [_mean_logprob(t) for t in ts],
}


def compute_selector_scores(groups: Sequence[TrajectoryGroup], selector: str, reward_cfg: RewardConfig) -> list[list[float]]:
    """Per group, one finite score per trajectory for best@k (failed scores rank last)."""
    trajs = [list(g.trajectories) for g in groups]
    if selector in SELECTORS:
        flat = SELECTORS[selector]([t for ts in trajs for t in ts])
    else:
        from tether.rewards import run_rewards

        cfg = RewardConfig(components=[RewardComponentConfig(name=selector)], isolation=reward_cfg.isolation,
                           timeout_s=reward_cfg.timeout_s, on_error="mask", max_error_rate=1.0)
        texts = [str(t.info.get("text", "")) for ts in trajs for t in ts]
        tasks = [g.task for g, ts in zip(groups, trajs) for _ in ts]
        results, _ = run_rewards(texts, tasks, cfg)
        flat = [r.total if r.outcome.value == "ok" else float("nan") for r in results]
    finite = [s for s in flat if s == s and abs(s) != float("inf")]
    floor = (min(finite) if finite else 0.0) - 1.0
    flat = [s if s == s and abs(s) != float("inf") else floor for s in flat]
    out, i = [], 0
    for ts in trajs:
        out.append(flat[i:i + len(ts)])
        i += len(ts)
    return out


def make_eval_problems(groups: Sequence[TrajectoryGroup], scores: Sequence[Sequence[float]]) -> list[ProblemSamples]:
    return [
        ProblemSamples(
            task_id=g.task_id, correct=tuple(1.0 if t.reward.correct else 0.0 for t in g.trajectories),
            answers=tuple(compute_pred(t.info.get("text")) for t in g.trajectories),
            scores=tuple(float(s) for s in sc), rewards=tuple(float(t.reward.total) for t in g.trajectories))
        for g, sc in zip(groups, scores)
    ]


def compute_reward_agreement(groups: Sequence[TrajectoryGroup], correctness: str | None) -> dict[str, float]:
    """How well each reward component ranks held-out samples by verified correctness: per component
    c, the fraction of (correct, incorrect) sample pairs of the same problem that c scores higher
    for the correct one (ties count half) — an AUC, 0.5 at chance. Keys `eval/reward_agreement/<c>`
    for every component but the correctness one; a component without any such pair is left out.

    A learned reward (reward model, judge) that agrees with the verifier on held-out probes can
    stand in for it; one whose agreement falls to chance while training reward rises is being
    exploited (health detector `learned_reward`).
    """
    wins: dict[str, float] = {}
    pairs: dict[str, int] = {}
    for g in groups:
        good = [t.reward.components for t in g.trajectories if t.reward.correct is True]
        bad = [t.reward.components for t in g.trajectories if t.reward.correct is False]
        for cg in good:
            for cb in bad:
                for name, v in cg.items():
                    if name == correctness or "/" in name or name not in cb:
                        continue
                    wins[name] = wins.get(name, 0.0) + (1.0 if v > cb[name] else 0.5 if v == cb[name] else 0.0)
                    pairs[name] = pairs.get(name, 0) + 1
    return {f"eval/reward_agreement/{k}": wins[k] / pairs[k] for k in sorted(pairs)}


def run_eval(
    policy: HFPolicy,
    problems: Sequence[Mapping[str, Any]],
    eval_cfg: EvalConfig,
    rollout: Any,
    reward_cfg: RewardConfig,
    seed: int = 0,
    greedy: bool = True,
    curves_out: dict[str, Any] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics (`eval/pass@k`, `eval/maj@k`, `eval/best@k` at k = 1, 2, 4, ... <= samples,
    `eval/greedy_accuracy`, `eval/reward_mean`, `eval/turns_mean`) and per-sample rows for
    `samples/eval_*.jsonl.gz`, through `rollout` (a `tether.rollout.Rollout`: any task kind).

    `curves_out`, when given, receives the full curves for every k (`tether.eval.tts`) and the
    per-problem pass rates.
    """
    t0 = time.perf_counter()
    probs = list(problems[: eval_cfg.problems] if eval_cfg.problems else problems)
    gen = torch.Generator().manual_seed(seed)
    was_training = policy.model.training
    policy.model.eval()
    n = eval_cfg.samples
    try:
        groups, m = rollout.run(policy, probs, n, eval_cfg.sampling, gen)
        scores = compute_selector_scores(groups, eval_cfg.best_of, reward_cfg)
        samples = make_eval_problems(groups, scores)
        curves = compute_tts_curves(samples)
        metrics: dict[str, float] = {"eval/problems": float(len(groups)), **compute_power_of_two_metrics(curves)}
        rewards = [t.reward.total for g in groups for t in g.trajectories]
        metrics["eval/reward_mean"] = sum(rewards) / max(len(rewards), 1)
        metrics.update(compute_reward_agreement(groups, reward_cfg.correctness or (
            reward_cfg.components[0].name if reward_cfg.components else None)))
        turns = [len(t.turns) for g in groups for t in g.trajectories]
        metrics["eval/turns_mean"] = sum(turns) / max(len(turns), 1)
        rows = [
            {"task_id": g.task_id, "prompt": g.task.get("prompt"), "answer": g.task.get("answer"),
             "completion": t.info.get("text"), "reward": t.reward.total, "correct": t.reward.correct,
             "pred": p.answers[j], "score": p.scores[j], "tokens": t.num_action_tokens, "stop": t.stop.value}
            for g, p in zip(groups, samples) for j, t in enumerate(g.trajectories)
        ]
        if greedy:
            sampling = SamplingConfig(max_new_tokens=eval_cfg.sampling.max_new_tokens)
            ggroups, _ = rollout.run(policy, probs, 1, sampling, None, greedy=True)
            metrics["eval/greedy_accuracy"] = sum(bool(g.trajectories[0].reward.correct) for g in ggroups) / max(len(ggroups), 1)
    finally:
        if was_training:
            policy.model.train()
    metrics["time/eval"] = time.perf_counter() - t0
    if curves_out is not None:
        curves_out.update(curves=curves, pass_rates=compute_pass_rates(samples),
                          best_of=eval_cfg.best_of)
    return metrics, rows
