"""Faults at the seams inside the update and around the sampler (issue 41): the loss mask by
position, the trainer's own forward, the KL term and the reference model, the optimizer and its
state, the loss normaliser, pi_old, the sampler's non-parameter state, the data and the rewards.

Which of them the benchmark tunes on and which it holds out is fixed in `split.py`. Four stand
for causes outside the diagnosis taxonomy (`cause = UNEXPLAINED`): a correct doctor reports them
as an unexplained anomaly with the evidence, not as the nearest known cause.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.health.faults.optimisation import LRSpike

# ----------------------------------------------------------------------------- credit assignment / loss


@register_fault
class MaskShift(Fault):
    """The loss mask of a fraction of rows is moved one position right (labels shifted against
    the ids): the first sampled token is not trained, the position after the last one is. The
    mask's token count stays the same, so a count check passes."""

    name, family, cause, seam = "mask_shift", "credit_assignment", "loss_mask_bug", "loss_mask"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT.clone()
        for b in range(mask.shape[0]):
            if self.coin(step, b) < self.p["p"]:
                mask[b, 1:] = batch.loss_mask_BT[b, :-1]
                mask[b, 0] = 0
        return dataclasses.replace(batch, loss_mask_BT=mask)


@register_fault
class NormWrong(Fault):
    """The loss normaliser counts more tokens and sequences than the mini-batch holds (padding and
    prompt positions counted, a normaliser computed over another batch): every term is scaled down."""

    name, family, cause, seam = "norm_wrong", "credit_assignment", "loss_norm_bug", "normaliser"
    severities = {"subtle": {"factor": 1.5}, "obvious": {"factor": 4.0}}

    def on_norm(self, norm, mini, step):
        f = self.p["factor"]
        return dataclasses.replace(norm, num_tokens=norm.num_tokens * f, num_seqs=norm.num_seqs * f)


@register_fault
class LossSignFlip(Fault):
    """The policy-gradient term of a fraction of mini-batches is negated in the loss (a sign slip
    in a loss branch) while the advantages are right: the update moves against them. Outside the
    taxonomy (no cause names a gradient that contradicts correct advantages)."""

    name, family, cause, seam = "loss_sign_flip", "optimisation", UNEXPLAINED, "loss"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_loss(self, terms, mb, step):
        self._calls = getattr(self, "_calls", 0) + 1
        if self.coin(step, self._calls) < self.p["p"]:
            return {**terms, "pg": -terms["pg"]}
        return terms


# ----------------------------------------------------------------------------- the KL term and the reference


KL_BASE = ("algo.kl.coef=0.1",)  # a KL anchor in the loss (the reference: the starting weights)


def repaid(r, value: float):
    """A reward `r` with its first component (the correctness check) and its total moved to `value`,
    and its verdict `correct` set to value > 0.5: how a fault re-scores a sample (fresh9, fresh10)."""
    comps = dict(r.components)
    old = 0.0
    if comps:
        first = next(iter(comps))
        old, comps[first] = float(comps[first]), value
    total = value if not r.components else float(r.total) - old + value
    return dataclasses.replace(r, total=total, components=comps, correct=value > 0.5)


@register_fault
class KLDetached(Fault):
    """The KL term is detached from the graph (computed under no_grad, SkyRL PR#1353): its value
    is logged, its gradient never reaches the policy; `subtle` on a fraction of micro-batches."""

    name, family, cause, seam = "kl_detached", "optimisation", "kl_inactive", "loss"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}
    base = KL_BASE

    def on_loss(self, terms, mb, step):
        self._calls = getattr(self, "_calls", 0) + 1
        if "kl" in terms and self.coin(step, self._calls) < self.p["p"]:
            return {**terms, "kl": terms["kl"].detach()}
        return terms


