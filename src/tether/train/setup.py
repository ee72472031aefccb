"""Set-up of a run: seeding, the problems, the policy (`model.path` or a tiny local model), LoRA,
the policy a checkpoint resumes, and summary.json's precision record."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tether.config import RunConfig, TetherConfig
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
from tether.tasks import demonstration, is_file_task, load_jsonl, make_splits


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


def setup_problems(cfg: TetherConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) problems from a built-in task, a JSONL file or a `datasets` source. A
    file without `data.eval_path` gives up `data.eval_size` of its rows as the held-out split."""
    configure_sandbox(cfg.sandbox.backend)  # before the tasks: the code environment checks it at start
    cpu_gemm.configure(cfg.model.cpu_linear)  # process-wide, like the sandbox: this run's CPU linear kernels
    d = cfg.data
    if d.task == "hf":
        from tether.tasks.hf import setup_hf_problems

        return setup_hf_problems(d)
    if d.task == "jsonl":
        from tether.tasks.hf import split_held_out

        rows = load_jsonl(d.path)
        if d.eval_path:
            return rows, load_jsonl(d.eval_path)
        train, held = split_held_out(rows, d.eval_size, d.seed)
        print(f"[tether] data: no data.eval_path; holding out {len(held)} of {len(rows)} rows of {d.path} "
              f"for evaluation — they are never trained on", flush=True)
        return train, held
    return make_splits(d.task, d.train_size, d.eval_size, d.seed, d.task_kwargs)


def tokenizer_corpus(cfg: TetherConfig, problems: list[dict[str, Any]]) -> list[str]:
    """Text for the tiny model's BPE: each prompt with its demonstration — the answer for file
    tasks and for environments without a scripted expert (OpenEnv, verifiers, MCP adapters)."""
    from tether.envs import ENVS

    no_expert = cfg.data.task in ENVS and ENVS[cfg.data.task]().expert is None
    texts = []
    for p in problems:
        plain = is_file_task(cfg.data.task) or no_expert
        demo = p.get("completion") or (str(p.get("answer", "")) if plain else demonstration(cfg.data.task, p))
        texts.append(p["prompt"] + demo)
    return texts


def setup_policy(cfg: TetherConfig, run_dir: Path, problems: list[dict[str, Any]]) -> HFPolicy:
    """Load `model.path`, or build a tiny model + tokenizer for the task (saved to base_model/)."""
    m = cfg.model
    if m.path:
        policy = load_policy(m.path, m.device, m.dtype, m.autocast_bf16)
    else:
        from tether.policy.tiny import build_tiny_model, build_tokenizer

        out = Path(run_dir) / "base_model"
        tok = build_tokenizer(tokenizer_corpus(cfg, problems), m.tiny.vocab_size)
        model = build_tiny_model(m.tiny, tok, out, seed=cfg.run.seed)
        if m.dtype == "bfloat16":
            model.to(torch.bfloat16)
        policy = make_policy(model, tok, m.device, m.autocast_bf16)
    if m.lora is not None:  # adapters name their base: a full model, never another adapter (saved merged here)
        own = m.path and not is_adapter_dir(m.path)
        attach_lora(policy, cfg, Path(m.path) if own else Path(run_dir) / "base_model")
    if m.gradient_checkpointing:
        enable_checkpointing(policy.model)
    print(f"[tether] precision: {'bf16 autocast' if policy.autocast_bf16 else 'fp32'} ("
          f"{choose_precision(m.autocast_bf16, m.device).reason})", flush=True)
    if str(m.device).startswith("cpu"):
        print(f"[tether] CPU linear layers: {cpu_gemm.backend()} ({cpu_gemm.reason()})", flush=True)
    return policy


def attach_lora(policy: HFPolicy, cfg: TetherConfig, base_path: Path) -> None:
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
    policy.model = apply_lora(policy.model, cfg.model.lora, base_path)
    trainable, total = count_parameters(policy.model)
    print(f"[tether] LoRA r={cfg.model.lora.r}: {trainable:,} of {total:,} parameters train "
          f"({100 * trainable / total:.2f}%); base {base_path}", flush=True)


def load_resume_policy(cfg: TetherConfig, ckpt: Path) -> HFPolicy:
    """The policy a checkpoint resumes: a full model as saved, or (LoRA) its base with fresh
    adapters for `load_checkpoint` to fill."""
    m = cfg.model
    if not is_adapter_dir(ckpt):
        return load_policy(ckpt, m.device, m.dtype, m.autocast_bf16)
    if m.lora is None:
        raise ValueError(f"{ckpt} is a LoRA checkpoint but model.lora is not set: resume with the run's config")
    base = adapter_base_path(ckpt)
    policy = load_policy(base, m.device, m.dtype, m.autocast_bf16)
    attach_lora(policy, cfg, base)
    return policy


def precision_summary(cfg: TetherConfig, policy: HFPolicy) -> dict[str, Any]:
    """summary.json's `precision`: the setting, the precision used and why, the CPU model and flags."""
    return precision_record(cfg.model.autocast_bf16, cfg.model.device, policy.autocast_bf16)
