"""System / inference faults: stale rollout weights, a rollout engine with other sampling
settings or noisy log-probs, a slow reward service, a generation limit cut too short."""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Mapping

import torch

from tether.health.faults import Fault, register_fault


def slow(text: str, task: Mapping[str, Any], *, inner: str, delay: float = 0.005) -> float:
    """`inner`, after sleeping `delay` seconds (an overloaded reward service)."""
    from tether.rewards.base import load_reward_fn

    time.sleep(delay)
    return load_reward_fn(inner)(text, task)


@register_fault
class StaleWeights(Fault):
    """The rollout engine stops receiving the trainer's weights. `obvious`: the sync is dead
    and the engine reports its old version; `subtle`: weights arrive only every `every` steps
    while the engine claims the current version (a silent sync failure, trl#5312)."""

    name, family, cause, seam = "stale_weights", "system", "stale_weights", "weight_sync"
    severities = {"subtle": {"every": 4, "honest_version": False}, "obvious": {"every": 0, "honest_version": True}}

    def on_sampler(self, policy, sampling, step):
        every = int(self.p["every"])
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        elif every and (step - self.start) % every == 0:
            with torch.no_grad():
                self._engine.model.load_state_dict(policy.model.state_dict())
            self._engine.version = policy.version
        if not self.p["honest_version"]:
            self._engine.version = policy.version
        return self._engine, sampling


@register_fault
class SamplerMismatch(Fault):
    """The rollout engine samples at another temperature than the trainer scores with (an
    engine default that overrides the config): rollout and trainer log-probs drift apart."""

    name, family, cause, seam = "sampler_mismatch", "system", "rollout_mismatch", "sampler"
    severities = {"subtle": {"factor": 0.8}, "obvious": {"factor": 0.5}}

    def on_sampler(self, policy, sampling, step):
        return policy, sampling.model_copy(update={"temperature": sampling.temperature * self.p["factor"]})


@register_fault
class LogprobNoise(Fault):
    """Rollout log-probs carry an offset plus per-token noise (low-precision engine kernels,
    vllm#18352): the importance ratios the loss sees are wrong."""

    name, family, cause, seam = "logprob_noise", "system", "rollout_mismatch", "sampler"
    severities = {"subtle": {"bias": 0.05, "sigma": 0.1}, "obvious": {"bias": 0.3, "sigma": 0.6}}

    def on_rollouts(self, groups, step):
        rng, out = self.rng(step), []
        for g in groups:
            trajs = []
            for t in g.trajectories:
                turns = tuple(dataclasses.replace(u, action_logprobs=tuple(
                    lp - self.p["bias"] + rng.gauss(0.0, self.p["sigma"]) for lp in u.action_logprobs)) for u in t.turns)
                trajs.append(dataclasses.replace(t, turns=turns))
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


@register_fault
class SlowReward(Fault):
    """Every reward call is delayed (an overloaded verifier or sandbox): steps stall."""

    name, family, cause, seam = "slow_reward", "system", "slow_component", "reward"
    severities = {"subtle": {"delay": 0.003}, "obvious": {"delay": 0.006}}

    def begin_step(self, st, cfg, step):
        self.wrap_first_reward(st, cfg, "tether.health.faults.system:slow", delay=self.p["delay"])


@register_fault
class GenerationCut(Fault):
    """`max_new_tokens` is cut below what an answer needs (a shared config with a tiny limit):
    responses are truncated, rewards and gradients lose their signal."""

    name, family, cause, seam = "generation_cut", "system", "truncation", "sampler"
    remediable = True  # raising the generation limit restores complete answers
    severities = {"subtle": {"factor": 0.34}, "obvious": {"factor": 0.17}}

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            s = cfg.rollout.sampling
            self.set(st, "rollout.sampling.max_new_tokens", max(1, round(s.max_new_tokens * self.p["factor"])))
            self._done = True