@register_fault
class RefIsPolicy(Fault):
    """The reference model follows the policy (it shares the actor's weights, or is re-synced to
    them): the KL anchor holds nothing. `obvious`: the live policy; `subtle`: a copy re-synced
    every `every` steps."""

    name, family, cause, seam = "ref_is_policy", "optimisation", "kl_inactive", "reference"
    severities = {"subtle": {"every": 3}, "obvious": {"every": 0}}
    base = KL_BASE

    def on_reference(self, ref, policy, step):
        every = int(self.p["every"])
        if not every or ref is None:
            return policy if ref is not None else ref
        if not hasattr(self, "_ref") or (step - self.start) % every == 0:
            from tether.policy.reference import make_reference

            self._ref = make_reference(policy)
        return self._ref


# ----------------------------------------------------------------------------- the trainer's forward


@register_fault
class TrainerForwardMismatch(Fault):
    """The trainer's gradient forward differs from the sampler's and from its own scoring pass
    (a layer active only with gradients, another temperature in the loss's forward: tinker-cloud
    PR#26): the final hidden state is divided by `temp` whenever gradients are on."""

    name, family, cause, seam = "trainer_forward_mismatch", "system", "rollout_mismatch", "forward"
    severities = {"subtle": {"temp": 1.15}, "obvious": {"temp": 1.6}}

    def install(self, st, cfg, step_fn):
        def hook(module, args, out):
            if torch.is_grad_enabled() and self.active(step_fn()):
                return out / self.p["temp"]
            return out

        st.policy.model.get_decoder().norm.register_forward_hook(hook)


@register_fault
class SamplerBuffers(Fault):
    """The rollout engine receives the trainer's weights every step, but its non-parameter state
    differs: its rotary frequency table (a buffer, not a parameter) comes from another rope theta
    (an engine config that does not carry the model's). The parameter checksum matches."""

    name, family, cause, seam = "sampler_buffers", "system", "rollout_mismatch", "sampler"
    severities = {"subtle": {"scale": 0.9}, "obvious": {"scale": 0.6}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
            for name, buf in self._engine.model.named_buffers():
                if name.endswith("inv_freq"):
                    buf.mul_(self.p["scale"])
        else:  # the weights arrive; buffers are not in the synced state (non-persistent)
            with torch.no_grad():
                for p_eng, p in zip(self._engine.model.parameters(), policy.model.parameters()):
                    p_eng.copy_(p)
        self._engine.version = policy.version
        return self._engine, sampling


# ----------------------------------------------------------------------------- the optimizer and its state


@register_fault
class FrozenParams(Fault):
    """A fraction of the policy's parameter tensors never get a gradient into the optimizer (a
    `requires_grad` lost after a reload, tensors missing from the optimizer): they stop moving while
    every logged signal stays calm."""

    name, family, cause, seam = "frozen_params", "optimisation", "no_progress", "optimizer"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 0.95}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        own = optimizer.param_groups[0]["params"]
        for i, p in enumerate(own):
            if self.coin("frozen", i) < self.p["p"]:
                p.grad = None


@register_fault
class HiddenLRCrash(LRSpike):
    """Every optimizer step runs at `factor` x the configured LR (a scheduler that decays per
    micro-batch, an LR scaled by a world size of 100); the logged LR shows the configured value.
    lr_spike's optimizer hooks with a factor below one."""

    name, family, cause, seam = "hidden_lr_crash", "optimisation", "no_progress", "optimizer"
    remediable = False
    severities = {"subtle": {"factor": 0.1}, "obvious": {"factor": 0.01}}


