"""Optimizer and learning-rate schedule (torch AdamW + LambdaLR)."""

from __future__ import annotations

import math

import torch


def build_optimizer(params, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters")
    # fused: one kernel per step instead of ~10 ops per tensor (CPU, 3.2M params: 6.6 -> 1.7 ms)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, schedule: str = "constant"):
    """Linear warm-up, then constant / cosine / linear decay over `total_steps` optimizer steps."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant" or total_steps <= warmup_steps:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress  # linear

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def compute_all_finite(tensors) -> bool:
    """True when every tensor is finite: one fused 2-norm per tensor (`torch._foreach_norm`), no copies.

    A tensor whose 2-norm overflows (fp32 entries ~1e19) counts as non-finite: such weights are broken too."""
    tensors = [t.detach() for t in tensors]
    if tensors and hasattr(tensors[0], "to_local"):  # FSDP2 shards (tether.dist.fsdp): every rank must agree
        import torch.distributed as tdist

        local = [t.to_local() for t in tensors]
        finite = bool(torch.isfinite(torch.stack(torch._foreach_norm(local)).float()).all())
        ok = torch.tensor(float(finite), device=local[0].device)
        tdist.all_reduce(ok, op=tdist.ReduceOp.MIN)
        return bool(ok)
    return not tensors or bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors)).float()).all())
