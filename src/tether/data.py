"""A resumable, seeded stream of problems (epochs of permutations).

The state is (epoch, position); resuming reproduces the exact order, including across an epoch
boundary (pitfall 14: verl PR#5725 exited after 0 steps when resuming at an epoch boundary).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ProblemStream:
    def __init__(self, problems: list[dict[str, Any]], seed: int) -> None:
        if not problems:
            raise ValueError("no problems to train on")
        self.problems = problems
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next_batch(self, k: int) -> list[dict[str, Any]]:
        out = []
        while len(out) < k:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self.problems[int(self._order[self.position])])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.problems)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size") != len(self.problems):
            raise ValueError(f"checkpoint was taken with {state.get('size')} problems, the data now has {len(self.problems)}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
