"""Merge checkpoints in weight space (long2short's model merge, Kimi k1.5 arXiv 2501.12599 §2.4):
linear averaging or task arithmetic, `tether.algos.merge`. No training, no sampling.

    tether pipeline CONFIG     with a stage {kind: merge, overrides: {merge: {models: [previous, long_rl]}}}

`merge.models` are model directories (Hugging Face format, safetensors weights); in a pipeline
also earlier stages' names, and `previous` (the incoming model). The merged model is written to
`final_model/` with the first model's config and tokenizer.

Deliberate simplification: every state dict is loaded into memory at once (tiny models).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tether.algos.merge import compute_linear_merge, compute_task_arithmetic
from tether.config import ConfigError, TetherConfig
from tether.runs.lifecycle import do_finish_run
from tether.runs.resume import do_open_run


def read_state_dict(model_dir: str | Path, what: str = "merge.models") -> dict[str, torch.Tensor]:
    """All tensors of a model directory's `model*.safetensors` files (a LoRA adapter: merged into its base)."""
    from tether.policy.lora import is_adapter_dir, load_adapter_merged

    if is_adapter_dir(model_dir):  # a LoRA stage's result: the weights it stands for are base + adapter,
        import tempfile  # saved as transformers saves any model (tied weights once), like a full stage's

        with tempfile.TemporaryDirectory() as tmp:
            load_adapter_merged(model_dir).save_pretrained(tmp, safe_serialization=True)
            return read_state_dict(tmp, what)
    files = sorted(Path(model_dir).glob("model*.safetensors"))
    if not files:
        raise ConfigError(f"{what}: {model_dir} has no model*.safetensors; point it at a trained model directory "
                          "(a run's final_model/ or checkpoints/step_N/) or an earlier stage's name")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f), device="cpu"))
        except (SafetensorError, OSError) as err:  # a damaged or truncated file: the user's input, named
            raise ConfigError(f"{what}: {f} is not a readable safetensors file ({err})") from None
    return state


def write_model(first: Path, state: dict[str, torch.Tensor], out: Path) -> Path:
    """`first`'s config and tokenizer files plus `state` as one model.safetensors (a LoRA adapter's
    model config comes from its base; the result is a plain model either way)."""
    from tether.policy.lora import adapter_base_path, is_adapter_dir

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    skip = shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", "*.pt", "*.bin", "adapter_config.json",
                                  "manifest.json", "README.md")
    if is_adapter_dir(first):
        shutil.copytree(adapter_base_path(first), tmp, ignore=skip)
        shutil.copytree(first, tmp, ignore=skip, dirs_exist_ok=True)  # the tokenizer saved with the adapter
    else:
        shutil.copytree(first, tmp, ignore=skip)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def run_merge(cfg: TetherConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Merge `merge.models` (`previous` = model.path) into final_model/; writes summary.json."""
    t0 = time.perf_counter()
    m = cfg.merge
    rd = do_open_run(run_dir, cfg, "merge", resume=resume).run_dir  # never over another run (tether.runs.resume)
    models = [cfg.model.path if name == "previous" else name for name in m.models]
    if len(models) < (1 if m.method == "task_arithmetic" else 2) or any(not x for x in models):
        raise ConfigError(f"merge.models={m.models}: name {'one or more models' if m.method == 'task_arithmetic' else 'at least two models'} "
                          "(directories, earlier stages' names, or previous)")
    states = [read_state_dict(x) for x in models]
    try:
        if m.method == "task_arithmetic":
            base = cfg.model.path if m.base in (None, "previous") else m.base
            if not base:
                raise ConfigError("merge.method=task_arithmetic needs merge.base (the model the task vectors start from)")
            merged = compute_task_arithmetic(read_state_dict(base, "merge.base"), states, m.weights)
        else:
            merged = compute_linear_merge(states, m.weights)
    except ValueError as err:  # incompatible models, weights that do not fit: one line, named
        raise ConfigError(f"merge.models={m.models}: {err}") from None
    final = write_model(Path(models[0]), merged, rd.root / "final_model")
    summary = {"kind": "merge", "method": m.method, "models": [str(x) for x in models], "weights": m.weights,
               "final_model": str(final), "wall_seconds": time.perf_counter() - t0}
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, final)
    return summary
