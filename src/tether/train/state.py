"""The typed run state of an RL run: everything the loop mutates, checkpointed as a whole.

`RLState` holds the policy, the optimizer and scheduler, the reference model and critic, the
problem stream and sampling generator, the update's running state and the step counter; the
recipes (`tether.recipes.rl`, `rl_async`, `distill`) drive it and `tether.dist` shards it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tether import hardware
from tether.algos import ADVANTAGES, AdaptiveKLController
from tether.config import TetherConfig
from tether.data import ProblemStream
from tether.health import build_faults
from tether.optim import build_optimizer, build_scheduler
from tether.policy import decode, lean_train
from tether.policy.hf import HFPolicy, ValueModel
from tether.policy.reference import make_reference
from tether.train.update import UpdateState


def choose_compile_for(cfg: TetherConfig, policy: HFPolicy) -> hardware.CompileChoice:
    """`train.compile` / `rollout.compile` for this run (tether.hardware.choose_compile), printed."""
    r = cfg.rollout
    choice = hardware.choose_compile(
        cfg.train.compile, r.compile, autocast_bf16=policy.autocast_bf16, device=str(policy.device),
        params=sum(p.numel() for p in policy.model.parameters()),
        tokens_per_step=r.n * r.problems_per_step * r.sampling.max_new_tokens, steps=cfg.train.steps,
        supported=(lean_train.supports(policy.model, policy.device), decode.supports(policy.model)))
    print(f"[tether] compile: training forward {'on' if choice.train else 'off'}, decode step "
          f"{'on' if choice.rollout else 'off'} ({choice.reason})", flush=True)
    return choice


class RLState:
    """Everything the loop mutates; checkpointed as a whole."""

    def __init__(self, cfg: TetherConfig, policy: HFPolicy, train_problems: list[dict[str, Any]]) -> None:
        a, t = cfg.algo, cfg.train
        self.policy = policy
        self.compile = choose_compile_for(cfg, policy)
        if self.compile.train:  # tether.policy.lean_train, compiled (Llama-family models on a CPU)
            policy.lean_train = "compile"
            if not lean_train.supports(policy.model, policy.device):
                warnings.warn("train.compile=true: only Llama-family models on a CPU have the compiled training "
                              "forward (tether.policy.lean_train); this run trains through transformers' forward",
                              stacklevel=2)
        if self.compile.rollout:  # tether.policy.decode's step, compiled
            policy.compile_decode = True
            if not decode.supports(policy.model):
                warnings.warn("rollout.compile=true: only Llama-family models have the compiled decode step "
                              "(tether.policy.decode); this run samples through transformers' forward", stacklevel=2)
        self.stream = ProblemStream(train_problems, cfg.run.seed)
        self.generator = torch.Generator().manual_seed(cfg.run.seed)
        params = list(policy.model.parameters())
        facts = ADVANTAGES.facts(a.advantage.name)
        self.critic = ValueModel(policy.model).to(policy.device) if facts.needs_critic else None
        self.optimizer = build_optimizer(params, t.lr, t.weight_decay, t.betas)
        if self.critic is not None:
            self.optimizer.add_param_group({"params": list(self.critic.parameters()), "lr": a.value.lr})
        total = max(1, t.steps * a.epochs * a.mini_batches)
        self.scheduler = build_scheduler(self.optimizer, total, t.warmup_steps, t.schedule)
        self.ref = make_reference(policy) if a.kl.coef > 0 and a.kl.reference == "initial" else None
        self.kl_ctl = AdaptiveKLController(a.kl.coef, a.kl.adaptive_target, a.kl.adaptive_horizon) if a.kl.adaptive_target else None
        self.update = UpdateState(kl_coef=a.kl.coef)
        self.step = 0
        self.faults = build_faults(cfg.health.inject, self, cfg, cfg.run.seed)  # faultbench seams; else identity
        self.dp = None  # data-parallel trainer group (tether.dist.trainer); None: this process alone

    def extra_state(self) -> dict[str, Any]:
        return {
            "step": self.step, "data": self.stream.state_dict(), "generator": self.generator.get_state(),
            "update": vars(self.update).copy(), "kl_ctl": self.kl_ctl.state_dict() if self.kl_ctl else None,
            "policy_version": self.policy.version,
            "ref": None if self.ref is None or self.ref.base_only else {k: v.clone() for k, v in self.ref.model.state_dict().items()},
            "critic": None if self.critic is None else self.critic.state_dict(),
            "health": self.health.state_dict() if hasattr(self, "health") else None,
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
