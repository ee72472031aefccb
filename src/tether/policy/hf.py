"""The transformers backend: loading a causal LM as a tether policy, and the PPO critic.

The sampler lives in tether.policy.sampling, the scorer in tether.policy.scoring, the policy
object in tether.policy.base; their public names are re-exported here, so
`from tether.policy.hf import run_generate, compute_logprobs, HFPolicy` keeps working.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tether.policy.base import HFPolicy, enable_checkpointing, is_checkpointing
from tether.policy.sampling import next_token_logits, run_generate
from tether.policy.scoring import (_backbone_and_head, apply_sampling_mask, compute_head_logprobs, compute_logprobs,
                                   count_trained, fp32_head_logits)
from tether.policy.pretrained import check_model_dir, load_pretrained

__all__ = ["HFPolicy", "ValueModel", "apply_sampling_mask", "compute_head_logprobs", "compute_logprobs", "count_trained",
           "enable_checkpointing", "find_stop_ids", "fp32_head_logits", "is_checkpointing", "load_policy",
           "make_policy", "next_token_logits", "run_generate"]


def find_stop_ids(model: torch.nn.Module, tokenizer) -> tuple[int, ...]:
    """Every id that ends a generation: generation_config / config eos ids and the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("the model and tokenizer define no eos token id; generation could never stop")
    return tuple(sorted(ids))


def load_policy(path: str | Path, device: str = "cpu", dtype: str = "float32", autocast_bf16: bool | str = False) -> HFPolicy:
    """Load any local causal-LM directory with `from_pretrained` (offline)."""
    p = Path(path)
    if p.is_dir() and (p / "adapter_config.json").is_file():  # a LoRA checkpoint: its base with the adapter merged in
        return _load_adapter_policy(p, device, dtype, autocast_bf16)
    check_model_dir(p)  # InputError (one line): no such directory, no config.json
    model, tokenizer = load_pretrained(p, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    return make_policy(model, tokenizer, device=device, autocast_bf16=autocast_bf16)


def _load_adapter_policy(p: Path, device: str, dtype: str, autocast_bf16: bool | str) -> HFPolicy:
    from transformers import AutoTokenizer

    from tether.policy.lora import adapter_base_path, load_adapter_merged

    model = load_adapter_merged(p, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    tok_dir = p if (p / "tokenizer_config.json").is_file() else adapter_base_path(p)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    return make_policy(model, tokenizer, device=device, autocast_bf16=autocast_bf16)


def make_policy(model, tokenizer, device: str = "cpu", autocast_bf16: bool | str = False) -> HFPolicy:
    """`autocast_bf16`: true, false or "auto" (bf16 only where `device` does it natively: tether.hardware)."""
    from tether.hardware import resolve_autocast

    autocast_bf16 = resolve_autocast(autocast_bf16, device)
    stop_ids = find_stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id
    if pad is None:  # common for base models: pad with eos; masks never look at token values
        pad = stop_ids[0]
    dev = torch.device(device)
    model.to(dev)
    if autocast_bf16 and dev.type == "cpu":  # CPU bf16 flash attention is slow (tether.policy.attention)
        from tether.policy.attention import use_fast_cpu_attention

        use_fast_cpu_attention(model)
    return HFPolicy(model=model, tokenizer=tokenizer, stop_ids=stop_ids, pad_id=int(pad), device=dev, autocast_bf16=autocast_bf16)


class ValueModel(torch.nn.Module):
    """A critic for PPO/GAE: the policy's backbone architecture with a scalar head.

    values_BT[:, t] = V(s_t), the value of the state in which token t is chosen (prefix < t),
    aligned with `compute_logprobs`.
    """

    def __init__(self, policy_model: torch.nn.Module) -> None:
        super().__init__()
        import copy

        backbone, _ = _backbone_and_head(policy_model)
        self.backbone = copy.deepcopy(backbone)
        hidden = policy_model.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        am = attention_mask_BT.long()
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(input_ids=input_ids_BT, attention_mask=am, position_ids=pos).last_hidden_state
        v = self.head(hidden.float()).squeeze(-1)  # v[:, t] = value after reading token t
        zero = torch.zeros_like(v[:, :1])
        return torch.cat([zero, v[:, :-1]], dim=1)
