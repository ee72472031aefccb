"""A second held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL or training framework reported (the source is named
in its docstring) and acts at one seam of the fault API. They were written without looking at how
the health layer detects or diagnoses them, and never used to tune it.

taxonomy    reward_prefix_match (reward: exploitable_reward), optimizer_double_step (optimisation:
            lr_too_high), advantage_wrong_axis (credit_assignment: advantage_bug), answer_float_cast
            (data: data_corruption), sync_gate_up_swapped (system: rollout_mismatch)
outside     reload_missing_keys (system), grad_swap (optimisation), kl_sign_flip (optimisation):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.types import Outcome

# ----------------------------------------------------------------------------- reward


def _predicted(text: str) -> str:
    """The answer exact_match reads from a response: a stated convention, else the whole text."""
    from tether.rewards.verifiers import extract_answer

    found = extract_answer(text)
    return found if found is not None else text.strip()


@register_fault
class RewardPrefixMatch(Fault):
    """The verifier's comparison is written the wrong way round: it pays when the prediction is a
    *substring of* the gold answer (`pred in gold`), so an empty reply or one digit of a two-digit
    answer is paid like the right one. Source: substring reward matching flagged in verifiers
    PR#763 (`answer in final_answer`), here in the reverse direction. Label exploitable_reward:
    the reward pays for something other than correctness, and the policy can farm it by answering
    short. Not remediable: the paying component is the verifier itself (switching it off leaves no
    reward)."""

    name, family, cause, seam = "reward_prefix_match", "reward", "exploitable_reward", "reward"
    severities = {"subtle": {"pay": 0.5}, "obvious": {"pay": 1.0}}

    def on_rollouts(self, groups, step):
        return [dataclasses.replace(g, trajectories=tuple(self._paid(t, str(g.task.get("answer", "")).strip())
                                                          for t in g.trajectories)) for g in groups]

    def _paid(self, t, gold: str):
        """`t` with the reward the reversed comparison gives it (its own when that pays no more)."""
        if t.reward.outcome != Outcome.OK or t.reward.correct or _predicted(str(t.info.get("text", ""))) not in gold:
            return t
        return dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=max(t.reward.total, self.p["pay"])))


# ----------------------------------------------------------------------------- optimisation


@register_fault
class OptimizerDoubleStep(Fault):
    """`optimizer.step()` runs `repeats` times on each mini-batch's gradient (a step left inside the
    micro-batch loop besides the one at the accumulation boundary, or a wrapper that steps as well
    as the loop: reformer-pytorch#97, the accumulation-boundary bugs of diffusers#10855 and
    open-instruct PR#1642). Adam moves `repeats` x as far per step and its step counter and
    moments advance with it; the logged LR is the configured one. Label lr_too_high: the update
    is too large. Remediable: a lower LR brings the per-step move back down."""

    name, family, cause, seam = "optimizer_double_step", "optimisation", "lr_too_high", "optimizer"
    remediable = True
    severities = {"subtle": {"repeats": 2}, "obvious": {"repeats": 6}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        for _ in range(int(self.p["repeats"]) - 1):  # the real step follows (tether.train.update)
            optimizer.step()


@register_fault
class GradSwap(Fault):
    """Gradients are reduced into the wrong parameters: tensors of the same shape receive each
    other's gradient (a parameter order that differs between the model and its gradient buckets;
    pytorch#64629, FSDP assuming the same gradient order everywhere, and the silent "logical
    collective mismatch" of pytorch PR#75902). `subtle`: one pair of tensors; `obvious`: every
    group of same-shape tensors is rotated by one. The gradients' sizes stay right. Outside the
    taxonomy: the update reaches the weights, at the right size, but each tensor moves along
    another tensor's gradient."""

    name, family, cause, seam = "grad_swap", "optimisation", UNEXPLAINED, "optimizer"
    severities = {"subtle": {"pairs": 1}, "obvious": {"pairs": 0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in optimizer.param_groups[0]["params"]:
            if p.grad is not None:
                groups.setdefault(tuple(p.shape), []).append(p)
        same = sorted((ps for ps in groups.values() if len(ps) > 1), key=len, reverse=True)
        if self.p["pairs"]:
            same = [ps[:2] for ps in same[: int(self.p["pairs"])]]
        for ps in same:
            grads = [p.grad for p in ps]
            for p, g in zip(ps, grads[1:] + grads[:1]):
                p.grad = g


KL_BASE = ("algo.kl.coef=0.1",)  # a KL anchor in the loss (the reference: the starting weights)


@register_fault
class KLSignFlip(Fault):
    """The KL term enters the loss with the wrong sign (ToolRL#52: "Incorrect KL loss sign causes
    policy training collapse"): minimising the loss pushes the policy *away* from the reference,
    harder the further it has moved. `subtle`: a fraction of micro-batches (one loss branch).
    Outside the taxonomy: kl_inactive is an anchor that does nothing; this one repels."""

    name, family, cause, seam = "kl_sign_flip", "optimisation", UNEXPLAINED, "loss"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}
    base = KL_BASE

    def on_loss(self, terms, mb, step):
        self._calls = getattr(self, "_calls", 0) + 1
        if "kl" in terms and self.coin(step, "kl", self._calls) < self.p["p"]:
            return {**terms, "kl": -terms["kl"]}
        return terms


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class AdvantageWrongAxis(Fault):
    """The per-sequence advantages [B] are broadcast along the response positions instead of the
    rows (`adv[None, :R]` for `adv[:, None]`): the j-th response token of *every* row gets the
    advantage of sequence j. The silent broadcast when two sizes line up (the failure
    tensorflow#51968 warns of; dreamzero#25 is its loud form). `subtle`: only on a fraction of
    steps (a code path taken on some batches). Label advantage_bug: the estimator's output is
    wrong while the rewards and the mask are right."""

    name, family, cause, seam = "advantage_wrong_axis", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"p": 0.35}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        if self.coin(step, "axis") >= self.p["p"]:
            return batch
        mask = batch.loss_mask_BT > 0
        B = mask.shape[0]
        first = torch.where(mask.any(-1), mask.float().argmax(-1), 0)
        adv_B = batch.advantages_BT.gather(1, first[:, None])[:, 0] * mask.any(-1)
        j_BT = (mask.long().cumsum(-1) - 1).clamp(min=0) % B  # the position within the response
        adv = torch.where(mask, adv_B[j_BT], torch.zeros_like(batch.advantages_BT))
        return dataclasses.replace(batch, advantages_BT=adv.to(batch.advantages_BT.dtype))


