"""Tinker's built-in losses (`forward_backward(data, loss_fn=...)`), on tether's policy-loss registry.

Tinker's semantics (its loss docs; the per-token formulas are the ones tether's registry computes):
every loss is a SUM over the tokens of every datum, no normalisation (a script that wants a mean
scales its weights or advantages), and gradients accumulate over `forward_backward` calls until
`optim_step`. Per datum, position i of `model_input` predicts `target_tokens[i]`; `logp` below is
the trainer's log-prob of that target.

    cross_entropy        -(logp * weights)                        weights default to 1
    importance_sampling  -(r * A),  r = exp(logp - logprobs)      `logprobs`: the sampler's
    ppo                  -min(r A, clip(r, lo, hi) A)             lo, hi: clip_low_threshold /
    cispo                -(sg(clip(r, lo, hi)) * logp * A)        clip_high_threshold (0.8 / 1.2)

The three policy-gradient losses ARE tether's registered ones (`POLICY_LOSSES`): `ppo` is
`ppo_clip` with clip_low = 1 - lo and clip_high = hi - 1, `importance_sampling` is `ppo_clip` with
bounds that never bind (floor 0, cap above the largest ratio the log-ratio clamp allows), `cispo` is `cispo`. They are zero wherever the
advantage is 0 (the registry's `zero_at_zero_advantage` fact), so the registry's mask is the
positions with a non-zero advantage: the loss is Tinker's sum exactly, and the registry's metrics
(clip fractions, ratios) describe the trained tokens rather than the prompt. The log-ratio is
clamped at +-`log_ratio_clamp` before exp, as everywhere in tether.

Each loss returns the per-token loss [B, T] (0 on padding) and its metrics, named `name:reduction`
as the SDK's chunk combiner expects (`loss:sum`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from tether.algos import POLICY_LOSSES, PolicyLossInputs
from tether.algos.config import PolicyLossConfig
from tether.registry import Registry

TINKER_LOSSES: Registry[Callable] = Registry("Tinker loss")

DEFAULT_CLIP = (0.8, 1.2)  # Tinker's clip_low_threshold / clip_high_threshold (epsilon 0.2 both ways)


@dataclass(frozen=True)
class LossFacts:
    """What a Tinker loss reads: the `loss_fn_inputs` it needs and the `loss_fn_config` keys it takes."""

    inputs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    config: tuple[str, ...] = ()


@dataclass(frozen=True)
class LossBatch:
    """Right-padded [B, T] tensors of one forward_backward call (0 on padding)."""

    logp_BT: torch.Tensor  # the trainer's log-prob of each target token (carries the gradient)
    valid_BT: torch.Tensor  # bool: real positions
    inputs: Mapping[str, torch.Tensor]  # loss_fn_inputs other than target_tokens, float
    config: Mapping[str, float | str]


def check_loss_call(name: str, data_inputs: list[Mapping[str, object]], config: Mapping[str, object]) -> str | None:
    """None when `name` can run on these datums with this config, else the one-line problem."""
    if name not in TINKER_LOSSES:
        return f"loss_fn={name!r} is not served by tether (served: {', '.join(TINKER_LOSSES.names())}; docs/tinker.md)"
    facts: LossFacts = TINKER_LOSSES.facts(name)
    unknown = sorted(set(config) - set(facts.config))
    if unknown:
        return f"loss_fn={name!r}: unknown loss_fn_config keys {unknown} (accepted: {list(facts.config)})"
    for i, inputs in enumerate(data_inputs):
        missing = [k for k in ("target_tokens", *facts.inputs) if k not in inputs]
        if missing:
            return f"loss_fn={name!r}: datum {i} has no loss_fn_inputs {missing}"
        extra = sorted(set(inputs) - {"target_tokens", *facts.inputs, *facts.optional})
        if extra:
            return f"loss_fn={name!r}: datum {i} has loss_fn_inputs {extra} that this loss does not read"
    return None


def _sum_metric(loss_BT: torch.Tensor) -> dict[str, float]:
    return {"loss:sum": float(loss_BT.detach().sum())}


@TINKER_LOSSES.register("cross_entropy", LossFacts(optional=("weights",)))
def compute_cross_entropy(batch: LossBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """-(logp * weights) per token (supervised learning; the SDK's custom-loss path runs on it)."""
    w = batch.inputs.get("weights")
    w = batch.valid_BT.float() if w is None else w
    loss_BT = torch.where(batch.valid_BT, -batch.logp_BT * w, torch.zeros_like(batch.logp_BT))
    return loss_BT, _sum_metric(loss_BT)


def _policy_gradient(batch: LossBatch, registry_name: str, clip_low: float, clip_high: float) -> tuple[torch.Tensor, dict[str, float]]:
    adv = batch.inputs["advantages"]
    if not POLICY_LOSSES.facts(registry_name).zero_at_zero_advantage:  # the mask below relies on it
        raise AssertionError(f"{registry_name} is not zero at zero advantage")
    mask = (batch.valid_BT & (adv != 0)).float()
    cfg = PolicyLossConfig(name=registry_name, clip_low=clip_low, clip_high=clip_high)
    old = torch.where(batch.valid_BT, batch.inputs["logprobs"], torch.zeros_like(adv))
    loss_BT, metrics = POLICY_LOSSES[registry_name](PolicyLossInputs(batch.logp_BT, old, adv, mask), cfg)
    out = _sum_metric(loss_BT)
    out.update({f"{k}:max" if k.endswith("_max") else f"{k}:mean": float(v) for k, v in metrics.items()})
    return loss_BT, out


def _thresholds(config: Mapping[str, float | str]) -> tuple[float, float]:
    lo = float(config.get("clip_low_threshold", DEFAULT_CLIP[0]))
    hi = float(config.get("clip_high_threshold", DEFAULT_CLIP[1]))
    if not 0 <= lo <= 1 <= hi:
        raise ValueError(f"loss_fn_config: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got {lo} and {hi}")
    return lo, hi


_RL_INPUTS = LossFacts(inputs=("logprobs", "advantages"))
_RL_CLIPPED = LossFacts(inputs=("logprobs", "advantages"), config=("clip_low_threshold", "clip_high_threshold"))


@TINKER_LOSSES.register("importance_sampling", _RL_INPUTS)
def compute_importance_sampling(batch: LossBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """-(r * A): `ppo_clip` whose clip never binds (r > 0 = floor; r <= exp(log_ratio_clamp) < cap)."""
    return _policy_gradient(batch, "ppo_clip", 1.0, math.exp(PolicyLossConfig().log_ratio_clamp))


@TINKER_LOSSES.register("ppo", _RL_CLIPPED)
def compute_ppo(batch: LossBatch) -> tuple[torch.Tensor, dict[str, float]]:
    lo, hi = _thresholds(batch.config)
    return _policy_gradient(batch, "ppo_clip", 1.0 - lo, hi - 1.0)


@TINKER_LOSSES.register("cispo", _RL_CLIPPED)
def compute_cispo(batch: LossBatch) -> tuple[torch.Tensor, dict[str, float]]:
    lo, hi = _thresholds(batch.config)
    return _policy_gradient(batch, "cispo", 1.0 - lo, hi - 1.0)
