"""Cross-policy sampling (AgentRL, "Training Language Model Agents with RL", 2025): a pool of
recent policy versions, to widen state-space coverage without raising n.

Each rollout worker keeps the weights of up to `pool_size` past versions (every `every`-th
one it received). Per rollout step, the acting policy is drawn from {current} + pool by a
configured rule; the rollout log-probs — the mu of the off-policy correction — are those of the
policy that acted, and every sample is tagged with that policy's version.
"""

from __future__ import annotations

import copy
import random
from collections import OrderedDict
from typing import Any, Mapping

from tether.dist.config import CrossPolicyConfig
from tether.policy.weights import from_numpy_state


def compute_pool_weights(ages: list[int], rule: str, decay: float) -> list[float]:
    """Unnormalised draw weights of pool members by age (0 = current weights)."""
    if rule == "uniform":
        return [1.0] * len(ages)
    if rule == "geometric":
        return [decay ** a for a in ages]
    raise ValueError(f"unknown dist.cross_policy.rule {rule!r}; valid: uniform, geometric")


class PolicyPool:
    """The worker's current policy plus snapshots of past versions (numpy state dicts)."""

    def __init__(self, cfg: CrossPolicyConfig, policy: Any, seed: int) -> None:
        self.cfg, self.policy = cfg, policy
        self.snapshots: OrderedDict[int, Mapping[str, Any]] = OrderedDict()
        self.rng = random.Random(seed)
        self._scratch = None  # a second model that past versions are loaded into

    def remember(self, version: int, arrays: Mapping[str, Any]) -> None:
        """Keep the weights of `version` (called with the arrays a sync just replaced)."""
        if self.cfg.pool_size <= 0 or version % self.cfg.every:
            return
        self.snapshots[version] = arrays
        while len(self.snapshots) > self.cfg.pool_size:
            self.snapshots.popitem(last=False)

    def draw_version(self) -> int:
        """The acting version for this rollout step: current or a pooled one, by the rule."""
        current = int(self.policy.version)
        members = [current] + [v for v in reversed(self.snapshots) if v < current]
        if len(members) == 1:
            return current
        weights = compute_pool_weights([current - v for v in members], self.cfg.rule, self.cfg.decay)
        return self.rng.choices(members, weights=weights, k=1)[0]

    def acting_policy(self, version: int) -> Any:
        """The policy object of `version` (the live one, or the scratch model loaded with a snapshot)."""
        if version == self.policy.version:
            return self.policy
        if self._scratch is None:
            self._scratch = copy.copy(self.policy)
            self._scratch.model = copy.deepcopy(self.policy.model)
            self._scratch.version = None
        if self._scratch.version != version:
            self._scratch.model.load_state_dict(from_numpy_state(self.snapshots[version], self.policy.device))
            self._scratch.version = version
        return self._scratch


__all__ = ["PolicyPool", "compute_pool_weights"]
