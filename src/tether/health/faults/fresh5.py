"""A fifth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL or training framework reported (the source is named
in its docstring) and acts at one seam of the fault API. They were written without looking at how
the health layer detects or diagnoses them, and never used to tune it; the effect of each on
training (accuracy, reward) was checked once against a healthy control, nothing else
(benchmarks/results/faultbench_fresh5_effect.json).

taxonomy    reward_special_token_suffix (reward: noisy_reward), advantages_from_previous_batch
            (credit_assignment: advantage_bug), adam_state_reset (optimisation: lr_too_high),
            sync_one_replica (system: stale_weights)
outside     adam_betas_swapped (optimisation), microbatch_grads_zeroed (optimisation),
            loader_answer_length_filter (data), grads_applied_late (system): `cause = UNEXPLAINED`,
            no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.types import RewardResult, StopReason

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardSpecialTokenSuffix(Fault):
    """The reward function is handed completions decoded with their special tokens, so a finished
    answer arrives as "7<|im_end|>" and the exact-match / anchored-regex check fails on it (verl
    PR#715: with `skip_special_tokens=False` a completion "will be decoded as ...<|im_end|>
    <|endoftext|>, which will render typical format_reward_func mismatch"; trl#2897 and
    verl#3958, the same decode switch seen from the other side). Only completions that ended on
    the engine's stop token carry the suffix; truncated ones end on an ordinary token and are
    scored right. A correct finished completion gets reward 0 and the verifier's verdict False
    (the same string check); wrong ones are unaffected (0 either way). `subtle`: a fraction `p`
    of them (the prompts whose template ends the turn on the special id rather than a stop
    string); `obvious`: most. Label noisy_reward: correct answers are not reliably paid."""

    name, family, cause, seam = "reward_special_token_suffix", "reward", "noisy_reward", "reward"
    severities = {"subtle": {"p": 0.25}, "obvious": {"p": 0.8}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            trajs = []
            for i, t in enumerate(g.trajectories):
                hit = (t.reward.correct is True and t.stop == StopReason.EOS
                       and self.coin(step, g.task_id, i) < float(self.p["p"]))
                if hit:
                    r = t.reward
                    t = dataclasses.replace(t, reward=RewardResult(0.0, {k: 0.0 for k in r.components}, r.outcome, False, r.error))
                trajs.append(t)
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


# ----------------------------------------------------------------------------- credit assignment


def _row_values(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] each row's mean advantage over its loss tokens, [B, T] bool loss mask)."""
    mask = batch.loss_mask_BT > 0
    n = mask.sum(-1).clamp(min=1)
    return (batch.advantages_BT * mask).sum(-1) / n, mask


@register_fault
class AdvantagesFromPreviousBatch(Fault):
    """The advantages the loss uses were computed for the previous step's batch: a pipelined
    trainer pairs the batch it trains on with the advantage buffer of the batch before it (the
    class of async-loop bookkeeping bugs where the trainer and the rollout producer are one batch
    apart: radixark/miles PR#1829, the async loop trains "at least one update behind" with
    mis-attributed quantities; rllm-org/rllm PR#493, an async path that skipped
    `compute_advantages` and reused what was there). Row b of this step gets the advantage row b
    of the previous step had (its per-token mean, spread over row b's loss tokens); the first
    faulty step has nothing queued and passes through. Rewards, mask and log-probs are this
    step's. `subtle`: a fraction `p` of the rows (one of several data-parallel shards out of
    step); `obvious`: all rows. Label advantage_bug: the advantage estimates the loss reads are
    wrong for the samples they weight (the rewards and grouping are right)."""

    name, family, cause, seam = "advantages_from_previous_batch", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        if batch.advantages_BT is None:
            return batch
        now, mask = _row_values(batch)
        prev, self._prev = getattr(self, "_prev", None), now.detach().clone()
        if prev is None:
            return batch
        B = now.shape[0]
        rows = torch.tensor([b < prev.shape[0] and self.coin(step, "row", b) < float(self.p["p"]) for b in range(B)],
                            device=now.device)
        if not bool(rows.any()):
            return batch
        old = torch.zeros_like(now)
        k = min(B, prev.shape[0])
        old[:k] = prev[:k].to(now)
        adv = torch.where(rows[:, None] & mask, old[:, None].expand_as(batch.advantages_BT), batch.advantages_BT)
        return dataclasses.replace(batch, advantages_BT=adv)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class AdamStateReset(Fault):
    """Adam's moments are lost before optimizer steps: the optimizer is rebuilt (or its state
    reloaded empty) between steps, so each step is Adam's first, lr x m/sqrt(v) with m and v of
    one gradient, i.e. about lr x sign(g) on every element (OpenNMT-py#617: `set_parameters`
    "always creates an entirely new optimizer and erases the previously loaded optimizer state";
    thinking-machines-lab/tinker-feedback#126, a resume that "restores cold Adam state";
    NVlabs/stylegan2-ada-pytorch#108: without the state "the first training iteration will
    update all weights with the same value (only differ in +/- sign)"). The policy's parameter
    group only. `subtle`: on every third training step (an offload/reload cycle every 3 steps);
    `obvious`: before every optimizer step. Label lr_too_high: every element moves by the full
    learning rate, an update far larger than Adam's steady state. Not remediable: lowering the
    learning rate shrinks it but leaves the state lost."""

    name, family, cause, seam = "adam_state_reset", "optimisation", "lr_too_high", "optimizer_state"
    severities = {"subtle": {"every": 3}, "obvious": {"every": 1}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        if (step - self.start) % int(self.p["every"]):
            return
        for q in optimizer.param_groups[0]["params"]:
            optimizer.state.pop(q, None)


@register_fault
class AdamBetasSwapped(Fault):
    """Adam's two decay rates arrive swapped: the first moment decays with the second's rate
    and the other way round (mila-iqia/blocks#1159 "Adam moment parameterization is backwards":
    a beta meant for one moment read as the other, "my second moment estimates decayed faster
    than an anxious squirrel"; a config's `betas` list read in the wrong order). With beta1 >
    beta2 the momentum barely moves: each step keeps following the average gradient of many
    steps ago while the denominator tracks only the last few. `subtle`: (0.95, 0.9) from a config
    of (0.9, 0.95); `obvious`: (0.999, 0.9) from the defaults (0.9, 0.999). The policy's
    parameter group only; lr, eps and the state are untouched. Outside the taxonomy: the update's
    size is not the problem (no larger than Adam's usual) and nothing is frozen; its direction
    lags the current gradient, which no cause names."""

    name, family, cause, seam = "adam_betas_swapped", "optimisation", UNEXPLAINED, "optimizer"
    severities = {"subtle": {"betas": (0.95, 0.9)}, "obvious": {"betas": (0.999, 0.9)}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        optimizer.param_groups[0]["betas"] = tuple(float(b) for b in self.p["betas"])


@register_fault
class MicrobatchGradsZeroed(Fault):
    """`zero_grad` runs before each micro-batch's backward instead of once per optimizer step, so
    only the last micro-batch's gradient reaches the step (pytorch/torchtitan PR#3575: "zeroing
    grad from all micro-batches except the last one, i.e. no accumulation"; allenai/open-instruct
    PR#1498: with ZeRO-2 "only the last micro-batch's gradient survives to step()"). The losses
    keep the mini-batch's global normaliser, so the surviving gradient is a fraction of the
    batch's, scaled down. Runs with a small micro-batch token budget (`base`) so a mini-batch has
    several micro-batches. `subtle`: the gradients are wiped before a fraction `p` of the
    micro-batches (a conditional path); `obvious`: before every one. Outside the taxonomy: the
    loss, its mask and normaliser, the advantages and the learning rate are right; what the step
    sees is the gradient of part of the batch, which no cause names."""

    name, family, cause, seam = "microbatch_grads_zeroed", "optimisation", UNEXPLAINED, "loss"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}
    base = ("train.micro_batch_tokens=256",)

    def on_loss(self, terms, mb, step):
        self._micro = getattr(self, "_micro", 0) + 1
        if self._micro > 1 and self.coin(step, "micro", self._micro) < float(self.p["p"]):
            for q in self.view.policy.model.parameters():
                q.grad = None
        return terms

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        self._micro = 0  # the next micro-batch is the first of a new accumulation


# ----------------------------------------------------------------------------- data


@register_fault
class LoaderAnswerLengthFilter(Fault):
    """A length filter in the data pipeline drops every problem whose gold answer is longer than
    one character (a `max_target_length` / overlong filter applied to the label column; verl#502
    and PR#506, length filtering of the RL dataset done silently at load time, `filter_overlong_
    prompts`; axolotl PR#452 "always drop samples that are too long"). The loader hands out the
    surviving problems only: each dropped slot is refilled with the next survivor of the training
    set, so negative results and two-digit products are never trained on. `subtle`: a fraction
    `p` of each step's slots go through the filtered loader (one of several data files
    filtered); `obvious`: every slot. Outside the taxonomy: the problems handed out are correct,
    intact and not leaked, and no more repeated than a smaller dataset repeats them; what is
    wrong is which part of the data the run sees, which no data cause names."""

    name, family, cause, seam = "loader_answer_length_filter", "data", UNEXPLAINED, "data"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        if not hasattr(self, "_kept"):
            data = self.view.dataset if self.view is not None else ()
            self._kept, self._at = [dict(p) for p in data if len(str(p.get("answer", "")).strip()) <= 1], 0
        if not self._kept:
            return problems
        out = []
        for i, p in enumerate(problems):
            if len(str(p.get("answer", "")).strip()) > 1 and self.coin(step, "slot", i) < float(self.p["p"]):
                p, self._at = self._kept[self._at % len(self._kept)], self._at + 1
            out.append(p)
        return out


# ----------------------------------------------------------------------------- system


@register_fault
class SyncOneReplica(Fault):
    """The weight sync reaches only some of the rollout engine's replicas: the trainer broadcasts
    to the first engine and the others keep the weights they had (OpenRLHF#660 and
    OpenRLHF-M#6, `_broadcast_to_vllm` "does not seem to update the vllm weights", "only updates
    a few layers" / only rank 0's; the class of a broadcast loop over `vllm_engines` that serves
    one of them). The replicas take the rollouts in turn, one per step; an unsynced replica
    serves the weights of the fault's start step and reports the trainer's current version.
    `subtle`: one replica of four is missed (stale weights one step in four); `obvious`: seven
    of eight (stale seven steps in eight). The first effect check had `obvious` at three of four:
    final_train_acc 0.39 vs 0.44 healthy, rollout accuracy 0.35 vs 0.37, within about one seed's
    noise (benchmarks/results/faultbench_fresh5_effect.json), so it was made stronger once.
    Label stale_weights: the engine runs weights the sync did not deliver."""

    name, family, cause, seam = "sync_one_replica", "system", "stale_weights", "weight_sync"
    severities = {"subtle": {"replicas": 4, "stale": (3,)}, "obvious": {"replicas": 8, "stale": (1, 2, 3, 4, 5, 6, 7)}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        if (step - self.start) % int(self.p["replicas"]) not in tuple(self.p["stale"]):
            return policy, sampling
        self._engine.version = policy.version
        return self._engine, sampling


@register_fault
class GradsAppliedLate(Fault):
    """The optimizer steps on the gradient buffer of an earlier update: the step is issued before
    the asynchronous gradient reduction of the current backward has landed, so it consumes the
    reduced gradient still sitting in the buffer from before (the overlap-communication class of
    bugs: allenai/open-instruct PR#1498, gradient buffers reset and read at the wrong boundary;
    the optimizer stepping inside the accumulation loop, EleutherAI/gpt-neox#405). The gradients
    of each optimizer step are those of the optimizer step `delay` updates earlier (the first
    `delay` steps after the start apply zero gradients: nothing had landed). `subtle`: one update
    late; `obvious`: four updates late (two training steps). Outside the taxonomy: every
    gradient is a correct gradient of a correct loss, applied at the right size; it is applied to
    weights that have since moved, which no cause names."""

    name, family, cause, seam = "grads_applied_late", "system", UNEXPLAINED, "gradients"
    severities = {"subtle": {"delay": 1}, "obvious": {"delay": 4}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        queue = self.__dict__.setdefault("_queue", [])
        group = optimizer.param_groups[0]["params"]
        queue.append([None if q.grad is None else q.grad.detach().clone() for q in group])
        late = queue.pop(0) if len(queue) > int(self.p["delay"]) else [None] * len(group)
        for q, g in zip(group, late):
            if q.grad is not None:
                q.grad.copy_(g if g is not None else torch.zeros_like(q.grad))
