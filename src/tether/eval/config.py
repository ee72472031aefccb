"""The `eval:` section: held-out evaluation cadence, samples and the best@k selector."""

from __future__ import annotations

from pydantic import Field

from tether.policy.config import SamplingConfig
from tether.section import Section


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="evaluate every N steps (0: only at start and end)")
    problems: int | None = Field(None, gt=0, description="held-out problems (default: all)")
    samples: int = Field(4, ge=1, description="samples per problem for pass@1 / pass@k")
    sampling: SamplingConfig = SamplingConfig(temperature=1.0)
    best_of: str = Field(
        "logprob", description="best@k selector: logprob (model confidence) | reward (the run's reward) | "
        "verifier (correctness: = pass@k) | a reward function name or package.module:function (e.g. a reward model)",
    )


__all__ = ["EvalConfig"]
