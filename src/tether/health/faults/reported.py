"""Faults modelled on bugs that users of peer frameworks reported (docs/design.md, "Correctness rules
the code relies on"):
written against the public fault API only (seams, `view`, `base`, `start_step`), so they double
as examples of faults a user can write in one file.

reward        reward_misindexed (verl PR#6310), reward_inverted (from step 1), nan_reward (ms-swift#8123)
optimisation  clip_disabled (trl#3120: clipping never fires), epoch_overuse (a copied PPO config)
credit        eos_masked (trl PR#4970/#6357: pad == eos), group_split (trl#2858: groups cut at the
              wrong n), advantage_double_norm (gem PR#113: advantages normalised twice)
data          duplicate_prompts (ranks reading the same shard), shuffled_labels (a misaligned join)
system        rollout_topk (an engine default top-k, from step 1), partial_sync (SkyRL#1680 /
              verl#7495: part of the weights never reaches the engine, the version advances)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from typing import Any, Mapping

import torch

from tether.health.faults import Fault, register_fault
from tether.types import Outcome

_NAN_RNG = random.Random(0)


def _with_rewards(g: Any, totals: list[float]) -> Any:
    trajs = tuple(dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=r)) for t, r in zip(g.trajectories, totals))
    return dataclasses.replace(g, trajectories=trajs)


# ----------------------------------------------------------------------------- reward


@register_fault
class RewardMisindexed(Fault):
    """Each reward is written to the next sample of its group (an off-by-one in the reward's
    index, verl PR#6310): rewards are real, but belong to other samples."""

    name, family, cause, seam = "reward_misindexed", "reward", "misaligned_reward", "reward"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for i, g in enumerate(groups):
            if self.coin(step, i) < self.p["p"] and len(g.trajectories) > 1:
                r = [t.reward.total for t in g.trajectories]
                g = _with_rewards(g, r[-1:] + r[:-1])
            out.append(g)
        return out


@register_fault
class RewardInverted(Fault):
    """The correctness check is inverted from the first step (a verifier returning 1 on a
    mismatch): the run starts learning wrong answers. One severity."""

    name, family, cause, seam = "reward_inverted", "reward", "misaligned_reward", "reward"
    severities = {"obvious": {}}
    start_step = 1

    def on_rollouts(self, groups, step):
        return [_with_rewards(g, [1.0 - t.reward.total if t.reward.outcome == Outcome.OK else t.reward.total
                                  for t in g.trajectories]) for g in groups]


def nan_sometimes(text: str, task: Mapping[str, Any], *, inner: str, p: float = 0.1) -> float:
    """`inner`, but NaN with probability `p` (one None/NaN reward poisoned every GDPO advantage)."""
    from tether.rewards.base import load_reward_fn

    return math.nan if _NAN_RNG.random() < p else load_reward_fn(inner)(text, task)


@register_fault
class NanReward(Fault):
    """The reward returns NaN for a fraction of samples (ms-swift#8123); tether marks them invalid."""

    name, family, cause, seam = "nan_reward", "reward", "reward_failures", "reward"
    severities = {"subtle": {"p": 0.1}, "obvious": {"p": 0.4}}

    def begin_step(self, st, cfg, step):
        if self.wrap_first_reward(st, cfg, "tether.health.faults.reported:nan_sometimes", p=self.p["p"]):
            _NAN_RNG.seed(self.seed)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class ClipDisabled(Fault):
    """PPO clipping is switched off (a clip range of 1000) in a multi-epoch config (`base`:
    3 epochs x 2 mini-batches), where clipping is what bounds each update."""

    name, family, cause, seam = "clip_disabled", "optimisation", "lr_too_high", "loss"
    remediable = True  # restore_clip
    severities = {"subtle": {"clip": 1000.0, "lr_factor": 2.0}, "obvious": {"clip": 1000.0, "lr_factor": 5.0}}
    base = ("algo.epochs=3",)

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            self.set(st, "algo.policy_loss.clip_low", self.p["clip"])
            self.set(st, "algo.policy_loss.clip_high", self.p["clip"])
            for g in st.optimizer.param_groups[:1]:  # the run this config came from used a larger LR
                g["lr"] *= self.p["lr_factor"]
            if getattr(st, "scheduler", None) is not None:
                st.scheduler.base_lrs[0] *= self.p["lr_factor"]
            self._done = True


@register_fault
class EpochOveruse(Fault):
    """Each rollout batch is trained on for many epochs (a PPO config copied into GRPO): the
    policy moves far from the one that sampled within each step."""

    name, family, cause, seam = "epoch_overuse", "optimisation", "lr_too_high", "loss"
    remediable = True  # lower_epochs
    severities = {"subtle": {"epochs": 4}, "obvious": {"epochs": 8}}

    def begin_step(self, st, cfg, step):
        if not getattr(self, "_done", False):
            self.set(st, "algo.epochs", int(self.p["epochs"]))
            self._done = True


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class EosMasked(Fault):
    """The loss mask drops each sequence's last sampled token (mask built from token values with
    pad == eos, trl PR#4970): the model is never trained to stop."""

    name, family, cause, seam = "eos_masked", "credit_assignment", "loss_mask_bug", "loss"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT.clone()
        n_B = (mask > 0).sum(-1)
        for b in range(mask.shape[0]):
            if n_B[b] > 0 and self.coin(step, b) < self.p["p"]:
                last = int((mask[b] > 0).nonzero()[-1])
                mask[b, last] = 0
        return dataclasses.replace(batch, loss_mask_BT=mask)


@register_fault
class GroupSplit(Fault):
    """Groups are cut at the wrong size (n/2 instead of n, trl#2858): each half is normalised on
    its own, with half the samples a baseline needs."""

    name, family, cause, seam = "group_split", "credit_assignment", "grouping_bug", "advantage"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for i, g in enumerate(groups):
            k = len(g.trajectories) // 2
            if k >= 1 and self.coin(step, i) < self.p["p"]:
                out += [dataclasses.replace(g, trajectories=g.trajectories[:k]),
                        dataclasses.replace(g, trajectories=g.trajectories[k:])]
            else:
                out.append(g)
        return out


@register_fault
class AdvantageDoubleNorm(Fault):
    """Advantages are normalised a second time over the whole batch (gem PR#113): `subtle`
    subtracts the batch mean again, `obvious` also divides by the batch std."""

    name, family, cause, seam = "advantage_double_norm", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"scale": False}, "obvious": {"scale": True}}

    def on_advantages(self, adv_BT, group_B, step):
        nz = adv_BT != 0
        if int(nz.sum()) < 2:
            return adv_BT
        vals = adv_BT[nz]
        out = adv_BT - vals.mean()
        if self.p["scale"]:
            out = out / (vals.std() + 1e-6)
        return torch.where(nz, out, adv_BT)


