"""The `algo:` section: the estimator, policy loss, aggregation, KL, corrections, dynamic
sampling, shaping and critic settings that the registries of `tether.algos` read."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tether.section import Section


class AdvantageConfig(Section):
    name: str = Field("grpo", description="grpo|dr_grpo|rloo|reinforce_pp|reinforce_pp_baseline|remax|gae|gigpo|step_grpo")
    eps: float = Field(1e-6, gt=0, description="added to the std in normalisations")
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    step_gamma: float = Field(0.95, ge=0, le=1, description="turn-level discount (gigpo, step_grpo)")
    step_weight: float = Field(1.0, ge=0, description="GiGPO omega: weight of the step-level advantage")
    step_std_norm: bool = Field(False, description="GiGPO: divide by the group std (default mean_norm, as the paper's code)")
    task_norm: Literal["none", "task", "env"] = Field(
        "none", description="multi-task: whiten per task type (AgentRL) or baseline per environment (ERPO)"
    )


class PolicyLossConfig(Section):
    name: str = Field("ppo_clip", description="ppo_clip|gspo|cispo")
    clip_low: float = Field(0.2, ge=0, description="epsilon_low: ratio floor is 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="epsilon_high: ratio cap is 1 + clip_high (DAPO: 0.28)")
    dual_clip_c: float | None = Field(None, gt=1, description="dual-clip constant c > 1 (off by default)")
    log_ratio_clamp: float = Field(20.0, gt=0, description="|log ratio| clamp before exp")


class AggConfig(Section):
    mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"] = (
        "token_mean"
    )
    max_len: int | None = Field(None, gt=0, description="constant_norm L; default max_new_tokens")


class KLConfig(Section):
    coef: float = Field(0.0, ge=0, description="beta; 0 disables KL and the reference model")
    estimator: str = Field("k3", description="k1|k2|k3|k3_iw (importance-weighted, unbiased)")
    placement: Literal["loss", "reward"] = "loss"
    reference: Literal["initial", "none"] = Field(
        "initial", description="reference policy: a frozen copy of the starting weights, or none"
    )
    reset_every: int | None = Field(None, gt=0, description="ProRL: reset reference every N steps")
    adaptive_target: float | None = Field(None, gt=0, description="adaptive KL controller target")
    adaptive_horizon: int = Field(10000, gt=0)
    clamp: float = Field(20.0, gt=0, description="|log ratio| clamp before exp")


class ISCorrectionConfig(Section):
    """Rollout/trainer mismatch correction (TIS/MIS) and off-policy sequence masking."""

    mode: Literal["none", "truncate", "mask"] = "truncate"
    level: Literal["token", "sequence"] = "token"
    threshold_high: float = Field(2.0, gt=1)
    threshold_low: float | None = Field(None, gt=0, lt=1, description="mask mode: lower bound")
    off_policy_mask_delta: float | None = Field(None, gt=0, description="DeepSeek-V3.2 delta")


class DynamicSamplingConfig(Section):
    enable: bool = False
    max_gen_batches: int = Field(4, ge=1, description="extra generation rounds to refill")
    tol: float = Field(1e-6, ge=0, description="a group is zero-variance if max-min <= tol")


class ShapingConfig(Section):
    overlong_cache_len: int | None = Field(None, gt=0, description="DAPO soft overlong buffer")
    overlong_factor: float = Field(1.0, ge=0)
    length_penalty_coef: float = Field(0.0, ge=0, description="Kimi k1.5 length reward weight")


class ValueConfig(Section):
    clip: float = Field(0.5, gt=0, description="value clip range epsilon_v")
    coef: float = Field(0.5, ge=0, description="value-loss weight")
    lr: float = Field(1e-4, gt=0)


class AlgoConfig(Section):
    advantage: AdvantageConfig = AdvantageConfig()
    policy_loss: PolicyLossConfig = PolicyLossConfig()
    agg: AggConfig = AggConfig()
    kl: KLConfig = KLConfig()
    correction: ISCorrectionConfig = ISCorrectionConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    shaping: ShapingConfig = ShapingConfig()
    value: ValueConfig = ValueConfig()
    compact_filter: dict[str, Literal["mask", "keep", "zero"]] = Field(
        default_factory=dict,
        description="per stop reason (length, max_turns, timeout, ...): mask | keep | zero",
    )
    entropy_coef: float = Field(0.0, description="entropy bonus weight (loss -= coef * H)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch (PPO epochs, mu); IsoCompute M is train.steps")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass")


__all__ = ["AdvantageConfig", "PolicyLossConfig", "AggConfig", "KLConfig", "ISCorrectionConfig", "DynamicSamplingConfig", "ShapingConfig", "ValueConfig", "AlgoConfig"]
