"""The config sections of the policy: the model (`model:`, a local HF directory or a tiny
local model, LoRA) and sampling (`rollout.sampling`, `eval.sampling`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tether.section import Section


class TinyModelConfig(Section):
    """A small Llama-style model built locally (no hub); the tokenizer is trained on the task."""

    hidden_size: int = Field(256, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    intermediate_size: int = Field(688, gt=0)
    vocab_size: int = Field(256, ge=32, description="target BPE vocabulary size")
    max_position_embeddings: int = Field(512, gt=0)


class LoraConfig(Section):
    """LoRA adapters via peft (tether.policy.lora): only the adapters train; the KL reference is the base."""

    r: int = Field(8, gt=0, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="scale alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names to adapt, or 'all-linear'")


class ModelConfig(Section):
    path: str | None = Field(None, description="local Hugging Face causal-LM directory")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16"] = "float32"
    autocast_bf16: bool | Literal["auto"] = Field(
        "auto", description="bf16 autocast for forward passes; auto: on only where the CPU/GPU does bf16 natively "
                            "(AVX-512-BF16/AMX, Arm BF16, CUDA bf16), fp32 elsewhere (tether.hardware)")
    cpu_linear: Literal["auto", "onednn", "torch"] = Field(
        "auto", description="CPU linear-layer kernels (tether.policy.cpu_gemm): onednn (oneDNN's inner product for "
                            "fp32 training matmuls; decode weights packed once), torch (PyTorch's own dispatch); auto: "
                            "the environment variable TETHER_CPU_GEMM if set, else onednn on x86-64, torch elsewhere. "
                            "A process-wide setting, applied when a run starts")
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward (transformers' activation "
                           "checkpointing): less memory, ~1 more forward of compute; turns prefix sharing and the "
                           "lean training forward off")
    lora: LoraConfig | None = Field(None, description="LoRA adapters (peft): only they train; the KL reference is the "
                                                      "base with adapters off; checkpoints hold the adapter (docs/lora.md)")
    device: str = "cpu"


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    min_p: float = Field(0.0, ge=0, lt=1, description="keep tokens with p >= min_p * p_max (0 disables)")
    max_new_tokens: int = Field(32, gt=0)
    keep_mask: bool = Field(True, description="with top_k/top_p/min_p on: record the truncation per token and score "
                                              "the update under the same truncated distribution (false: the full one)")


__all__ = ["TinyModelConfig", "LoraConfig", "ModelConfig", "SamplingConfig"]
