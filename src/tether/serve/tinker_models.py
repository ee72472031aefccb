"""The models a Tinker-compatible service holds: base models, training models (LoRA adapters or full
weights), sampler snapshots and checkpoints on disk (`tether.serve.tinker`).

- A **base model** is a local Hugging Face directory served under a name (the `base_model` a
  script asks for: `--model Qwen/Qwen3-8B=/models/my-qwen`), loaded once as a tether policy.
- A **LoRA training model** is one named peft adapter on its base's shared weights: several
  adapters live on one base in one process (peft's multi-adapter model); the active adapter is
  switched per request (`activate`). Rank, seed and the trained layers (attention, MLP, unembedding)
  come from the SDK's `LoraConfig`; alpha is 32 (the rank-independent scale Tinker's LoRA guide
  assumes), dropout 0.
- A **full-weight training model** (LoRA rank 0, or the server's `--full-weight`) is its own copy
  of the base, loaded from the base's directory, so adapters on the shared base never see it.
- Each training model has its own AdamW (tether.optim.build_optimizer) over its trainable weights.
- A **sampler** serves one fixed set of weights: the base (adapters off), or a snapshot of a
  training model taken by `save_weights_for_sampler` (a LoRA snapshot is a copy of the adapter under
  a new adapter name; a full-weight snapshot is a copy of the model). At most `max_samplers`
  snapshots stay loaded (least recently used first out); a named one reloads from disk, an
  ephemeral one (`save_weights_and_get_sampling_client`) is then gone.
- **Checkpoints** (`tinker://<model_id>/weights/<name>` from save_state, `.../sampler_weights/<name>`
  from save_weights_for_sampler(name)) are directories under the state directory: a LoRA one is a
  peft adapter directory (adapter_config.json naming the base directory + adapter_model.safetensors),
  a full one a Hugging Face model directory; both load with `tether.policy.hf.load_policy`, so
  `tether eval`/`export` work on them. optimizer.pt holds the AdamW state (save_state only).

Everything that touches weights runs on the service's one worker thread; the dictionaries are read
by the request handlers under `lock`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
import time
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tether.errors import UserError
from tether.optim import build_optimizer, compute_all_finite
from tether.policy.base import HFPolicy
from tether.policy.hf import load_policy
from tether.train.step import UpdateState

LORA_ALPHA = 32
META = "tinker_checkpoint.json"
OPTIMIZER = "optimizer.pt"
_ATTN, _MLP = ("attn", "attention"), ("mlp", "feed_forward", "ffn")


class TinkerUserError(UserError, ValueError):
    """A request the client can fix (unknown model, bad path, unsupported option): category "user"."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass
class BaseModel:
    name: str
    path: Path
    policy: HFPolicy
    linears: dict[str, list[str]] = field(default_factory=dict)  # classify_linears of the plain model
    peft: Any = None  # the PeftModel around policy.model once an adapter exists
    adapters: int = 0
    plain: Any = None  # an adapter-free copy of the weights, the template of merged LoRA snapshots


@dataclass
class TrainingModel:
    model_id: str
    base: BaseModel
    lora: LoraSpec | None  # None: full weights
    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    state: UpdateState = field(default_factory=UpdateState)
    steps: int = 0
    created: float = field(default_factory=time.time)

    @property
    def adapter(self) -> str | None:
        return None if self.lora is None else _adapter_name(self.model_id)


@dataclass
class Sampler:
    sampler_id: str
    base: BaseModel
    policy: HFPolicy
    adapter: str | None = None  # a LoRA snapshot's adapter name; None with a LoRA base: adapters off
    model_path: str | None = None
    ephemeral: bool = False


def _adapter_name(key: str) -> str:
    return "a_" + "".join(c if c.isalnum() else "_" for c in key)


def parse_tinker_path(path: str) -> tuple[str, str, str]:
    """tinker://<model_id>/<weights|sampler_weights>/<name> -> (model_id, kind, name)."""
    parts = path.removeprefix("tinker://").split("/")
    if not path.startswith("tinker://") or len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") \
            or not all(parts) or ".." in parts:
        raise TinkerUserError(f"{path!r} is not a checkpoint path of this service "
                              "(tinker://<model_id>/weights/<name> or .../sampler_weights/<name>)")
    return parts[0], parts[1], parts[2]


def classify_linears(model: torch.nn.Module) -> dict[str, list[str]]:
    """The plain model's linear layers by LoRA group: attention, MLP, unembedding (read before any
    adapter is injected: afterwards the adapters' own layers are linear too)."""
    head = model.get_output_embeddings()
    groups: dict[str, list[str]] = {"attn": [], "mlp": [], "unembed": []}
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        low = name.lower()
        group = "unembed" if mod is head else "attn" if any(k in low for k in _ATTN) else \
            "mlp" if any(k in low for k in _MLP) else None
        if group:
            groups[group].append(name)
    return groups


