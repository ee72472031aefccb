"""Optimisation faults: updates too large, non-finite gradients, a collapsing or exploding policy
entropy. Injected at the optimizer (step hooks), the loss (gradient hooks) and the loss / sampler
configuration."""

from __future__ import annotations

import math

import torch

from tether.health.faults import Fault, register_fault


@register_fault
class LRSpike(Fault):
    """Every optimizer step runs at k x the configured learning rate (a schedule or scaling bug;
    the logged `lr` still shows the configured value)."""

    name, family, cause, seam = "lr_spike", "optimisation", "lr_too_high", "optimizer"
    remediable = True  # lowering the LR brings the effective rate back down
    severities = {"subtle": {"factor": 4.0}, "obvious": {"factor": 25.0}}

    def install(self, st, cfg, step_fn):
        saved: list[float] = []

        def pre(opt, args, kwargs):
            saved.clear()
            if self.active(step_fn()):
                for g in opt.param_groups:
                    saved.append(g["lr"])
                    g["lr"] = g["lr"] * self.p["factor"]

        def post(opt, args, kwargs):
            for g, lr in zip(opt.param_groups, saved):
                g["lr"] = lr
            saved.clear()

        st.optimizer.register_step_pre_hook(pre)
        st.optimizer.register_step_post_hook(post)


@register_fault
class NonfiniteGrads(Fault):
    """A fraction of optimizer steps get a NaN gradient (an overflow in a fused kernel, a bad
    token at a padded position); tether skips those steps and counts them."""

    name, family, cause, seam = "nonfinite_grads", "optimisation", "numerical_instability", "loss"
    severities = {"subtle": {"p": 0.15}, "obvious": {"p": 0.5}}

    def install(self, st, cfg, step_fn):
        param = next(p for p in st.policy.model.parameters() if p.requires_grad)
        calls = {"n": 0}

        def hook(grad):
            calls["n"] += 1
            step = step_fn()
            if self.active(step) and self.coin(step, calls["n"]) < self.p["p"]:
                return torch.full_like(grad, math.nan)
            return grad

        param.register_hook(hook)


@register_fault
class LowTemperature(Fault):
    """The sampling temperature is set far below 1 from `start` on (a copied eval config): the
    policy sharpens on its own greedy outputs and exploration collapses."""

    name, family, cause, seam = "low_temperature", "optimisation", "entropy_collapse", "sampler"
    remediable = True  # raising the temperature restores exploration
    severities = {"subtle": {"factor": 0.6}, "obvious": {"factor": 0.3}}

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            self.set(st, "rollout.sampling.temperature", cfg.rollout.sampling.temperature * self.p["factor"])
            self._done = True


@register_fault
class EntropyBonus(Fault):
    """An entropy bonus far too large is switched on (a sign or scale slip in the loss config):
    entropy grows step after step and the answers dissolve into noise."""

    name, family, cause, seam = "entropy_bonus", "optimisation", "entropy_explosion", "loss"
    remediable = True  # a KL anchor / smaller steps hold the policy near the reference
    severities = {"subtle": {"coef": 0.07}, "obvious": {"coef": 0.15}}

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            self.set(st, "algo.entropy_coef", self.p["coef"])
            self._done = True
