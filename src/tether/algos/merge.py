"""Weight-space merging of models that share an architecture (state dicts of equal keys/shapes).

- linear: theta = sum_i w_i theta_i with sum_i w_i = 1 (model soups, Wortsman et al. arXiv
  2203.05482 §2; Kimi k1.5's long2short merge averages a long- and a short-CoT model, arXiv
  2501.12599 §2.4);
- task arithmetic: theta = theta_base + sum_i lambda_i (theta_i - theta_base) (Ilharco et al.,
  arXiv 2212.04089 §2: "task vectors").

Arithmetic runs in float32 and is cast back to each tensor's dtype; integer buffers (none in a
causal LM's safetensors, but possible) are taken from the first model unchanged.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

StateDict = Mapping[str, torch.Tensor]


def _check_compatible(states: Sequence[StateDict]) -> None:
    if not states:
        raise ValueError("merge: no models given")
    keys = set(states[0])
    for i, s in enumerate(states[1:], 1):
        if set(s) != keys:
            diff = sorted(set(s) ^ keys)[:3]
            raise ValueError(f"merge: model {i} has different tensors than model 0 (e.g. {diff}); "
                             "merge only models of one architecture")
        bad = [k for k in keys if s[k].shape != states[0][k].shape]
        if bad:
            raise ValueError(f"merge: model {i} tensor {bad[0]!r} has shape {tuple(s[bad[0]].shape)}, "
                             f"model 0 {tuple(states[0][bad[0]].shape)}")


def compute_linear_merge(states: Sequence[StateDict], weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """sum_i w_i theta_i; `weights` default uniform and must sum to 1 (a weighted average)."""
    _check_compatible(states)
    w = list(weights) if weights is not None else [1.0 / len(states)] * len(states)
    if len(w) != len(states):
        raise ValueError(f"merge: {len(w)} weights for {len(states)} models")
    if abs(sum(w) - 1.0) > 1e-6:
        raise ValueError(f"merge: linear weights must sum to 1 (got {sum(w):g}); use task_arithmetic to extrapolate")
    out = {}
    for k, t0 in states[0].items():
        if not t0.is_floating_point():
            out[k] = t0.clone()
            continue
        out[k] = sum(wi * s[k].float() for wi, s in zip(w, states)).to(t0.dtype)
    return out


def compute_task_arithmetic(base: StateDict, states: Sequence[StateDict],
                            lambdas: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """theta_base + sum_i lambda_i (theta_i - theta_base); `lambdas` default 1.0 each."""
    _check_compatible([base, *states])
    lam = list(lambdas) if lambdas is not None else [1.0] * len(states)
    if len(lam) != len(states):
        raise ValueError(f"merge: {len(lam)} lambdas for {len(states)} models")
    out = {}
    for k, b in base.items():
        if not b.is_floating_point():
            out[k] = b.clone()
            continue
        delta = sum(li * (s[k].float() - b.float()) for li, s in zip(lam, states))
        out[k] = (b.float() + delta).to(b.dtype)
    return out