def lora_targets(groups: dict[str, list[str]], spec: LoraSpec) -> list[str]:
    """The linear layers a LoRA spec trains: attention and/or MLP projections. `train_unembed` is
    accepted and the unembedding stays frozen: tether's scorer and sampler compute the LM head in
    fp32 from its weight matrix (tether.policy.scoring.fp32_head_logits), which an adapter on it
    would be bypassed by (docs/tinker.md)."""
    names = (groups["attn"] if spec.train_attn else []) + (groups["mlp"] if spec.train_mlp else [])
    if not names:
        raise TinkerUserError("the LoRA config selects no layer tether trains with LoRA (train_attn or train_mlp must be "
                              "true; the unembedding is not adapted: docs/tinker.md)")
    return names


class ModelStore:
    """Base models, training models, samplers and checkpoints (module docstring)."""

    def __init__(self, state_dir: Path, device: str = "cpu", dtype: str = "float32", full_weight: bool = False,
                 max_samplers: int = 4, merge_max_params: int = 200_000_000) -> None:
        self.state_dir, self.device, self.dtype = Path(state_dir), device, dtype
        self.full_weight, self.max_samplers, self.merge_max_params = full_weight, max_samplers, merge_max_params
        self.bases: dict[str, BaseModel] = {}
        self.training: dict[str, TrainingModel] = {}
        self.samplers: OrderedDict[str, Sampler] = OrderedDict()
        self.sampler_info: dict[str, tuple[str, str | None]] = {}  # id -> (base name, model_path): outlives eviction
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ base models

    def add_base(self, name: str, path: str | Path) -> BaseModel:
        p = Path(path).resolve()
        policy = load_policy(p, device=self.device, dtype=self.dtype)
        base = BaseModel(name, p, policy, classify_linears(policy.model))
        with self.lock:
            self.bases[name] = base
        return base

    def base(self, name: str) -> BaseModel:
        with self.lock:
            found = self.bases.get(name)
        if found is None:
            raise TinkerUserError(f"base model {name!r} is not served here (served: {sorted(self.bases)}); "
                                  "start the service with --model NAME=PATH")
        return found

    def trained(self, model_id: str) -> TrainingModel:
        with self.lock:
            found = self.training.get(model_id)
        if found is None:
            raise TinkerUserError(f"no training model {model_id!r} in this service (unloaded, or from another server)")
        return found

    # ------------------------------------------------------------------ training models

    def create(self, model_id: str, base_name: str, lora: LoraSpec | None) -> TrainingModel:
        base = self.base(base_name)
        if lora is not None and (lora.rank <= 0 or self.full_weight):
            lora = None
        if lora is None:
            policy = load_policy(base.path, device=self.device, dtype=self.dtype)  # its own copy of the weights
            params = list(policy.model.parameters())
        else:
            policy = base.policy
            params = self._add_adapter(base, _adapter_name(model_id), lora)
        tm = TrainingModel(model_id, base, lora, policy, build_optimizer(params, lr=1e-4, betas=(0.9, 0.95)))
        with self.lock:
            self.training[model_id] = tm
        return tm

    def _add_adapter(self, base: BaseModel, name: str, spec: LoraSpec) -> list[torch.nn.Parameter]:
        import peft

        targets = lora_targets(base.linears, spec)
        cfg = peft.LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets,
                              bias="none", task_type="CAUSAL_LM")
        cfg.base_model_name_or_path = str(base.path)
        fork = torch.random.fork_rng(devices=[]) if spec.seed is not None else nullcontext()
        with fork:
            if spec.seed is not None:
                torch.manual_seed(spec.seed)
            if base.peft is None:
                base.peft = peft.get_peft_model(base.policy.model, cfg, adapter_name=name)
                base.policy.model = base.peft.get_base_model()  # the injected model: tether's code paths see it
            else:
                base.peft.add_adapter(name, cfg)
        base.adapters += 1
        base.peft.set_adapter(name)
        params = [p for n, p in base.peft.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(True)
        return params

    def activate(self, tm: TrainingModel) -> HFPolicy:
        """The policy to run `tm` on: its adapter active (and trainable), or its own model."""
        if tm.adapter is not None:
            tm.base.peft.set_adapter(tm.adapter)
        return tm.policy

    def unload(self, model_id: str) -> None:
        tm = self.trained(model_id)
        with self.lock:
            del self.training[model_id]
        if tm.adapter is not None:
            tm.base.peft.delete_adapter(tm.adapter)

    # ------------------------------------------------------------------ samplers

    def sampler_for_base(self, sampler_id: str, base_name: str) -> Sampler:
        base = self.base(base_name)
        return self._keep(Sampler(sampler_id, base, base.policy))

    def snapshot(self, sampler_id: str, tm: TrainingModel, model_path: str | None = None) -> Sampler:
        """A sampler on `tm`'s current weights: a copy of the model (full weights, or a LoRA merged into
        a copy of its base when the base has at most `merge_max_params` weights: tether's fast decoder
        then samples it), else a copy of the adapter under a new adapter name."""
        ephemeral = model_path is None
        if tm.adapter is None or self._merges(tm.base):
            model = copy.deepcopy(tm.policy.model) if tm.adapter is None else self._merged(tm)
            model.requires_grad_(False)
            return self._keep(Sampler(sampler_id, tm.base, replace(tm.policy, model=model, version=tm.steps),
                                      model_path=model_path, ephemeral=ephemeral))
        name = _adapter_name(sampler_id)
        peft = tm.base.peft
        peft.add_adapter(name, copy.deepcopy(peft.peft_config[tm.adapter]))
        src = {n.replace(f".{tm.adapter}.", f".{name}."): p for n, p in peft.named_parameters() if f".{tm.adapter}." in n}
        with torch.no_grad():
            for n, p in peft.named_parameters():
                if f".{name}." in n:
                    p.copy_(src[n])
                    p.requires_grad_(False)
        return self._keep(Sampler(sampler_id, tm.base, tm.policy, adapter=name, model_path=model_path,
                                  ephemeral=ephemeral))

    def _merges(self, base: BaseModel) -> bool:
        return sum(p.numel() for p in base.policy.model.parameters() if not p.requires_grad) <= self.merge_max_params

    def _merged(self, tm: TrainingModel) -> torch.nn.Module:
        """A plain copy of the base with `tm`'s adapter added in: W + scaling * B @ A per adapted layer."""
        base = tm.base
        if base.plain is None:
            base.plain = load_policy(base.path, device=self.device, dtype=self.dtype).model
        model = copy.deepcopy(base.plain)
        plain = dict(model.named_modules())
        with torch.no_grad():
            for name, mod in base.peft.get_base_model().named_modules():
                if tm.adapter in getattr(mod, "lora_A", {}):
                    delta = mod.lora_B[tm.adapter].weight @ mod.lora_A[tm.adapter].weight
                    plain[name].weight += mod.scaling[tm.adapter] * delta.to(plain[name].weight.dtype)
        return model

    def sampler_from_path(self, sampler_id: str, path: str) -> Sampler:
        """A sampler on a saved checkpoint (either kind)."""
        d, meta = self.checkpoint_dir(path)
        base = self.base(meta["base_model"])
        if not meta["is_lora"]:
            policy = load_policy(d, device=self.device, dtype=self.dtype)
            policy.model.requires_grad_(False)
            return self._keep(Sampler(sampler_id, base, policy, model_path=path))
        import peft
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        name = _adapter_name(sampler_id)
        cfg = peft.LoraConfig.from_pretrained(str(d))
        if base.peft is None:
            base.peft = peft.get_peft_model(base.policy.model, cfg, adapter_name=name)
            base.policy.model = base.peft.get_base_model()
        else:
            base.peft.add_adapter(name, cfg)
        set_peft_model_state_dict(base.peft, load_file(str(d / "adapter_model.safetensors")), adapter_name=name)
        for n, p in base.peft.named_parameters():
            if f".{name}." in n:
                p.requires_grad_(False)
        return self._keep(Sampler(sampler_id, base, base.policy, adapter=name, model_path=path))

    def _keep(self, s: Sampler) -> Sampler:
        with self.lock:
            self.samplers[s.sampler_id] = s
            self.sampler_info[s.sampler_id] = (s.base.name, s.model_path)
            loaded = [k for k, v in self.samplers.items() if v.policy is not v.base.policy or v.adapter]
            evict = loaded[:max(0, len(loaded) - self.max_samplers)]
            gone = [self.samplers.pop(k) for k in evict]
        for old in gone:
            if old.adapter is not None:
                old.base.peft.delete_adapter(old.adapter)
        return s

    def sampler(self, sampler_id: str) -> Sampler:
        """A loaded sampler (most recently used last); a named one evicted earlier is reloaded."""
        with self.lock:
            s = self.samplers.get(sampler_id)
            if s is not None:
                self.samplers.move_to_end(sampler_id)
                return s
            info = self.sampler_info.get(sampler_id)
        if info is None:
            raise TinkerUserError(f"no sampler {sampler_id!r} in this service")
        base_name, model_path = info
        if model_path is None:
            raise TinkerUserError(f"sampler {sampler_id!r} was an ephemeral snapshot and has been dropped (this service "
                                  f"keeps the {self.max_samplers} most recent: --max-samplers); save named sampler "
                                  "weights (save_weights_for_sampler) to keep one")
        return self.sampler_from_path(sampler_id, model_path)

    @staticmethod
    def sampling_policy(s: Sampler):
        """A context manager that switches the shared base to the sampler's weights while it samples."""
        if s.base.peft is None or s.policy is not s.base.policy:
            return nullcontext()
        if s.adapter is None:
            return s.base.peft.disable_adapter()
        s.base.peft.set_adapter(s.adapter)
        return nullcontext()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, path: str) -> tuple[Path, dict[str, Any]]:
        model_id, kind, name = parse_tinker_path(path)
        d = self.state_dir / _safe(model_id) / kind / name
        if not (d / META).is_file():
            raise TinkerUserError(f"{path}: no such checkpoint in this service's state directory ({self.state_dir})")
        return d, json.loads((d / META).read_text())

    def save(self, tm: TrainingModel, kind: str, name: str, with_optimizer: bool, overwrite: bool = True) -> str:
        """Write `tm`'s weights (and AdamW state) to tinker://<model_id>/<kind>/<name>; returns the path."""
        path = f"tinker://{tm.model_id}/{kind}/{name}"
        parse_tinker_path(path)
        final = self.state_dir / _safe(tm.model_id) / kind / name
        if final.exists() and not overwrite:
            raise TinkerUserError(f"{path} exists; pass overwrite=True to replace it")
        params = [p for p in tm.optimizer.param_groups[0]["params"]]
        if not compute_all_finite(params):
            raise TinkerUserError(f"refusing to save {path}: the weights are not finite")
        tmp = final.with_name(f".tmp-{name}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if tm.adapter is None:
            tm.policy.model.save_pretrained(str(tmp), safe_serialization=True)
        else:
            self._save_adapter(tm, tmp)
        tm.policy.tokenizer.save_pretrained(str(tmp))
        if with_optimizer:
            torch.save(tm.optimizer.state_dict(), tmp / OPTIMIZER)
        meta = {"base_model": tm.base.name, "base_path": str(tm.base.path), "is_lora": tm.lora is not None,
                "lora": None if tm.lora is None else vars(tm.lora), "model_id": tm.model_id, "kind": kind,
                "steps": tm.steps, "time": time.time(), "optimizer": with_optimizer}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return path

    @staticmethod
    def _save_adapter(tm: TrainingModel, out: Path) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        peft = tm.base.peft
        # the base's tied embedding is not part of the adapter's own weights: never copy it
        state = get_peft_model_state_dict(peft, adapter_name=tm.adapter, save_embedding_layers=False)
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "adapter_model.safetensors"))
        cfg = copy.deepcopy(peft.peft_config[tm.adapter])
        cfg.base_model_name_or_path = str(tm.base.path)
        cfg.save_pretrained(str(out))

    def load(self, tm: TrainingModel, path: str, with_optimizer: bool) -> None:
        """Load a checkpoint's weights (and AdamW state) into `tm` (same kind, same LoRA shape)."""
        d, meta = self.checkpoint_dir(path)
        if meta["is_lora"] != (tm.lora is not None) or meta["base_model"] != tm.base.name:
            raise TinkerUserError(f"{path} holds {'a LoRA adapter' if meta['is_lora'] else 'full weights'} of "
                                  f"{meta['base_model']!r}; model {tm.model_id} is "
                                  f"{'a LoRA adapter' if tm.lora else 'full weights'} of {tm.base.name!r}")
        if tm.adapter is None:
            from tether.io.checkpoint import do_load_weights

            do_load_weights(d, tm.policy.model)
        else:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(tm.base.peft, load_file(str(d / "adapter_model.safetensors")), adapter_name=tm.adapter)
        if with_optimizer:
            if not (d / OPTIMIZER).is_file():
                raise TinkerUserError(f"{path} has no optimizer state (saved by save_weights_for_sampler?); "
                                      "load it without the optimizer")
            tm.optimizer.load_state_dict(torch.load(d / OPTIMIZER, map_location=tm.policy.device, weights_only=True))
        tm.steps = int(meta.get("steps", 0))

    def lora_spec_of(self, path: str) -> tuple[str, LoraSpec | None]:
        _, meta = self.checkpoint_dir(path)
        spec = meta.get("lora")
        return meta["base_model"], (LoraSpec(**spec) if spec else None)

    def list_checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        out = []
        for kind in ("weights", "sampler_weights"):
            root = self.state_dir / _safe(model_id) / kind
            for d in sorted(root.glob("*")) if root.is_dir() else ():
                if (d / META).is_file():
                    meta = json.loads((d / META).read_text())
                    out.append({"name": d.name, "kind": kind, "time": meta["time"],
                                "path": f"tinker://{model_id}/{kind}/{d.name}",
                                "size_bytes": sum(f.stat().st_size for f in d.iterdir())})
        return out


def _safe(model_id: str) -> str:
    return model_id.replace(":", "-").replace("/", "_")
