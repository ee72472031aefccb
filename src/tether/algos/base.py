"""Typed inputs and outputs shared by every registered algorithm function, and the registries.

Every function registered in one registry has the same signature:

    ADVANTAGES[name](AdvantageInputs, AdvantageConfig) -> AdvantageOutputs
    POLICY_LOSSES[name](PolicyLossInputs, PolicyLossConfig) -> (loss_BT, metrics)
    KL_ESTIMATORS[name](KLInputs, KLConfig) -> kl_BT
    IS_CORRECTIONS[mode](ISInputs, ISCorrectionConfig) -> (weights_BT, metrics)
    GROUP_FILTERS[name](outcomes_G: list[float], DynamicSamplingConfig) -> bool (keep)

Shapes: B sequences, T tokens (right-padded). `mask_BT` is a float {0,1} loss mask built from
lengths and stop reasons (never from token values). Metrics are dicts of 0-dim tensors (detached).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tether.registry import Registry

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class AdvantageInputs:
    """Inputs of an advantage estimator.

    scores_B:        [B] float, scalar outcome reward of the trajectory each sequence belongs to
    token_rewards_BT:[B,T] float, per-token rewards: the outcome on the last action token plus any
                     per-token terms (KL-in-reward penalty, step rewards); read by token-level
                     estimators (reinforce_pp, gae); outcome estimators read `scores_B`
    mask_BT:         [B,T] float {0,1}, loss mask (action tokens)
    group_B:         [B] long, group index: sequences from the same problem share it
    traj_B:          [B] long, trajectory index: sequences from one episode share it (multi-turn
                     episodes with non-append context become several sequences); group statistics
                     count each trajectory once
    valid_B:         [B] bool, False where the reward failed (error/timeout/invalid) and is
                     masked: excluded from group statistics, advantage exactly 0
    values_BT:       [B,T] float critic values V(s_t) (gae only)
    baseline_B:      [B] float greedy-rollout reward (remax only)
    task_B:          [B] long task-type index (task-level normalisation, multi-task runs)
    step_BT:         [B,T] long turn index of each action token within its episode, -1 elsewhere
                     (turn-level estimators: gigpo, step_grpo)
    anchor_BT:       [B,T] long anchor-state id of each action token's turn, -1 elsewhere: turns of
                     one group that acted on an identical observation share it (gigpo)
    """

    scores_B: torch.Tensor
    token_rewards_BT: torch.Tensor
    mask_BT: torch.Tensor
    group_B: torch.Tensor
    traj_B: torch.Tensor
    valid_B: torch.Tensor
    values_BT: torch.Tensor | None = None
    baseline_B: torch.Tensor | None = None
    task_B: torch.Tensor | None = None
    step_BT: torch.Tensor | None = None
    anchor_BT: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageOutputs:
    advantages_BT: torch.Tensor  # [B,T], exactly 0 off-mask and on invalid sequences
    returns_BT: torch.Tensor | None = None  # [B,T] value targets (gae)


@dataclass(frozen=True)
class PolicyLossInputs:
    """logp_BT carries the gradient; old_logp_BT (pi_old, trainer log-probs at the start of the
    update) and advantages_BT are constants; all [B,T]."""

    logp_BT: torch.Tensor
    old_logp_BT: torch.Tensor
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor


@dataclass(frozen=True)
class KLInputs:
    """logp_BT: current policy (grad); ref_logp_BT: reference policy; old_logp_BT: the policy that
    sampled (for the importance-weighted estimator). All [B,T]."""

    logp_BT: torch.Tensor
    ref_logp_BT: torch.Tensor
    old_logp_BT: torch.Tensor
    mask_BT: torch.Tensor


@dataclass(frozen=True)
class ISInputs:
    """old_logp_BT: trainer log-probs of pi_old; rollout_logp_BT: log-probs the rollout engine
    reported when sampling (mu). All [B,T]."""

    old_logp_BT: torch.Tensor
    rollout_logp_BT: torch.Tensor
    mask_BT: torch.Tensor


@dataclass(frozen=True)
class AdvantageFacts:
    """What an advantage estimator needs and reads; the recipe and the config validator ask these
    (docs/design.md, house rule 12), never the estimator's name.

    needs_critic:          a value model V(s_t) is trained alongside (values_BT)
    needs_greedy_baseline: one greedy rollout per problem gives the baseline (baseline_B)
    group_relative:        compares the rollouts of one problem (needs rollout.n >= 2)
    reads_token_rewards:   reads token_rewards_BT (step rewards, KL-in-reward); otherwise only scores_B
    """

    needs_critic: bool = False
    needs_greedy_baseline: bool = False
    group_relative: bool = False
    reads_token_rewards: bool = False


@dataclass(frozen=True)
class PolicyLossFacts:
    """What the update may assume of a policy loss (asked instead of its name, docs/design.md, house rule 12).

    zero_at_zero_advantage: every term is a multiple of the advantage, so where A = 0 the per-token
        loss and its gradient are exactly 0 (the update then runs such sequences forward only,
        `train.skip_zero_advantage`); tests/unit/core/test_update_inert.py checks each built-in
    """

    zero_at_zero_advantage: bool = False


ADVANTAGES: Registry[Callable] = Registry("advantage estimator", AdvantageFacts())
POLICY_LOSSES: Registry[Callable] = Registry("policy loss", PolicyLossFacts())
KL_ESTIMATORS: Registry[Callable] = Registry("KL estimator")
IS_CORRECTIONS: Registry[Callable] = Registry("importance-sampling correction")
GROUP_FILTERS: Registry[Callable] = Registry("group filter")
AGG_MODES: Registry[Callable] = Registry("loss aggregation mode")
