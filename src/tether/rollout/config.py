"""The config sections of the rollout: `rollout:` (group size, problems per step, sampling,
batching, compile) and `harness:` (a black-box agent program, tether.rollout.harness)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tether.policy.config import SamplingConfig
from tether.section import Section


class RolloutConfig(Section):
    n: int = Field(8, ge=1, description="rollouts per problem (group size)")
    problems_per_step: int = Field(16, ge=1, description="B_p: problems per RL step")
    sampling: SamplingConfig = SamplingConfig()
    max_prompt_tokens: int = Field(256, gt=0)
    batch_size: int = Field(256, gt=0, description="sequences generated together")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the lean decode step (tether.policy.decode; Llama-family models): the "
                            "element-wise work of every layer fused, one graph for every step; the first generation "
                            "pays the compilation (25-28 s on a 2-core CPU in a fresh inductor cache, less from a warm "
                            "one). auto: in RL runs long enough to pay it back (tether.hardware.choose_compile)")
    on_drift: Literal["count", "fail"] = Field("count", description="multi-turn: a context that does not extend "
                                                                    "the previous one is counted or fails")


class HarnessConfig(Section):
    """A black-box agent program trained through the OpenAI-compatible endpoint (tether.rollout.harness, agent_io)."""

    command: list[str] | None = Field(None, description="the agent program and its arguments (`python`: the interpreter "
                                                        "tether runs in), run once per episode with OPENAI_BASE_URL / "
                                                        "OPENAI_API_KEY / TETHER_TASK set")
    persistent: bool = Field(False, description="start `concurrency` agent processes once; each serves many episodes, "
                                                "one JSON line in on stdin and one out on stdout (tether.rollout.agent_io)")
    timeout_s: float = Field(300.0, gt=0, description="wall clock of one agent run")
    concurrency: int = Field(8, ge=1, description="agent programs running at once (their calls are batched)")
    host: str = Field("127.0.0.1", description="the endpoint's address; any non-loopback address needs `token`")
    token: str | None = Field(None, description="bearer token every request must carry (required off loopback)")


__all__ = ["RolloutConfig", "HarnessConfig"]