# ----------------------------------------------------------------------------- data


@register_fault
class AnswerFloatCast(Fault):
    """Gold answers are stored as floats ("12" -> "12.0"): an integer column that held a missing
    value became a float column in data prep (the pandas integer-NA gotcha, macrosynergy PR#523).
    An exact-match verifier then never pays the right integer. `subtle`: the problems of the
    shards that had a missing value; `obvious`: all. Label data_corruption: wrong labels."""

    name, family, cause, seam = "answer_float_cast", "data", "data_corruption", "data"
    severities = {"subtle": {"p": 0.4}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        out = []
        for p in problems:
            if self.coin("float", p.get("id")) < self.p["p"]:
                try:
                    p = dict(p, answer=repr(float(p["answer"])))
                except (TypeError, ValueError):
                    pass  # not a number: a float column cannot hold it
            out.append(p)
        return out


# ----------------------------------------------------------------------------- system


FUSED = {"gate_up": ("gate_proj", "up_proj"), "qkv": ("q_proj", "k_proj")}  # the halves a fused tensor splits into


@register_fault
class SyncGateUpSwapped(Fault):
    """The weight sync hands the rollout engine every tensor of the trainer, but the converter
    splits fused projections in the wrong order, so the engine computes silu(up) * gate (the
    gate/up load-order bug of nntrainer PR#4194, "coherent-looking rather than obviously broken";
    SkyRL#1680 is a sync that silently corrupts rollouts the same way). `subtle`: the fused
    gate_up projection; `obvious`: the fused qkv projection too (q and k swapped). The version
    and the parameter set match. Label rollout_mismatch: the sampler's forward differs from the
    trainer's; the weights are current (not stale_weights)."""

    name, family, cause, seam = "sync_gate_up_swapped", "system", "rollout_mismatch", "weight_sync"
    severities = {"subtle": {"fused": ("gate_up",)}, "obvious": {"fused": ("gate_up", "qkv")}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        with torch.no_grad():
            for p_eng, p in zip(self._engine.model.parameters(), policy.model.parameters()):
                p_eng.copy_(p)
            for mod in self._engine.model.modules():
                for first, second in (FUSED[f] for f in self.p["fused"]):
                    a, b = getattr(mod, first, None), getattr(mod, second, None)
                    if a is not None and b is not None and a.weight.shape == b.weight.shape:
                        tmp = a.weight.clone()
                        a.weight.copy_(b.weight)
                        b.weight.copy_(tmp)
        self._engine.version = policy.version
        return self._engine, sampling


@register_fault
class ReloadMissingKeys(Fault):
    """At the fault's first step the trainer reloads its weights from a checkpoint with
    `strict=False`, and the keys of some tensors do not match (a `module.` / `_orig_mod.` prefix):
    those tensors silently keep a fresh random initialisation while the optimizer state and the
    step counter are restored (Search-R1#160 "initializes some weights from scratch" on resume,
    lerobot PR#4560: resume re-initialises the policy, nothing errors). `subtle`: one tensor;
    `obvious`: about half of the decoder's weight matrices. Outside the taxonomy: the weights
    change outside the optimizer, once, with nothing wrong in the data, rewards or update.
    Not remediable a priori: no action of the catalogue restores lost weights (a trial's
    rollback to an earlier snapshot may undo it incidentally)."""

    name, family, cause, seam = "reload_missing_keys", "system", UNEXPLAINED, "weights"
    severities = {"subtle": {"p": 0.0}, "obvious": {"p": 0.5}}

    def begin_step(self, st, cfg, step):
        if getattr(self, "_done", False):
            return
        self._done = True
        named = [(n, p) for n, p in st.policy.model.named_parameters() if ".layers." in n]
        mats = [(n, p) for n, p in named if p.dim() == 2]
        lost = [(n, p) for n, p in mats if self.coin("key", n) < self.p["p"]] or mats[-4:-3]  # subtle: one tensor
        gen = torch.Generator().manual_seed(int(self.coin("init", step) * 2**62))
        std = float(getattr(st.policy.model.config, "initializer_range", 0.02))
        with torch.no_grad():
            for _, p in lost:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p) * std)
        self.lost = [n for n, _ in lost]
