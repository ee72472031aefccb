"""The KL reference policy: a frozen copy of the policy's weights (or, with LoRA, the same model
with its adapters off), and ProRL's hard reset of it to the current policy."""

from __future__ import annotations

import copy
import dataclasses

from tether.policy.hf import HFPolicy
from tether.policy.lora import is_lora


def make_reference(policy: HFPolicy) -> HFPolicy:
    """A frozen copy of the policy's current weights (KL reference). For a LoRA policy, the same
    model scored with its adapters off (`base_only`): the base weights are shared, never copied."""
    if is_lora(policy.model):
        return dataclasses.replace(policy, base_only=True)
    model = copy.deepcopy(policy.model)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return HFPolicy(model, policy.tokenizer, policy.stop_ids, policy.pad_id, policy.device, policy.autocast_bf16, policy.version)


def reset_reference(ref: HFPolicy, policy: HFPolicy) -> None:
    """ProRL (arXiv 2505.24864 §2.2): hard-reset the reference to the current policy."""
    ref.model.load_state_dict(policy.model.state_dict())
    ref.version = policy.version