# ----------------------------------------------------------------------------- data


@register_fault
class DuplicatePrompts(Fault):
    """A fraction of each step's problems are copies of others (every data-parallel rank reads
    the same shard): fewer distinct problems, each counted several times."""

    name, family, cause, seam = "duplicate_prompts", "data", "duplicate_problems", "data"
    severities = {"subtle": {"p": 0.25}, "obvious": {"p": 0.75}}

    def on_problems(self, problems, step):
        k = max(1, int(round(len(problems) * (1 - self.p["p"]))))
        return [problems[i % k] for i in range(len(problems))]


@register_fault
class ShuffledLabels(Fault):
    """A fraction of problems carry another problem's answer (a join on a misaligned key)."""

    name, family, cause, seam = "shuffled_labels", "data", "data_corruption", "data"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 0.8}}

    def on_problems(self, problems, step):
        if not hasattr(self, "_data"):
            self._data = self.view.dataset if self.view is not None else ()
        data, out = self._data, []
        for p in problems:
            if data and self.coin("label", p.get("id")) < self.p["p"]:
                other = data[int(self.coin("other", p.get("id")) * len(data))]
                if str(other.get("answer")) != str(p.get("answer")):
                    p = dict(p, answer=other.get("answer"))
            out.append(p)
        return out


# ----------------------------------------------------------------------------- system


@register_fault
class RolloutTopK(Fault):
    """The rollout engine samples with a top-k filter from the first step (an engine default)
    and reports the filtered distribution's log-probs; the trainer scores the full one."""

    name, family, cause, seam = "rollout_topk", "system", "rollout_mismatch", "sampler"
    severities = {"subtle": {"top_k": 12}, "obvious": {"top_k": 3}}
    start_step = 1

    def on_sampler(self, policy, sampling, step):
        update = {"top_k": int(self.p["top_k"])}
        if "keep_mask" in type(sampling).model_fields:  # the trainer mirroring the sampling mask would hide it
            update["keep_mask"] = False
        return policy, sampling.model_copy(update=update)


@register_fault
class PartialSync(Fault):
    """Part of the weights never reaches the rollout engine (SkyRL#1680, verl#7495), while the
    engine reports the trainer's version: `subtle` one tensor stays stale, `obvious` half."""

    name, family, cause, seam = "partial_sync", "system", "stale_weights", "weight_sync"
    severities = {"subtle": {"every": 0}, "obvious": {"every": 2}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
            names = [n for n, _ in policy.model.named_parameters()]
            every = int(self.p["every"])
            self._stale = set(names[::every]) if every else {names[len(names) // 2]}
        else:
            state = {k: v for k, v in policy.model.state_dict().items() if k not in self._stale}
            with torch.no_grad():
                self._engine.model.load_state_dict(state, strict=False)
        self._engine.version = policy.version
        return self._engine, sampling