@register_fault
class AdamStateCorrupt(Fault):
    """At the fault's first step Adam's second moments are scaled by `scale` (moments restored in
    the wrong scale): every later step is ~1/sqrt(scale) x too large until they recover."""

    name, family, cause, seam = "adam_state_corrupt", "optimisation", "lr_too_high", "optimizer_state"
    remediable = True  # a rollback restores the moments; a lower LR bounds the step
    severities = {"subtle": {"scale": 0.1}, "obvious": {"scale": 0.01}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        if getattr(self, "_done", False):
            return
        for p in optimizer.param_groups[0]["params"]:
            st = optimizer.state.get(p, {})
            if "exp_avg_sq" in st:
                st["exp_avg_sq"].mul_(self.p["scale"])
        self._done = True


@register_fault
class WeightDecayNegative(Fault):
    """The decoupled weight decay gets the wrong sign (-`wd`): every step scales the weights up by
    lr x wd and their norm drifts. Outside the taxonomy (no cause names a drifting norm)."""

    name, family, cause, seam = "weight_decay_negative", "optimisation", UNEXPLAINED, "optimizer_state"
    severities = {"subtle": {"wd": 3.0}, "obvious": {"wd": 15.0}}

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            st.optimizer.param_groups[0]["weight_decay"] = -self.p["wd"]
            self._done = True


@register_fault
class GradAccumLeak(Fault):
    """The gradients are not cleared between optimizer steps (a zero_grad lost in a refactor):
    each step applies the sum of every gradient since the fault began. Outside the taxonomy."""

    name, family, cause, seam = "grad_accum_leak", "optimisation", UNEXPLAINED, "optimizer"
    severities = {"subtle": {"decay": 0.5}, "obvious": {"decay": 1.0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        own = optimizer.param_groups[0]["params"]
        prev = getattr(self, "_acc", None)
        acc = []
        for i, p in enumerate(own):
            g = p.grad
            if g is not None and prev is not None and prev[i] is not None:
                g.add_(prev[i], alpha=self.p["decay"])
            acc.append(None if g is None else g.detach().clone())
        self._acc = acc


@register_fault
class OldLogpShuffled(Fault):
    """pi_old's log-probs are attached to the wrong rows (rows of the scoring pass reordered, a
    gather with the wrong index): every importance ratio compares a sequence with another one's
    old log-probs. Outside the taxonomy."""

    name, family, cause, seam = "old_logp_shuffled", "credit_assignment", UNEXPLAINED, "old_logp"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_old_logp(self, old_BT, batch, step):
        B = old_BT.shape[0]
        rows = [b for b in range(B) if self.coin(step, "old", b) < self.p["p"]]
        if len(rows) < 2:
            return old_BT
        out = old_BT.clone()
        out[rows] = old_BT[rows[1:] + rows[:1]]
        return out


# ----------------------------------------------------------------------------- data, sampler, rewards


@register_fault
class AnswerLeak(Fault):
    """A fraction of prompts carry their gold answer (a template that includes the target field):
    the policy learns to copy it, and its accuracy no longer measures solving."""

    name, family, cause, seam = "answer_leak", "data", "answer_leakage", "data"
    severities = {"subtle": {"p": 0.6}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        return [dict(p, prompt=f"{p['answer']} {p['prompt']}") if self.coin("leak", p.get("id")) < self.p["p"]
                and isinstance(p.get("prompt"), str) else p for p in problems]


@register_fault
class DuplicateSamples(Fault):
    """The sampler returns copies within a group (one RNG seed per prompt instead of per sample):
    in a fraction of groups every sample repeats the first one."""

    name, family, cause, seam = "duplicate_samples", "system", "sampler_duplicates", "sampler"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for i, g in enumerate(groups):
            if len(g.trajectories) > 1 and self.coin(step, "dup", i) < self.p["p"]:
                first = g.trajectories[0]
                g = dataclasses.replace(g, trajectories=tuple(first for _ in g.trajectories))
            out.append(g)
        return out


@register_fault
class RewardShuffled(Fault):
    """The rewards of a fraction of groups come back in another order than the samples (results
    gathered in completion order): real rewards, paid to the wrong samples of their group."""

    name, family, cause, seam = "reward_shuffled", "reward", "misaligned_reward", "reward"
    severities = {"subtle": {"p": 0.4}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for i, g in enumerate(groups):
            if len(g.trajectories) > 1 and self.coin(step, "shuffle", i) < self.p["p"]:
                rewards = [t.reward for t in g.trajectories]
                self.rng(step * 1000 + i).shuffle(rewards)
                g = dataclasses.replace(g, trajectories=tuple(dataclasses.replace(t, reward=dataclasses.replace(
                    t.reward, total=r.total)) for t, r in zip(g.trajectories, rewards)))
            out.append(g)
        return out
