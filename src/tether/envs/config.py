"""The config sections of the environments: `env:` (multi-turn episodes, context builders)
and `sandbox:` (where model-written code runs)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tether.section import Section


class ContextConfig(Section):
    """How the transition history becomes the next model context (Agent-R1 context rules)."""

    builder: Literal["append", "sliding_window", "summary"] = "append"
    window: int = Field(2, ge=1, description="sliding_window / summary: the last k turns kept verbatim")
    summarizer: str = Field(
        "tether.envs.context:summarize_tool_results",
        description="summary: 'policy' (the model writes it, not trained on) or 'package.module:function'",
    )
    summary_max_tokens: int = Field(48, gt=0, description="summarizer=policy: tokens per summary")


class EnvConfig(Section):
    """Multi-turn environments (data.task names one; data.task=env_mix mixes several)."""

    max_turns: int = Field(6, ge=1)
    max_context_tokens: int | None = Field(None, gt=0, description="default: model positions - max_new_tokens")
    step_timeout_s: float = Field(30.0, gt=0, description="one env.reset/step call; past it: stop reason timeout")
    episode_timeout_s: float = Field(600.0, gt=0)
    max_parse_errors: int = Field(2, ge=1, description="consecutive malformed tool calls that end an episode")
    max_error_rate: float = Field(0.5, gt=0, le=1, description="stop the run if more episodes end in env_error")
    credit: Literal["broadcast", "step"] = Field("broadcast", description="broadcast: the return is the trajectory "
                                                 "score; step: env rewards stay on their turns")
    reuse_kv: bool = Field(True, description="carry keys/values from one turn's sampling to the next turn's prefill "
                                             "(transformers sampler; tether.policy.kv_reuse)")
    context: ContextConfig = ContextConfig()


class SandboxConfig(Section):
    """Where model-written code runs (tether/envs/sandbox.py; docs/agentic.md, "The code sandbox")."""

    backend: Literal["bwrap", "unshare", "rlimits"] | None = Field(
        None, description="default: $TETHER_SANDBOX_BACKEND, else bwrap (bubblewrap), required unless you opt in to "
        "a weaker backend, which warns naming what it does not protect: unshare (no filesystem isolation) or "
        "rlimits (limits and a uid only)"
    )


__all__ = ["ContextConfig", "EnvConfig", "SandboxConfig"]
