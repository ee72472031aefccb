"""In-flight weight updates for the transformers sampler (PipelineRL, arXiv:2509.19128): newer
weights reach a generation between two decode steps instead of waiting for it to finish.

    feed = WeightFeed()
    policy.weight_feed = feed             # tether.policy.base.HFPolicy
    feed.offer(version, state_dict)       # any thread, any time (the newest offer wins)
    run_generate(policy, ...)             # the decode loop takes it before the next step

What a switch does (`switch_weights`): loads the weights into the model in place, adopts the
version, and re-runs the prefill over every sequence so far with the new weights. PipelineRL keeps
the keys/values the old weights computed; tether recomputes them, so each token is sampled from
exactly one policy version given its whole prefix, and its recorded log-prob is that version's
log-prob — which is what the trainer's importance correction reads per token (rollout log-probs).
The cost is one prefill per switch. Each Sample records the version of every token
(`Sample.token_versions`, set when a switch happened inside it; `policy_version` stays the
version it started with, the oldest, for staleness accounting).

In `train-async`, `dist.inflight: true` puts a feed on every rollout worker (tether.dist.worker).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import torch


class WeightFeed:
    """A one-slot mailbox of (version, state dict) between a publisher and a decode loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[int, Mapping[str, torch.Tensor]] | None = None

    def offer(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        with self._lock:
            self._pending = (int(version), state)

    def take(self) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        with self._lock:
            pending, self._pending = self._pending, None
        return pending


def switch_weights(policy: Any, update: tuple[int, Mapping[str, torch.Tensor]], seq_ids: torch.Tensor,
                   seq_mask: torch.Tensor, capacity: int, lean_ok: bool) -> tuple[torch.Tensor, Any, Any]:
    """Load `update` into the policy and prefill `seq_ids` [B, L] (prompts + tokens so far) again;
    returns (logits of the next position, the new cache, the lean decoder or None)."""
    from tether.policy import decode
    from tether.policy.sampling import _make_decode_cache, next_token_logits

    version, state = update
    model = policy.model
    with torch.no_grad():  # a partial state (LoRA: the adapters) keeps the rest; a foreign name is an error
        _, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"in-flight weights do not fit the model: unexpected {list(unexpected)[:3]}")
    policy.version = version
    cache = _make_decode_cache(model, seq_ids.shape[1] if lean_ok else capacity)
    pos = (seq_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits, cache = next_token_logits(model, seq_ids, seq_mask, pos, cache, policy.autocast_bf16)
    return logits, cache, decode.make_lean_decoder(policy, seq_ids.shape[0], capacity, cache)


def expand_versions(switches: list[tuple[int, int]], n: int) -> tuple[int, ...]:
    """[(first token index, version), ...] in order -> the version of each of `n` tokens."""
    out = []
    for k, (start, version) in enumerate(switches):
        end = switches[k + 1][0] if k + 1 < len(switches) else n
        out.extend([version] * max(0, min(end, n) - start))
    return tuple(out)


__all__ = ["WeightFeed", "switch_weights", "expand_versions"]
