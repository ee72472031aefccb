"""Weights on the move: numpy state dicts, checksums, and the model bundle a worker starts from.

Weights travel as numpy arrays through the Ray object store (zero-copy; pickled torch
tensors were several times slower when this was chosen). numpy has no bfloat16, so a bf16
tensor travels as its int16 bit pattern and is viewed back on arrival (bit-exact).

The checksum is a sha256 over names, dtypes, shapes and bytes in sorted-name order: the
receiver recomputes it from what its model holds AFTER loading, so a dropped, stale or
corrupted tensor changes it (docs/design.md, correctness rule 4: verl#7495, trl#5312, SkyRL#1680).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

_VIEW_AS = {torch.bfloat16: torch.int16}  # dtypes numpy lacks -> a same-width integer view
_DTYPE_NAMES = {str(t).removeprefix("torch."): t for t in (torch.bfloat16, torch.float16, torch.float32,
                                                          torch.float64, torch.int64, torch.int32, torch.int16,
                                                          torch.int8, torch.uint8, torch.bool)}


def to_numpy_state(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, np.ndarray]]:
    """{name: (torch dtype name, array)} on CPU; bf16 as its int16 bits. A snapshot: the arrays
    never alias the live parameters (an in-place optimizer step must not change them)."""
    out = {}
    for k, v in state.items():
        t = v.detach().to("cpu", copy=True).contiguous()
        view = _VIEW_AS.get(t.dtype)
        out[k] = (str(t.dtype).removeprefix("torch."), (t.view(view) if view else t).numpy())
    return out


def from_numpy_state(arrays: Mapping[str, tuple[str, np.ndarray]], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Inverse of `to_numpy_state` (arrays from the object store are read-only: copy on the way in)."""
    out = {}
    for k, (dtype, a) in arrays.items():
        t = torch.from_numpy(np.array(a, copy=True))
        want = _DTYPE_NAMES[dtype]
        out[k] = (t.view(want) if want in _VIEW_AS else t).to(device)
    return out


def compute_checksum(arrays: Mapping[str, tuple[str, np.ndarray]]) -> str:
    """sha256 over (name, dtype, shape, bytes) in sorted-name order; 16 hex digits are plenty here."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        dtype, a = arrays[k]
        h.update(f"{k}|{dtype}|{tuple(a.shape)}|".encode())
        h.update(np.ascontiguousarray(a).view(np.uint8).data)
    return h.hexdigest()[:16]


def compute_state_checksum(model: torch.nn.Module) -> str:
    """The checksum of what `model` holds now (what a receiver reports after loading)."""
    return compute_checksum(to_numpy_state(model.state_dict()))


def make_model_bundle(policy: Any) -> dict[str, Any]:
    """Everything a worker needs to rebuild the policy without a shared filesystem: the config,
    generation config and tokenizer files (bytes), plus the weights and version."""
    with tempfile.TemporaryDirectory() as d:
        policy.model.config.save_pretrained(d)
        if getattr(policy.model, "generation_config", None) is not None:
            policy.model.generation_config.save_pretrained(d)
        policy.tokenizer.save_pretrained(d)
        files = {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}
    dtype = next(policy.model.parameters()).dtype
    return {"files": files, "dtype": str(dtype).removeprefix("torch."), "arrays": to_numpy_state(policy.model.state_dict()),
            "version": int(policy.version), "autocast_bf16": bool(policy.autocast_bf16),
            "lora": _lora_spec(policy.model)}


def _lora_spec(model: torch.nn.Module) -> dict[str, Any] | None:
    """The LoRA shape of an injected model (tether.policy.lora), for a worker to inject the same."""
    from tether.policy.lora import peft_of

    wrapped = peft_of(model)
    if wrapped is None:
        return None
    c = wrapped.peft_config["default"]
    targets = c.target_modules if isinstance(c.target_modules, str) else sorted(c.target_modules)
    return {"r": c.r, "alpha": c.lora_alpha, "dropout": c.lora_dropout, "target_modules": targets}


def make_publish_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a weight sync sends: the whole state dict, or of a LoRA model only its adapter weights
    (the frozen base reached the workers once, in the bundle)."""
    from tether.policy.lora import is_lora

    state = model.state_dict()
    return {k: v for k, v in state.items() if "lora_" in k} if is_lora(model) else state


def write_bundle_files(bundle: Mapping[str, Any], directory: str | Path) -> Path:
    """The bundle's config/tokenizer files in `directory` (a Hugging Face directory without weights)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in bundle["files"].items():
        (d / name).write_bytes(data)
    return d


def build_policy_from_bundle(bundle: Mapping[str, Any], device: str = "cpu"):
    """An HFPolicy with the bundle's architecture, tokenizer and weights (strict load)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tether.policy.hf import make_policy

    with tempfile.TemporaryDirectory() as d:
        write_bundle_files(bundle, d)
        config = AutoConfig.from_pretrained(d, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=_DTYPE_NAMES[bundle["dtype"]])
        try:
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig.from_pretrained(d, local_files_only=True)
        except OSError:  # no generation_config.json in the bundle
            pass
    if bundle.get("lora"):  # the trainer's LoRA shape, so that its adapter weights load by name
        from types import SimpleNamespace

        from tether.policy.lora import apply_lora

        model = apply_lora(model, SimpleNamespace(**bundle["lora"]))
    model.load_state_dict(from_numpy_state(bundle["arrays"]), strict=True)
    model.eval()
    policy = make_policy(model, tokenizer, device=device, autocast_bf16=bundle["autocast_bf16"])
    policy.version = int(bundle["version"])
    return policy


__all__ = ["build_policy_from_bundle", "compute_checksum", "compute_state_checksum", "from_numpy_state",
           "make_model_bundle", "make_publish_state", "to_numpy_state", "write_bundle_files"]
