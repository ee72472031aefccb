"""LoRA adapters through `peft` (Hu et al., arXiv 2106.09685): low-rank updates W + (alpha/r) B A
on the chosen linear layers, everything else frozen.

    model = apply_lora(model, cfg.model.lora)        # peft injects LoRA layers in place
    with adapters_disabled(model): ...               # the base model: the KL reference, no second copy
    save_adapter(model, out_dir, base_path)          # adapter_model.safetensors + adapter_config.json
    model = load_adapter_merged(adapter_dir)         # a plain HF model (base + adapter merged)

tether keeps the *injected* Hugging Face model (not the `PeftModel` wrapper) as `policy.model`, so
every code path that walks the model (scoring, prefix sharing, checkpointing) sees the familiar
`model.model` / `model.lm_head` layout; the `PeftModel` is kept beside it (`peft_of`) for saving.
The fast paths that reimplement a decoder layer from raw weights (tether.policy.decode,
lean_train) accept only plain `nn.Linear` projections, so they step aside for a LoRA model by
construction (`supports()` is False) and transformers' forward runs the adapters.

The reference policy of a LoRA run is the same model with the adapters switched off
(`adapters_disabled`): the base weights are shared, never copied. A reference reset would have to
merge the adapter into the base, so `algo.kl.reset_every` is refused with LoRA (config).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

ADAPTER_CONFIG = "adapter_config.json"


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("model.lora needs peft: pip install 'tether[peft]' (or pip install peft)") from None
    return peft


def apply_lora(model: torch.nn.Module, cfg: Any, base_path: str | Path | None = None) -> torch.nn.Module:
    """Inject LoRA layers (`cfg`: r, alpha, dropout, target_modules) into `model`; returns the
    injected model with only the adapter weights trainable. `base_path`: the directory holding the
    base weights, recorded in every saved adapter (adapter_config.json base_model_name_or_path)."""
    from tether.policy.checks import check_target_names, describe_peft_refusal

    peft = _peft()
    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    check_target_names(model, targets)  # peft accepts a list in which one name matches: a typo would go unseen
    pcfg = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                           bias="none", task_type="CAUSAL_LM")
    try:
        wrapped = peft.get_peft_model(model, pcfg)
    except (ValueError, TypeError) as err:  # a module type peft cannot adapt: the user's setting, named
        raise describe_peft_refusal(model, targets, err) from None
    if base_path is not None:
        wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    inner = wrapped.base_model.model
    inner.__dict__["_tether_peft"] = wrapped  # not a submodule: no cycle in .modules() / state_dict()
    return inner


def peft_of(model: torch.nn.Module):
    """The PeftModel around an injected model, or None for a plain model."""
    return model.__dict__.get("_tether_peft")


def is_lora(model: torch.nn.Module) -> bool:
    return peft_of(model) is not None


def _tuner_layers(model: torch.nn.Module) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run the base model: every LoRA layer passes its input through the frozen base weights only."""
    if not is_lora(model):
        yield
        return
    layers = _tuner_layers(model)
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)
            # enable_adapters(True) marks every adapter weight trainable again; keep the base frozen
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def save_adapter(model: torch.nn.Module, out_dir: str | Path, base_path: str | Path | None = None) -> Path:
    """adapter_model.safetensors + adapter_config.json (its `base_model_name_or_path` = `base_path`,
    else the one given to `apply_lora`)."""
    wrapped = peft_of(model)
    if wrapped is None:
        raise ValueError("save_adapter: the model has no LoRA adapters")
    out = Path(out_dir)
    if base_path is not None:
        wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    wrapped.save_pretrained(str(out), safe_serialization=True)
    return out


def load_adapter_into(model: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Load saved adapter weights into an injected model of the same LoRA shape (resume)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not is_lora(model):
        raise ValueError(f"{adapter_dir} holds a LoRA adapter, but the model has none: set model.lora to resume it")
    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(peft_of(model), state)
    missing = [k for k in getattr(result, "unexpected_keys", [])]
    if missing:
        raise ValueError(f"{adapter_dir}: adapter weights do not fit this model ({missing[:3]} ...)")


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base_path(adapter_dir: str | Path) -> Path:
    """The base model directory an adapter was trained on (adapter_config.json names it, absolute).

    After the run directory was moved, the same base is found by its place relative to the
    adapter: the stored path's last parts (`rl/base_model`) under the adapter's own parents."""
    cfg = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
    stored = Path(cfg.get("base_model_name_or_path") or "")
    if (stored / "config.json").is_file():
        return stored
    here = Path(adapter_dir).resolve()
    for parent in list(here.parents)[:4]:
        for k in range(1, min(4, len(stored.parts)) + 1):
            cand = parent.joinpath(*stored.parts[-k:])
            if (cand / "config.json").is_file() and cand != here:
                return cand
    raise FileNotFoundError(f"{adapter_dir}: its base model {str(stored)!r} (adapter_config.json "
                            "base_model_name_or_path) is not a model directory; export needs the base weights")


def load_adapter_merged(adapter_dir: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A plain Hugging Face model: the adapter's base with the adapter merged in (`merge_and_unload`)."""
    peft = _peft()
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(adapter_base_path(adapter_dir)), dtype=dtype, local_files_only=True)
    return peft.PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def export_merged(adapter_dir: str | Path, out_dir: str | Path, tokenizer: Any = None) -> Path:
    """`tether export`: write the merged model (and its tokenizer) as a plain HF model directory."""
    model = load_adapter_merged(adapter_dir)
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer is None:
        from transformers import AutoTokenizer

        src = adapter_dir if (Path(adapter_dir) / "tokenizer_config.json").exists() else adapter_base_path(adapter_dir)
        tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    tokenizer.save_pretrained(str(out))
    return out


__all__ = ["apply_lora", "peft_of", "is_lora", "adapters_disabled", "count_parameters", "save_adapter",
           "load_adapter_into", "is_adapter_dir", "adapter_base_path", "load_adapter_merged", "export_merged"]
