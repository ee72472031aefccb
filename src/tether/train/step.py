"""The guarded optimizer step and the update's counters that outlive a step (split from
tether.train.update, which runs the update around it; SFT and the Tinker service step with it too).

`do_guarded_step` clips, skips a non-finite gradient, undoes a step that leaves a non-finite weight
(pitfall 5), counts both and raises `TrainingHalted` after `max_bad_steps` in a row; it also gathers
the health layer's step statistics (tether.train.probes.compute_step_stats) when asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tether.optim import compute_all_finite
from tether.train.probes import compute_step_stats


class TrainingHalted(RuntimeError):
    """Raised when training cannot continue (e.g. repeated non-finite steps); names the cause."""


@dataclass
class UpdateState:
    """Counters that outlive one step (saved in checkpoints)."""

    bad_steps_in_a_row: int = 0
    nonfinite_steps: int = 0
    kl_coef: float = 0.0
    grad_sketch: torch.Tensor | None = None  # the last update's first gradient, sampled (`update/grad_cos_prev`)
    moments: torch.Tensor | None = None  # the optimizer state the last optimizer step left, sampled (`update/moments_changed`)



def do_checked_step(optimizer, params, stats: dict[str, list[float]] | None = None) -> bool:
    """`optimizer.step()`, undone when it leaves a non-finite parameter (pitfall 5: a finite gradient
    times a huge LR, an overflowing low-precision update). Keeps one copy of the parameters and their
    optimizer state for the undo. Returns False when the step was undone. `stats`: collects the
    step's `tether.train.probes.compute_step_stats` over the first param group (the policy's)."""
    with torch.no_grad():
        weights = [p.detach().clone() for p in params]
        state = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
                 for p in params if p in optimizer.state}
        lr = float(optimizer.param_groups[0]["lr"])  # before the step: what the step was asked to do
        own = {id(p) for p in optimizer.param_groups[0]["params"]} if stats is not None else set()
        pairs = [(p, w, p.grad) for p, w in zip(params, weights) if id(p) in own]
        optimizer.step()
        if compute_all_finite(params):
            if pairs:
                t0 = time.perf_counter()
                ps, ws, gs = map(list, zip(*pairs))
                for k, v in compute_step_stats(ps, ws, lr, gs).items():
                    stats.setdefault(k, []).append(v)
                stats.setdefault("time", []).append(time.perf_counter() - t0)
            return True
        torch._foreach_copy_([p.data for p in params], weights)
        for p in params:
            if p in state:
                optimizer.state[p] = state[p]
            else:
                optimizer.state.pop(p, None)
    return False


def _count_bad_step(optimizer, state: UpdateState, max_bad_steps: int, what: str) -> float:
    optimizer.zero_grad(set_to_none=True)
    state.nonfinite_steps += 1
    state.bad_steps_in_a_row += 1
    if state.bad_steps_in_a_row >= max_bad_steps:
        raise TrainingHalted(
            f"{state.bad_steps_in_a_row} optimizer steps in a row had {what} "
            f"(train.max_bad_steps={max_bad_steps}); likely causes: learning rate too high, "
            "extreme log-ratios (check algo.policy_loss.log_ratio_clamp), or a NaN reward"
        )
    return float("nan")


def do_guarded_step(optimizer, scheduler, params, grad_clip: float | None, max_bad_steps: int, state: UpdateState,
                    stats: dict[str, list[float]] | None = None) -> float:
    """Clip, check finiteness, step, check the weights; returns the gradient norm (NaN: skipped).

    A non-finite gradient skips the step, a step that makes a weight non-finite is undone; both are
    counted (`state.nonfinite_steps`) and `max_bad_steps` in a row raise `TrainingHalted`. `stats`:
    see `do_checked_step`."""
    total = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else float("inf"))
    if hasattr(total, "full_tensor"):  # FSDP2 shards (tether.dist.fsdp): the norm over every rank
        total = total.full_tensor()
    total_f = float(total)
    if not torch.isfinite(total):
        return _count_bad_step(optimizer, state, max_bad_steps, "a non-finite loss or gradient")
    if not do_checked_step(optimizer, params, stats):
        return _count_bad_step(optimizer, state, max_bad_steps, "an update that made the weights non-finite (undone)")
    state.bad_steps_in_a_row = 0
    if scheduler is not None:
        scheduler.step()
    return total_f


__all__ = ["TrainingHalted", "UpdateState", "do_checked_step", "do_guarded_step"]
