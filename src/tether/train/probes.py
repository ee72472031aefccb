"""The update's self-checks: cheap probes that need no fault model (read by tether.health).

Each probe measures a property every correct update has, whatever the model or task; the
detectors of `tether.health.detectors_progress` judge them. What `run_update` logs:

    update/logp_gain      sum_t A (logp_after - logp_before) / sum_t |A| over a few probe rows of
                          the batch, measured around the whole update: > 0 when the update moved
                          the policy along its advantages (the first-order gain of the surrogate)
    update/logp_change    mean |logp_after - logp_before| on the probe rows' loss tokens: how far
                          the policy moved on the tokens it sampled
    update/step_ratio     ||theta_after - theta_before|| / (lr x sqrt(N)) per optimizer step of the
                          policy's parameters, the LR read before the step (Adam moves each
                          element by lr x |m / sqrt(v)| <= ~lr): a step far from what the LR
                          implies is a hidden LR scale, a broken optimizer state, or a gradient
                          that does not reach the weights
    update/frozen_frac    trainable parameter tensors (requires_grad) that did not move at all in an
                          optimizer step although they had a non-zero gradient, or had no gradient
                          at all (max over the update's steps): 0 in a correct update (every
                          trainable tensor gets a gradient; Adam moves every tensor whose gradient
                          or momentum is non-zero); an all-zero gradient (no signal) is not frozen
    update/norm_ratio     the loss normaliser's weights summed over the micro-batches over the same
                          weights of the whole mini-batch with a freshly computed normaliser: 1
                          when every token is counted once (house rule 7); max |ratio - 1| + 1
    update/kl_pre         approx_kl of the first mini-batch, before the first optimizer step: the
                          trainer's gradient forward against its own scoring pass on the same
                          weights, ~0 (NaN in fused mode, where pi_old is that forward)
    update/kl_live        1 when the KL term added to the loss carries a gradient to the policy
                          (its coefficient on, KL in the loss), 0 when it does not; absent otherwise
    update/kl_pre_sampler approx_kl of the first mini-batch's training forward against the sampler's
                          log-probs of the same tokens (NaN in fused mode and without sampler
                          log-probs): beside `update/kl_pre` it says which of the three log-prob
                          sources is the odd one out - a gap between pi_old and a training forward
                          that agrees with the sampler puts the fault in pi_old, not in a forward
    update/grad_cos_prev  cosine between the gradient an optimizer step applies and the previous
                          step's, on a fixed strided sample of <= 256 elements per tensor: gradients
                          of fresh batches are nearly independent draws; a gradient that carries the
                          previous ones (not cleared between steps) points the same way step after step

    update/moments_changed the policy's parameter tensors whose optimizer state (Adam's step count and a
                          fixed strided sample of both moments) at an optimizer step is not what the
                          previous optimizer step left (max over the update's steps): 0 when nothing
                          but `optimizer.step()` writes the state; a restore in the wrong scale, a
                          reset, another run's state make it move
    update/moments_scale  over those tensors, the second moments' sampled sum now over what the last
                          step left (0: the state is gone, < 1: each later step larger, > 1: smaller)
    update/moments_spread the largest over the smallest tensor's own such ratio (1: one rescale of all,
                          or all lost; far from 1: the moments of other tensors, a reordered restore)
    update/moments_steps  Adam's step counter over what the last step left (> 0: optimizer.step() ran
                          in between, outside the update's loop)
    update/moments_rewound  how far that counter went back (> 0: reset or restored without the moments)
    update/moments_rounded  of the sampled moment elements that changed and are not 0, the share exactly
                          representable in bfloat16 (fp32 moments Adam wrote: ~2^-16 of them by chance; a
                          state stored in a low-precision type and cast back: all of them); absent under 8
    update/opt_beta1, update/opt_beta2, update/opt_eps, update/opt_weight_decay
                          the policy's param group's settings each optimizer step used (mean over the
                          update's steps): the health layer compares them with the run's first step's

`update/logp_gain` costs one no-grad forward of a few rows after the update (before it, their
log-probs are pi_old's when it is scored, else - one pass, one mini-batch - the training forward's);
the rest reuses what the update computes (the weight copy of `tether.train.step.do_checked_step`, the loss terms).
`time/probes` logs their time (the probe forwards and the step statistics).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tether.algos import agg_loss, compute_agg_norm


def choose_probe_rows(adv_BT: torch.Tensor, mask_BT: torch.Tensor, k: int) -> torch.Tensor | None:
    """Up to `k` rows with a non-zero advantage under the mask, evenly spaced (deterministic); None if none."""
    live = ((adv_BT != 0) & (mask_BT > 0)).any(-1).nonzero().squeeze(-1)
    if live.numel() == 0 or k <= 0:
        return None
    pick = torch.linspace(0, live.numel() - 1, min(k, live.numel())).round().long()
    return live[pick]


def fill_probe_rows(rows: torch.Tensor, before_KT: torch.Tensor, batch_rows: torch.Tensor, logp_BT: torch.Tensor) -> None:
    """Copy the probe `rows`' log-probs out of a micro-batch's forward into `before_KT` (`batch_rows`:
    the micro-batch's rows' indices in the batch; its length may be trimmed to its longest row)."""
    for i, b in enumerate(batch_rows.tolist()):
        hit = (rows == b).nonzero()
        if hit.numel():
            before_KT[int(hit[0, 0]), : logp_BT.shape[1]] = logp_BT[i].to(before_KT)


def probe_size(rows: int) -> int:
    """Probe rows of a batch of `rows` sequences: 1/32 of it, 4 to 16. Their no-grad forward after the
    update is the layer's largest cost: on the demo (128 sequences) the probes took 5.0 s of 40 steps
    with 8 rows and 1.7 s with 4 (benchmarks/results/health_overhead_8rows_2026-12-04.json,
    health_overhead.json)."""
    return min(16, max(4, rows // 32))


def compute_logp_progress(before_BT: torch.Tensor, after_BT: torch.Tensor, adv_BT: torch.Tensor,
                          mask_BT: torch.Tensor) -> dict[str, float]:
    """`update/logp_gain` and `update/logp_change` of the probe rows (see the module docstring)."""
    m = mask_BT > 0
    d = (after_BT.double() - before_BT.double())[m]
    a = adv_BT.double()[m]
    if d.numel() == 0 or float(a.abs().sum()) == 0.0:
        return {}
    return {"update/logp_gain": float((a * d).sum() / a.abs().sum()), "update/logp_change": float(d.abs().mean())}


SKETCH_PER_TENSOR = 256


def _strided(t: torch.Tensor, size: int) -> torch.Tensor:
    """<= `size` elements of `t` at fixed strided positions (the same every step), float64 on the CPU;
    an FSDP2 shard: this rank's, the same every step."""
    flat = (t.to_local() if hasattr(t, "to_local") else t).detach().reshape(-1)
    return flat[:: max(1, flat.numel() // size)][:size].double().cpu()


def compute_grad_sketch(grads: list[torch.Tensor | None], size: int = SKETCH_PER_TENSOR) -> torch.Tensor | None:
    """A fixed strided sample (<= `size` elements of each tensor, the same positions every step) of
    the gradients, in float64: cosines between steps' sketches track the gradients' own."""
    with torch.no_grad():
        parts = [_strided(g, size) for g in grads if g is not None]
    return torch.cat(parts) if parts else None


def compute_logp_shift(old_BT: torch.Tensor, rollout_BT: torch.Tensor, mask_BT: torch.Tensor, floor: float = 1e-3,
                       ratio: float = 0.1) -> dict[str, torch.Tensor]:
    """Where a rollout/trainer log-prob gap sits: `logp_gap_rows`, the rows whose mean |log pi_old - log mu|
    over their sampled tokens exceeds `floor`, and `logp_shift_rows`, those of them whose gap one position of
    shift (mu's token t against pi_old's t + 1, or t - 1) takes below `ratio` x - the engine's log-probs are
    real, filed at the wrong positions. A sampler that computes differently leaves a gap at every shift.
    `logp_zero_rows`: gapped rows whose gap sits (all but `ratio` of it) on tokens the engine's record
    says had probability exactly 1 (log-prob 0.0) - a record padded where the engine returned nothing
    (its log-probs came back shorter than the tokens), not a distribution that differs."""
    with torch.no_grad():
        keep = mask_BT > 0
        old, mu = old_BT.detach().double(), rollout_BT.detach().double()
        gap = ((old - mu).abs() * keep).sum(-1) / keep.sum(-1).clamp(min=1)
        pair = keep[:, 1:] & keep[:, :-1]
        n = pair.sum(-1)
        inf = torch.full_like(gap, float("inf"))
        later = torch.where(n > 0, ((old[:, 1:] - mu[:, :-1]).abs() * pair).sum(-1) / n.clamp(min=1), inf)
        earlier = torch.where(n > 0, ((old[:, :-1] - mu[:, 1:]).abs() * pair).sum(-1) / n.clamp(min=1), inf)
        has = gap > floor
        shifted = has & (torch.minimum(later, earlier) < ratio * gap)
        diff = (old - mu).abs() * keep
        zeroed = has & ((diff * (mu == 0.0)).sum(-1) >= (1.0 - ratio) * diff.sum(-1))
    return {"logp_gap_rows": has.sum().float(), "logp_shift_rows": shifted.sum().float(),
            "logp_zero_rows": zeroed.sum().float()}


def compute_cosine(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Cosine of two sketches (NaN when either is missing, empty, zero or of another shape)."""
    if a is None or b is None or a.shape != b.shape:
        return float("nan")
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else float("nan")


def compute_step_stats(params: list[torch.Tensor], before: list[torch.Tensor], lr: float,
                       grads: list[torch.Tensor | None]) -> dict[str, float]:
    """`update/step_ratio` and `update/frozen_frac` of one optimizer step over `params` (the
    policy's), `before` their values and `grads` their gradients before the step, `lr` the LR
    the step was asked for."""
    rows = [(p, w, g) for p, w, g in zip(params, before, grads) if p.requires_grad]
    if not rows or lr <= 0:
        return {}
    with torch.no_grad():
        norms = torch._foreach_norm(torch._foreach_sub([p.detach() for p, _, _ in rows], [w for _, w, _ in rows]))
        sq = torch.stack([n.double() ** 2 for n in norms])
        pushed = [g is None or bool(g.detach().abs().amax() > 0) for _, _, g in rows]  # None: no gradient reached it
    n = sum(p.numel() for p, _, _ in rows)
    frozen = [bool(s == 0) and push for s, push in zip(sq, pushed)]
    return {"update/step_ratio": math.sqrt(float(sq.sum())) / (lr * math.sqrt(n)),
            "update/frozen_frac": sum(frozen) / len(frozen)}


MOMENT_SAMPLES = 8
HPARAMS = (("update/opt_beta1", "betas", 0), ("update/opt_beta2", "betas", 1), ("update/opt_eps", "eps", None),
           ("update/opt_weight_decay", "weight_decay", None))


def compute_moment_sketch(optimizer, size: int = MOMENT_SAMPLES) -> torch.Tensor | None:
    """The optimizer state of the first param group's tensors, sampled: one float64 row per tensor,
    [Adam's step, <= `size` strided elements of `exp_avg_sq`, of `exp_avg`] (zero-padded, the same
    positions every step; NaN for a tensor without state, as for every tensor of an optimizer without Adam
    moments). None without parameters."""
    rows, width = [], 1 + 2 * size
    with torch.no_grad():
        for p in optimizer.param_groups[0]["params"]:
            st = optimizer.state.get(p) or {}
            if "exp_avg_sq" not in st:
                rows.append(torch.full((width,), float("nan"), dtype=torch.float64))
                continue
            parts = [torch.tensor([float(st.get("step", 0))], dtype=torch.float64)]
            for key in ("exp_avg_sq", "exp_avg"):
                x = _strided(st[key], size)
                parts.append(torch.nn.functional.pad(x, (0, size - x.numel())))
            rows.append(torch.cat(parts))
    # a tensor without state is a NaN row: a state lost between steps (every tensor's) compares as gone
    return torch.stack(rows) if rows else None


ROUNDED_MIN = 8  # changed non-zero moment elements below which `update/moments_rounded` is not stated


def compute_moment_change(before: torch.Tensor | None, now: torch.Tensor | None) -> dict[str, float] | None:
    """How the optimizer state an optimizer step starts from (`now`) differs from what the previous one
    left (`before`); None when there is nothing to compare (no earlier step, another layout):

    update/moments_changed  the fraction of tensors (with state before) whose sampled state changed
    update/moments_scale    their second moments' sampled sum now / before (a tensor whose state vanished: 0)
    update/moments_spread   the largest over the smallest of those tensors' own ratios (1: one rescale of
                            every tensor, or all lost; far from 1: moments of other tensors)
    update/moments_steps    Adam's step counter now minus before, at most (> 0: optimizer.step() ran between)
    update/moments_rewound  how far the counter went back, at most (> 0: a reset or a restore of the counter)
    update/moments_rounded  the changed non-zero sampled moments' share on the bfloat16 grid (rounded to a
                            low-precision type: 1; rescaled or another tensor's fp32 moments: ~0); absent under
                            `ROUNDED_MIN` such elements
    """
    if before is None or now is None or before.shape != now.shape:
        return None
    had = ~before[:, 0].isnan()
    if not bool(had.any()):
        return None
    gone = now[:, 0].isnan() & had
    changed = had & (gone | (now != before).any(-1))
    if not bool(changed.any()):
        return {"update/moments_changed": 0.0}
    size = (before.shape[1] - 1) // 2
    was = before[changed, 1:1 + size].sum(-1)
    is_ = torch.nan_to_num(now[changed, 1:1 + size], nan=0.0).sum(-1)
    ratios = [float(i / w) for i, w in zip(is_, was) if w > 0]
    lo, hi = (min(ratios), max(ratios)) if ratios else (1.0, 1.0)
    steps = torch.nan_to_num(now[had, 0] - before[had, 0], nan=0.0)
    w = float(was.sum())
    out = {}
    moved = now[changed, 1:]
    moved = moved[(moved != before[changed, 1:]) & (moved != 0) & ~moved.isnan()]
    if moved.numel() >= ROUNDED_MIN:
        x32 = moved.to(torch.float32)
        grid = (x32.to(torch.bfloat16).to(torch.float32) == x32) & (x32.to(torch.float64) == moved)
        out["update/moments_rounded"] = float(grid.float().mean())
    return {**out, "update/moments_changed": float(changed.sum()) / float(had.sum()),
            "update/moments_scale": float(is_.sum()) / w if w > 0 else float("inf") if float(is_.sum()) > 0 else 1.0,
            "update/moments_spread": 1.0 if hi == 0 else hi / lo if lo > 0 else float("inf"),
            "update/moments_steps": float(steps.max()), "update/moments_rewound": max(0.0, -float(steps.min()))}


def compute_hparams(optimizer) -> dict[str, float]:
    """`update/opt_*`: the first param group's Adam settings (those it has)."""
    g, out = optimizer.param_groups[0], {}
    for key, name, i in HPARAMS:
        if name in g:
            v = g[name] if i is None else g[name][i]
            out[key] = float(v)
    return out


class PreSamplerKL:
    """`update/kl_pre_sampler`: approx_kl (k3) of the training forward against the sampler's
    log-probs over the first mini-batch's loss tokens (those with a finite sampler log-prob)."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0.0

    def add(self, logp_BT: torch.Tensor, rollout_BT: torch.Tensor, mask_BT: torch.Tensor) -> None:
        with torch.no_grad():
            T = min(logp_BT.shape[1], rollout_BT.shape[1])
            lr = logp_BT[:, :T].double() - rollout_BT[:, :T].double()  # log(pi_train / pi_sampler): approx_kl's form
            keep = (mask_BT[:, :T] > 0) & torch.isfinite(lr)
            k3 = torch.where(keep, torch.expm1(lr.clamp(max=20.0)) - lr, torch.zeros_like(lr))
            self.total += float(k3.sum())
            self.count += float(keep.sum())

    def result(self) -> float:
        return self.total / self.count if self.count else float("nan")


class NormCheck:
    """`update/norm_ratio`: per mini-batch, the normaliser's token weights summed over its
    micro-batches against the whole mini-batch's under a freshly computed normaliser."""

    def __init__(self, mode: str, max_len: int | None) -> None:
        self.mode, self.max_len, self.worst = mode, max_len, 0.0
        self._sum = 0.0

    def add(self, mask_BT: torch.Tensor, norm: Any) -> None:
        """A micro-batch's mask and the normaliser its loss was divided by."""
        self._sum += float(agg_loss(torch.ones_like(mask_BT), mask_BT, self.mode, norm))

    def end(self, mini_mask_BT: torch.Tensor) -> None:
        ref = float(agg_loss(torch.ones_like(mini_mask_BT), mini_mask_BT, self.mode,
                             compute_agg_norm(mini_mask_BT, self.max_len)))
        if ref > 0:
            self.worst = max(self.worst, abs(self._sum / ref - 1.0))
        self._sum = 0.0

    def result(self) -> dict[str, float]:
        return {"update/norm_ratio": 1.0 + self.worst}


__all__ = ["NormCheck", "PreSamplerKL", "choose_probe_rows", "compute_cosine", "compute_grad_sketch", "compute_hparams",
           "compute_logp_progress", "compute_moment_change", "compute_moment_sketch", "compute_step_stats", "fill_probe_rows", "probe_size"]
