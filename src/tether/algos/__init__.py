"""Algorithm library: pure tensor functions behind small registries (docs/design.md, house rules 2-3).

Importing this package registers every estimator, loss, aggregation mode, KL estimator, IS
correction and group filter, so `ADVANTAGES["grpo"]` etc. resolve.
"""

from __future__ import annotations

from tether.algos.advantages import (
    compute_dr_grpo_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_reinforce_pp_advantages,
    compute_reinforce_pp_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    compute_masked_whiten,
    normalize_by_task,
)
from tether.algos.aggregate import AggNorm, agg_loss, compute_agg_norm
from tether.algos.base import (
    ADVANTAGES,
    AGG_MODES,
    GROUP_FILTERS,
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageFacts,
    PolicyLossFacts,
    AdvantageInputs,
    AdvantageOutputs,
    ISInputs,
    KLInputs,
    Metrics,
    PolicyLossInputs,
)
from tether.algos.corrections import (
    compute_mismatch_metrics,
    compute_off_policy_mask,
    compute_stop_reason_weights,
    keep_nonzero_variance,
    select_groups,
)
from tether.algos.gigpo import compute_gigpo_advantages, compute_step_grpo_advantages
from tether.algos.kl import AdaptiveKLController, compute_kl_in_reward
from tether.algos.multitask import compute_advantages
from tether.algos.losses import compute_cispo_loss, compute_gspo_loss, compute_ppo_clip_loss, compute_value_loss
from tether.algos.shaping import compute_gamma_decayed_rewards, compute_length_reward, compute_overlong_penalty

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "GROUP_FILTERS",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageFacts",
    "PolicyLossFacts",
    "AdvantageInputs",
    "AdvantageOutputs",
    "AggNorm",
    "ISInputs",
    "KLInputs",
    "Metrics",
    "PolicyLossInputs",
    "agg_loss",
    "compute_advantages",
    "compute_agg_norm",
    "compute_cispo_loss",
    "compute_dr_grpo_advantages",
    "compute_gae_advantages",
    "compute_gamma_decayed_rewards",
    "compute_gigpo_advantages",
    "compute_grpo_advantages",
    "compute_gspo_loss",
    "compute_kl_in_reward",
    "compute_length_reward",
    "compute_mismatch_metrics",
    "compute_off_policy_mask",
    "compute_overlong_penalty",
    "compute_ppo_clip_loss",
    "compute_reinforce_pp_advantages",
    "compute_reinforce_pp_baseline_advantages",
    "compute_remax_advantages",
    "compute_rloo_advantages",
    "compute_step_grpo_advantages",
    "compute_stop_reason_weights",
    "compute_value_loss",
    "keep_nonzero_variance",
    "compute_masked_whiten",
    "normalize_by_task",
    "select_groups",
]
