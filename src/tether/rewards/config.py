"""The `reward:` section: weighted components, the correctness component, isolation and errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tether.section import Section


class RewardComponentConfig(Section):
    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = Field(default_factory=dict)
    max_steps: int | None = Field(
        None, gt=0, description="pay this component for at most N RL steps (a learned reward gets hacked: "
        "DeepSeek-R1 caps its RM-based RL at a few hundred steps); then at_max_steps (tether.rewards.cap)"
    )
    at_max_steps: Literal["stop", "drop"] = Field(
        "stop", description="stop: end the run at the cap; drop: weight 0 from then on, the other components train on"
    )


class RewardConfig(Section):
    components: list[RewardComponentConfig] = Field(
        default_factory=lambda: [RewardComponentConfig(name="exact_match")]
    )
    correctness: str | None = Field(
        None, description="component whose value > 0 means verified-correct (default: first)"
    )
    timeout_s: float = Field(5.0, gt=0)
    isolation: Literal["process", "thread", "inline"] = "process"
    on_error: Literal["mask", "zero"] = "mask"
    max_error_rate: float = Field(0.5, gt=0, le=1, description="stop if a step's error rate exceeds it")


__all__ = ["RewardComponentConfig", "RewardConfig"]
