"""Set-up of a run, each from the config sections it needs: the process (seed, sandbox, CPU
kernels), the problems, the policy (`model.path` or a tiny local model), LoRA, the policy a
checkpoint resumes, and summary.json's precision record."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tether.envs.config import SandboxConfig
from tether.envs.sandbox_backends import configure_sandbox

try:  # transformers' "Writing model shards" bars would flood the logs at every checkpoint
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    pass
from tether.hardware import choose_precision, precision_record
from tether.policy import cpu_gemm
from tether.policy.hf import HFPolicy, enable_checkpointing, load_policy, make_policy
from tether.policy.lora import adapter_base_path, apply_lora, count_parameters, is_adapter_dir, is_lora, peft_of
from tether.runtime import retain_freed_memory
from tether.policy.config import LoraConfig, ModelConfig
from tether.tasks.config import DataConfig
from tether.tasks.sources import load_split_problems
from tether.train.config import RunConfig


def seed_everything(seed: int, deterministic: bool | None = None, threads: int | str | None = None,
                    retain_memory: bool | None = None) -> None:
    """One seed reaches python, numpy and torch (pitfall 22); `deterministic=None` is on without CUDA.
    `retain_memory` (None: on without CUDA): glibc keeps freed memory for reuse (tether.runtime)."""
    if retain_memory is None:
        retain_memory = not torch.cuda.is_available()
    if retain_memory:
        retain_freed_memory()
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if threads == "auto":
        from tether.hardware import choose_threads

        threads, why = choose_threads(threads)
        print(f"[tether] threads: {threads} ({why})", flush=True)
    if threads:
        torch.set_num_threads(threads)
    if deterministic is None:
        deterministic = not torch.cuda.is_available()
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def seed_run(run: RunConfig) -> None:
    """`seed_everything` with the run config's seed, determinism, threads and memory setting."""
    seed_everything(run.seed, run.deterministic, run.threads, run.retain_memory)


def configure_process(sandbox: SandboxConfig, model: ModelConfig) -> None:
    """The process-wide settings a run makes before it builds its problems: where model-written code
    runs (`sandbox`: a code environment checks it when it starts) and the CPU linear-layer kernels
    (`model.cpu_linear`, tether.policy.cpu_gemm)."""
    configure_sandbox(sandbox.backend)
    cpu_gemm.configure(model.cpu_linear)


def setup_problems(data: DataConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) problems from a built-in task or a data source (tether.tasks.sources). A
    file without `data.eval_path` gives up `data.eval_size` of its rows as the held-out split."""
    return load_split_problems(data)


def setup_policy(model: ModelConfig, seed: int, run_dir: Path, corpus: Callable[[], list[str]]) -> HFPolicy:
    """Load `model.path`, or build a tiny model + tokenizer for the task (saved to base_model/);
    `corpus()`: the text its tokenizer trains on, asked only then (`tether.rollout.compute_tokenizer_corpus`)."""
    m = model
    if m.path:
        policy = load_policy(m.path, m.device, m.dtype, m.autocast_bf16)
    else:
        from tether.policy.tiny import build_tiny_model, build_tokenizer

        out = Path(run_dir) / "base_model"
        tok = build_tokenizer(corpus(), m.tiny.vocab_size)
        built = build_tiny_model(m.tiny, tok, out, seed=seed)
        if m.dtype == "bfloat16":
            built.to(torch.bfloat16)
        policy = make_policy(built, tok, m.device, m.autocast_bf16)
    if m.lora is not None:  # adapters name their base: a full model, never another adapter (saved merged here)
        own = m.path and not is_adapter_dir(m.path)
        attach_lora(policy, m.lora, Path(m.path) if own else Path(run_dir) / "base_model")
    if m.gradient_checkpointing:
        enable_checkpointing(policy.model)
    print(f"[tether] precision: {'bf16 autocast' if policy.autocast_bf16 else 'fp32'} ("
          f"{choose_precision(m.autocast_bf16, m.device).reason})", flush=True)
    if str(m.device).startswith("cpu"):
        print(f"[tether] CPU linear layers: {cpu_gemm.backend()} ({cpu_gemm.reason()})", flush=True)
    return policy


def attach_lora(policy: HFPolicy, lora: LoraConfig, base_path: Path) -> None:
    """`model.lora`: inject adapters into `policy.model` in place (tether.policy.lora). A policy
    handed over in memory (a pipeline stage) has its base saved to `base_path` first, because every
    adapter checkpoint names the directory of its base weights; one that already carries adapters
    (LoRA SFT -> LoRA RL) has them merged first, so this stage's base (and KL reference) is the
    previous stage's result."""
    if is_lora(policy.model):
        policy.model = peft_of(policy.model).merge_and_unload()
    if not (base_path / "config.json").is_file():
        policy.model.save_pretrained(str(base_path), safe_serialization=True)
        policy.tokenizer.save_pretrained(str(base_path))
    policy.model = apply_lora(policy.model, lora, base_path)
    trainable, total = count_parameters(policy.model)
    print(f"[tether] LoRA r={lora.r}: {trainable:,} of {total:,} parameters train "
          f"({100 * trainable / total:.2f}%); base {base_path}", flush=True)


def load_resume_policy(model: ModelConfig, ckpt: Path) -> HFPolicy:
    """The policy a checkpoint resumes: a full model as saved, or (LoRA) its base with fresh
    adapters for `load_checkpoint` to fill."""
    m = model
    if not is_adapter_dir(ckpt):
        return load_policy(ckpt, m.device, m.dtype, m.autocast_bf16)
    if m.lora is None:
        raise ValueError(f"{ckpt} is a LoRA checkpoint but model.lora is not set: resume with the run's config")
    base = adapter_base_path(ckpt)
    policy = load_policy(base, m.device, m.dtype, m.autocast_bf16)
    attach_lora(policy, m.lora, base)
    return policy


def precision_summary(model: ModelConfig, policy: HFPolicy) -> dict[str, Any]:
    """summary.json's `precision`: the setting, the precision used and why, the CPU model and flags."""
    return precision_record(model.autocast_bf16, model.device, policy.autocast_bf16, cpu_gemm.describe())
