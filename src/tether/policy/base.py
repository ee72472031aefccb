"""The policy object every backend hands around: a causal LM, its tokenizer and the ids that end a
generation, plus the model-level switches the sampler (tether.policy.sampling) and the scorer
(tether.policy.scoring) read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class HFPolicy:
    """A causal LM with its tokenizer and the ids that end a generation."""

    model: torch.nn.Module
    tokenizer: object
    stop_ids: tuple[int, ...]
    pad_id: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    autocast_bf16: bool = False
    version: int = 0  # bumped by the recipe after every optimizer step
    lean_decode: bool = True  # tether.policy.decode for Llama-family models; False: transformers per token
    compile_decode: bool = False  # the lean decode step through torch.compile (`rollout.compile`)
    lean_train: str = "eager"  # tether.policy.lean_train for shared-prefix scoring: "eager", "compile" (train.compile), "off"
    trained_positions: int = 0  # token positions run forward+backward so far (padding included): see count_trained
    base_only: bool = False  # a LoRA model scored with its adapters off: the KL reference (tether.policy.lora)
    weight_feed: object = None  # tether.policy.inflight.WeightFeed: newer weights taken between decode steps
    reuse_turn_kv: bool = True  # multi-turn rollouts carry keys/values from turn to turn (tether.policy.kv_reuse)
    turn_kv: object = None  # the store while a rollout's scope is open (tether.policy.kv_reuse.carry_turn_kv)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether transformers' activation (gradient) checkpointing is on for `model`."""
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (`model.gradient_checkpointing`): less memory, about one more forward of compute."""
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(f"model.gradient_checkpointing=true: {type(model).__name__} does not support activation checkpointing")
    enable()
