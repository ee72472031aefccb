"""The typed run state of an RL run: everything the loop mutates, checkpointed as a whole.

    st = build_rl_state(RunSettings(cfg), policy, train_problems)
    cfg = st.settings.config          # the config in force this step (tether.settings)

`RLState` holds the policy, the optimizer and scheduler, the reference model and critic, the
problem stream and sampling generator, the update's running state, the run settings (what
changed during the run: repairs in force, reward caps, faults under test) and the step counter;
the recipes (`tether.recipes.rl`, `rl_async`, `distill`) drive it and `tether.dist` shards it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from tether import hardware
from tether.algos import ADVANTAGES, AdaptiveKLController
from tether.data import ProblemStream
from tether.health import build_faults
from tether.optim import build_optimizer, build_scheduler
from tether.policy import decode, lean_train
from tether.policy.hf import HFPolicy, ValueModel
from tether.policy.reference import make_reference
from tether.settings import RunSettings
from tether.train.config import TrainConfig
from tether.train.step import UpdateState


def choose_compile_for(train: TrainConfig, rollout_compile: bool | str, tokens_per_step: int,
                       policy: HFPolicy) -> hardware.CompileChoice:
    """`train.compile` / `rollout.compile` for this run (tether.hardware.choose_compile), printed;
    `tokens_per_step`: what a step samples at most (rollout.n x problems_per_step x max_new_tokens)."""
    choice = hardware.choose_compile(
        train.compile, rollout_compile, autocast_bf16=policy.autocast_bf16, device=str(policy.device),
        params=sum(p.numel() for p in policy.model.parameters()),
        tokens_per_step=tokens_per_step, steps=train.steps,
        supported=(lean_train.supports(policy.model, policy.device), decode.supports(policy.model)))
    print(f"[tether] compile: training forward {'on' if choice.train else 'off'}, decode step "
          f"{'on' if choice.rollout else 'off'} ({choice.reason})", flush=True)
    return choice


def apply_compile(choice: hardware.CompileChoice, policy: HFPolicy) -> None:
    """Switch the policy's compiled training forward / decode step on as `choice` says (warned where
    the model has none: it then trains or samples through transformers' forward)."""
    if choice.train:  # tether.policy.lean_train, compiled (Llama-family models on a CPU)
        policy.lean_train = "compile"
        if not lean_train.supports(policy.model, policy.device):
            warnings.warn("train.compile=true: only Llama-family models on a CPU have the compiled training "
                          "forward (tether.policy.lean_train); this run trains through transformers' forward",
                          stacklevel=3)
    if choice.rollout:  # tether.policy.decode's step, compiled
        policy.compile_decode = True
        if not decode.supports(policy.model):
            warnings.warn("rollout.compile=true: only Llama-family models have the compiled decode step "
                          "(tether.policy.decode); this run samples through transformers' forward", stacklevel=3)


@dataclass(eq=False)
class RLState:
    """Everything the loop mutates; checkpointed as a whole (`extra_state` / `load_extra_state`)."""

    policy: HFPolicy
    settings: RunSettings
    compile: hardware.CompileChoice
    stream: ProblemStream
    generator: torch.Generator
    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch.optim.lr_scheduler.LRScheduler
    update: UpdateState
    critic: ValueModel | None = None
    ref: HFPolicy | None = None
    kl_ctl: AdaptiveKLController | None = None
    faults: Any = None  # tether.health.faults: FaultSet, or NO_FAULTS (every seam the identity)
    health: Any = None  # tether.health.monitor: HealthMonitor / NullMonitor (set once the run directory is open)
    dp: Any = None  # data-parallel trainer group (tether.dist.trainer); None: this process alone
    pending_ref: dict[str, torch.Tensor] | None = None  # a checkpoint's KL anchor that a health repair added
    step: int = 0

    def extra_state(self) -> dict[str, Any]:
        return {
            "step": self.step, "data": self.stream.state_dict(), "generator": self.generator.get_state(),
            "update": vars(self.update).copy(), "kl_ctl": self.kl_ctl.state_dict() if self.kl_ctl else None,
            "policy_version": self.policy.version,
            "ref": None if self.ref is None or self.ref.base_only else {k: v.clone() for k, v in self.ref.model.state_dict().items()},
            "critic": None if self.critic is None else self.critic.state_dict(),
            "health": self.health.state_dict() if self.health is not None else None,
            "settings": self.settings.state_dict(),
        }

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        self.step = int(extra["step"])
        self.stream.load_state_dict(extra["data"])
        self.generator.set_state(extra["generator"])
        self.update = UpdateState(**extra["update"])
        self.policy.version = int(extra["policy_version"])
        if self.kl_ctl and extra.get("kl_ctl"):
            self.kl_ctl.load_state_dict(extra["kl_ctl"])
        if self.ref is not None and extra.get("ref") is not None:
            self.ref.model.load_state_dict(extra["ref"])
        self.pending_ref = extra.get("ref") if self.ref is None else None  # a KL anchor a health repair added
        if self.critic is not None and extra.get("critic") is not None:
            self.critic.load_state_dict(extra["critic"])
        self.settings.load_state_dict(extra.get("settings"))


def build_rl_state(settings: RunSettings, policy: HFPolicy, train_problems: list[dict[str, Any]]) -> RLState:
    """A new run's state under `settings.config` (its `algo`, `train`, `rollout`, `run` and `health`
    sections): optimizer, scheduler, critic and KL reference as the algorithm needs them."""
    cfg = settings.config
    a, t = cfg.algo, cfg.train
    r = cfg.rollout
    choice = choose_compile_for(t, r.compile, r.n * r.problems_per_step * r.sampling.max_new_tokens, policy)
    apply_compile(choice, policy)
    stream, generator = ProblemStream(train_problems, cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed)
    critic = ValueModel(policy.model).to(policy.device) if ADVANTAGES.facts(a.advantage.name).needs_critic else None
    optimizer = build_optimizer(list(policy.model.parameters()), t.lr, t.weight_decay, t.betas)
    if critic is not None:
        optimizer.add_param_group({"params": list(critic.parameters()), "lr": a.value.lr})
    scheduler = build_scheduler(optimizer, max(1, t.steps * a.epochs * a.mini_batches), t.warmup_steps, t.schedule)
    st = RLState(
        policy, settings, choice, stream, generator, optimizer, scheduler, UpdateState(kl_coef=a.kl.coef), critic,
        ref=make_reference(policy) if a.kl.coef > 0 and a.kl.reference == "initial" else None,
        kl_ctl=AdaptiveKLController(a.kl.coef, a.kl.adaptive_target, a.kl.adaptive_horizon) if a.kl.adaptive_target else None)
    st.faults = build_faults(cfg.health.inject, st, cfg.run.seed)  # faultbench seams; else identity
    return st


__all__ = ["RLState", "apply_compile", "build_rl_state", "choose_compile_for"]
