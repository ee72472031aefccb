"""Config sections of the recipes themselves: `sft:`, `rm:`, the stage recipes and multi-stage pipelines.

    pipeline:
      stages:
        - {kind: sft, name: cold_start, overrides: {sft: {steps: 200}}}
        - {kind: rl, name: rl}
        - {kind: rs_sft, name: rs, overrides: {rs_sft: {keep: shortest}}}
        - {kind: dpo, name: dpo, overrides: {dpo: {pairs: samples, loss: ipo}}}
        - {kind: distill, name: distill, overrides: {distill: {teacher: rl}}}
        - {kind: merge, name: merged, overrides: {merge: {models: [rl, rs]}}}
        - {kind: eval, name: final}

Training settings a stage does not own come from the usual sections: `rs_sft` trains with `sft.*`,
`distill` with `train.*`/`rollout.*`/`algo.*` like RL; `dpo` has its own optimiser settings.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from tether.section import Section

STAGE_KINDS = ("sft", "rl", "rs_sft", "dpo", "distill", "merge", "eval")



class SFTConfig(Section):
    steps: int = Field(300, ge=0)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    train_size: int | None = Field(None, gt=0, description="demonstrations to generate")
    demo_noise: float = Field(
        0.0, ge=0, lt=1,
        description="probability that a built-in demonstration's answer is corrupted (a weak teacher)",
    )


class RMConfig(Section):
    """`tether rm`: a Bradley-Terry reward model trained from preference pairs (tether.recipes.rm)."""

    pairs: str | None = Field(None, description="JSONL of {prompt, chosen, rejected}; None: pairs from verifier "
                                                "outcomes of `samples` rollouts per training problem of model.path")
    eval_pairs: str | None = Field(None, description="held-out pairs (default: eval_fraction of the pairs)")
    eval_fraction: float = Field(0.1, gt=0, lt=1)
    samples: int = Field(8, ge=2, description="rollouts per problem when pairs come from verifier outcomes")
    problems: int = Field(256, gt=0, description="training problems sampled for verifier pairs")
    steps: int = Field(200, ge=1)
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(16, gt=0)
    max_length: int = Field(256, gt=0)
    eval_every: int = Field(50, ge=0)
    save_at: list[PositiveInt] = Field(
        default_factory=list, description="also save the model and its held-out pair accuracy at these steps "
        "(step-N/final_model, step-N/summary.json): the learning rate is constant, so each is the model of an "
        "N-step run, from one longer run")


class RSSFTConfig(Section):
    """Rejection-sampling SFT (DeepSeek-R1 arXiv 2501.12948 §2.3.3; selective RFT of SWE-agent RL)."""

    problems: int = Field(256, gt=0, description="train problems to sample from")
    k: int = Field(8, ge=1, description="samples per problem from the current policy")
    keep: Literal["all", "shortest", "at_most"] = Field(
        "all", description="accepted samples kept per problem: all | shortest (long2short) | at_most m")
    max_per_problem: int = Field(2, ge=1, description="m for keep=at_most")
    mask_error_turns: bool = Field(True, description="no loss on turns with a malformed or failed tool call")
    mix_demos: int = Field(0, ge=0, description="scripted demonstrations of the task mixed in")
    mix_path: str | None = Field(None, description="JSONL of {prompt, completion} mixed in")


class DPOConfig(Section):
    """Preference training: DPO (arXiv 2305.18290), IPO (arXiv 2310.12036), SimPO (arXiv 2405.14734)."""

    loss: str = Field("sigmoid", description="sigmoid (DPO) | ipo | simpo (reference-free)")
    beta: float = Field(0.1, gt=0)
    simpo_gamma: float = Field(0.5, ge=0, description="SimPO target reward margin gamma")
    pairs: Literal["file", "samples", "delta", "short_long"] = Field(
        "samples", description="file: pairs_path JSONL; samples: accepted vs failed sample of the policy; "
                               "delta: strong_model's vs weak_model's sample (Delta Learning); "
                               "short_long: shortest accepted vs a longer sample (long2short)")
    pairs_path: str | None = Field(None, description="JSONL of {prompt, chosen, rejected}")
    strong_model: str | None = Field(None, description="delta: chosen-side model (dir or stage name)")
    weak_model: str | None = Field(None, description="delta: rejected-side model (dir or stage name)")
    problems: int = Field(128, gt=0, description="train problems sampled to build pairs")
    k: int = Field(8, ge=1, description="samples per problem when building pairs")
    long_ratio: float = Field(1.0, ge=1, description="short_long: rejected at least this many times longer")
    steps: int = Field(50, ge=0)
    lr: float = Field(1e-5, gt=0)
    batch_size: int = Field(16, gt=0, description="pairs per step")
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)


class DistillConfig(Section):
    """On-policy distillation: the per-token reverse KL to a teacher as the advantage."""

    teacher: str | None = Field(None, description="teacher model directory, or an earlier stage's name")
    kl_coef: float = Field(1.0, ge=0, description="weight of -(log pi_student - log pi_teacher) per token")
    reward_weight: float = Field(0.0, ge=0, description="weight of the task reward's advantage (algo.advantage)")


class MergeConfig(Section):
    """Weight-space merging (long2short's model merge, Kimi k1.5 arXiv 2501.12599 §2.4)."""

    method: Literal["linear", "task_arithmetic"] = "linear"
    models: list[str] = Field(default_factory=list, description="model dirs or stage names; 'previous' = incoming")
    weights: list[float] | None = Field(None, description="linear: default uniform; task_arithmetic: lambdas (1.0)")
    base: str | None = Field(None, description="task_arithmetic: the model the task vectors are taken from")


class StageConfig(Section):
    kind: str = Field(..., description="|".join(STAGE_KINDS))
    name: str | None = Field(None, description="folder and handle of the stage (default: its kind, numbered)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="config sections changed for this stage")
    start_from: str | None = Field(None, description="an earlier stage's name (default: the previous stage)")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in STAGE_KINDS:
            close = difflib.get_close_matches(v, STAGE_KINDS, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown stage kind {v!r}{hint} (valid: {', '.join(STAGE_KINDS)})")
        return v


class PipelineConfig(Section):
    stages: list[StageConfig] = Field(default_factory=list, description="empty: sft then rl (the cold-start pipeline)")
