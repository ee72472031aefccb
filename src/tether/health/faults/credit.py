"""Credit-assignment faults: advantages with the wrong sign, samples grouped with the wrong
prompt (Search-R1#88: same-prompt samples without a shared uid), noisy advantages."""

from __future__ import annotations

import dataclasses

import torch

from tether.health.faults import Fault, register_fault


@register_fault
class AdvantageSignFlip(Fault):
    """The advantages of a fraction of groups are negated (a sign slip in an estimator branch)."""

    name, family, cause, seam = "advantage_sign_flip", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"p": 0.35}, "obvious": {"p": 1.0}}

    def on_advantages(self, adv_BT, group_B, step):
        groups = sorted(set(group_B.tolist()))
        flip = torch.tensor([self.coin(step, g) < self.p["p"] for g in groups], dtype=torch.bool)
        sign_G = torch.where(flip, -1.0, 1.0)
        index = {g: i for i, g in enumerate(groups)}
        sign_B = sign_G[torch.tensor([index[g] for g in group_B.tolist()], dtype=torch.long)]
        return adv_BT * sign_B[:, None].to(adv_BT.dtype)


@register_fault
class GroupMixing(Fault):
    """Samples of different prompts are put in one group (uids not shared per prompt): each
    sample's advantage is measured against other prompts' rewards."""

    name, family, cause, seam = "group_mixing", "credit_assignment", "grouping_bug", "advantage"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        rng = self.rng(step)
        chosen = [i for i in range(len(groups)) if rng.random() < self.p["p"]]
        if len(chosen) < 2:
            return groups
        pool = [t for i in chosen for t in groups[i].trajectories]
        rng.shuffle(pool)
        out, k = list(groups), 0
        for i in chosen:
            n = len(groups[i].trajectories)
            out[i] = dataclasses.replace(groups[i], trajectories=tuple(pool[k:k + n]))
            k += n
        return out


@register_fault
class AdvantageNoise(Fault):
    """Gaussian noise of `sigma` x the advantage std is added per sequence (a stale or
    mis-indexed baseline): the learning signal drowns."""

    name, family, cause, seam = "advantage_noise", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"sigma": 1.0}, "obvious": {"sigma": 4.0}}

    def on_advantages(self, adv_BT, group_B, step):
        gen = torch.Generator().manual_seed(int(self.coin("noise", step) * 2**62))
        nonzero = adv_BT[adv_BT != 0]
        scale = float(nonzero.std()) if nonzero.numel() > 1 else 1.0
        noise_B = torch.randn(adv_BT.shape[0], generator=gen) * self.p["sigma"] * scale
        return adv_BT + noise_B[:, None].to(adv_BT.dtype) * (adv_BT != 0).to(adv_BT.dtype)
