"""Cross-policy pool: the rule's weights by hand, the ring of kept versions, the draw frequencies."""

from collections import Counter
from types import SimpleNamespace

import pytest

from tether.config import load_config
from tether.dist.pool import PolicyPool, compute_pool_weights


def test_rule_weights():
    assert compute_pool_weights([0, 1, 2], "uniform", 0.5) == [1.0, 1.0, 1.0]
    assert compute_pool_weights([0, 1, 2], "geometric", 0.5) == [1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="valid: uniform, geometric"):
        compute_pool_weights([0], "newest", 0.5)


def test_ring_keeps_recent_multiples_and_draws_by_rule():
    cfg = load_config(None, ["dist.cross_policy.pool_size=2", "dist.cross_policy.every=2", "dist.correction=tis"])
    policy = SimpleNamespace(version=7)
    pool = PolicyPool(cfg.dist.cross_policy, policy, seed=0)
    for v in range(7):
        pool.remember(v, {"v": v})
    assert list(pool.snapshots) == [4, 6]  # multiples of 2, the newest two
    draws = Counter(pool.draw_version() for _ in range(4000))
    assert set(draws) == {7, 6, 4}
    # geometric, decay 0.5, ages 0, 1, 3: weights 1, 0.5, 0.125
    assert draws[7] / 4000 == pytest.approx(1 / 1.625, abs=0.03)
    assert draws[4] / 4000 == pytest.approx(0.125 / 1.625, abs=0.02)


def test_empty_pool_always_acts_with_current():
    cfg = load_config(None)
    pool = PolicyPool(cfg.dist.cross_policy, SimpleNamespace(version=3), seed=0)
    pool.remember(2, {})
    assert pool.draw_version() == 3 and not pool.snapshots
