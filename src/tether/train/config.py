"""The config sections of the training engine: `train:` (optimizer, steps, micro-batches, fast
paths) and `run:` (seed, determinism, threads, memory)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from tether.section import Section


class TrainConfig(Section):
    steps: int = Field(100, ge=0)
    lr: float = Field(1e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(8192, gt=0, description="token budget per micro-batch")
    max_bad_steps: int = Field(3, ge=1, description="halt after this many non-finite steps in a row")
    pack_sequences: bool = Field(True, description="pack sequences into rows for scoring/training (same result, no padding compute)")
    share_prefix: Literal["auto", "on", "off"] = Field(
        "auto", description="compute a group's shared prefix once (MiniMax Forge); auto: when that runs fewer token positions")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the shared-prefix training forward (tether.policy.lean_train; Llama-family "
                            "models on a CPU); the first step pays the compilation (3.2M model, 2 cores: 11-20 s, 37-39 s "
                            "with an empty inductor cache). auto: in RL runs long enough to pay it back (hardware.choose_compile)")
    skip_zero_advantage: bool = Field(
        True, description="sequences whose every advantage is exactly 0 (a GRPO group with equal rewards) run forward "
                          "only, without gradients, when the loss has no other term: the same gradient and metrics")


class RunConfig(Section):
    name: str = "run"
    seed: int = 0
    deterministic: bool | None = Field(
        None, description="torch deterministic algorithms; None: on for CPU-only runs (no measured cost there: "
                          "two-thread CPU runs otherwise drift apart in the last bits within a few steps), off with CUDA")
    threads: PositiveInt | Literal["auto"] | None = Field(None, description="torch threads; auto: cores the load leaves free")
    retain_memory: bool | None = Field(
        None, description="glibc malloc keeps freed memory for the next step instead of unmapping it (tether.runtime; "
                          "fewer page faults); None: on for CPU-only runs")


__all__ = ["TrainConfig", "RunConfig"]
