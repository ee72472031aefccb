"""Reward faults: an exploitable shaping term, a verifier loophole, a noisy reward, a flaky reward.

Reward faults corrupt the *training* reward; the verified correctness (`RewardResult.correct`,
from the correctness component) stays the ground truth, as it does when a run has an independent
checker or held-out evaluation (a high reward is not a high accuracy).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping

from tether.health.faults import Fault, register_fault
from tether.types import Outcome

_FLAKY = random.Random(0)  # reward calls are ordered within a step: reproducible per run


def verbosity_bonus(text: str, task: Mapping[str, Any], *, per_char: float = 0.1) -> float:
    """An exploitable shaping reward: pays for length, whatever the answer (capped at 1)."""
    return min(1.0, per_char * len(text.strip()))


def flaky(text: str, task: Mapping[str, Any], *, inner: str, p: float = 0.1) -> float:
    """`inner` that raises with probability `p` (a reward service that fails now and then)."""
    from tether.rewards.base import load_reward_fn

    if _FLAKY.random() < p:
        raise ConnectionError("injected: reward service unavailable")
    return load_reward_fn(inner)(text, task)


def _set_components(fault: Fault, st: Any, cfg: Any, comps: list[Any]) -> None:
    first = cfg.reward.correctness or cfg.reward.components[0].name
    fault.set(st, "reward.components", comps)
    if cfg.reward.correctness is None:
        fault.set(st, "reward.correctness", first)


@register_fault
class RewardHackBonus(Fault):
    """A shaping component that pays for long answers is added to the reward (a format/length
    reward that the policy learns to farm instead of solving the task)."""

    name, family, cause, seam = "reward_hack_bonus", "reward", "exploitable_reward", "reward"
    remediable = True  # down-weighting the offending component removes the incentive
    severities = {"subtle": {"weight": 0.3}, "obvious": {"weight": 1.0}}
    COMPONENT = "tether.health.faults.reward:verbosity_bonus"

    def begin_step(self, st, cfg, step):
        if any(c.name == self.COMPONENT for c in cfg.reward.components):
            return
        from tether.rewards.config import RewardComponentConfig

        _set_components(self, st, cfg, [*cfg.reward.components, RewardComponentConfig(name=self.COMPONENT, weight=self.p["weight"])])


@register_fault
class RewardLoophole(Fault):
    """The verifier accepts an answer that merely *contains* the gold answer (substring match,
    Visual-RFT #176 / #79): listing several numbers is paid like the right one."""

    name, family, cause, seam = "reward_loophole", "reward", "exploitable_reward", "reward"
    severities = {"subtle": {"pay": 0.5}, "obvious": {"pay": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            gold = str(g.task.get("answer", "")).strip()
            trajs = []
            for t in g.trajectories:
                text = str(t.info.get("text", ""))
                if t.reward.outcome == Outcome.OK and not t.reward.correct and gold and gold in text:
                    t = dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=max(t.reward.total, self.p["pay"])))
                trajs.append(t)
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


@register_fault
class RewardNoise(Fault):
    """The reward is flipped (r -> 1 - r) for a random fraction of samples: a noisy labeller or
    a judge that guesses."""

    name, family, cause, seam = "reward_noise", "reward", "noisy_reward", "reward"
    severities = {"subtle": {"p": 0.2}, "obvious": {"p": 0.5}}

    def on_rollouts(self, groups, step):
        rng, out = self.rng(step), []
        for g in groups:
            trajs = []
            for t in g.trajectories:
                if t.reward.outcome == Outcome.OK and rng.random() < self.p["p"]:
                    t = dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=1.0 - t.reward.total))
                trajs.append(t)
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


@register_fault
class RewardErrors(Fault):
    """The correctness reward raises for a fraction of calls (a remote verifier that times out
    or crashes); tether tags and masks those samples, so training goes on with fewer."""

    name, family, cause, seam = "reward_errors", "reward", "reward_failures", "reward"
    severities = {"subtle": {"p": 0.08}, "obvious": {"p": 0.3}}

    def begin_step(self, st, cfg, step):
        if self.wrap_first_reward(st, cfg, "tether.health.faults.reward:flaky", p=self.p["p"]):
            _FLAKY.seed(self.seed)


def length_judge(text: str, task: Mapping[str, Any], *, bias: float = 0.8, chars: int = 6) -> float:
    """A stand-in for an LLM judge with a length bias: it credits the verified answer with weight
    1 - bias, and long replies with weight bias (full credit at `chars` characters)."""
    from tether.rewards.verifiers import exact_match_reward

    return (1.0 - bias) * exact_match_reward(text, task) + bias * min(1.0, len(text.strip()) / chars)


@register_fault
class ExploitableJudge(Fault):
    """A learned judge stands in for the verifier (the verifier's weight is 0, it only scores
    `correct`) and prefers longer answers — the judge/reward-model exploitation that DeepSeek-R1
    caps its RM-based RL against (arXiv 2501.12948 §2.3.4). Evaluations every 5 steps (4 samples per problem) give the
    `learned_reward` detector the judge's held-out agreement with the verifier."""

    name, family, cause, seam = "exploitable_judge", "reward", "learned_reward_exploited", "reward"
    remediable = False  # switching the judge off leaves no reward at all: the right outcome is a halt
    severities = {"subtle": {"bias": 0.5}, "obvious": {"bias": 0.8}}
    base = ("eval.every=5", "eval.samples=4")  # agreement needs correct and incorrect samples of one problem
    COMPONENT = "tether.health.faults.reward:length_judge"

    def begin_step(self, st, cfg, step):
        if any(c.name == self.COMPONENT for c in cfg.reward.components):
            return
        from tether.rewards.config import RewardComponentConfig

        verifier = [c.model_copy(update={"weight": 0.0}) for c in cfg.reward.components]
        judge = RewardComponentConfig(name=self.COMPONENT, weight=1.0, kwargs={"bias": self.p["bias"]})
        _set_components(self, st, cfg, [*verifier, judge])
