"""The health monitor's state is checkpointed (issue 14): a monitor restored from `state_dict`
continues exactly like one that never stopped; a fresh one lets an ongoing critical alarm go quiet."""

from __future__ import annotations

import io

import torch

from tether.health.config import HealthConfig
from tether.health.detectors import RunContext
from tether.health.monitor import HealthMonitor, build_health

from .health_helpers import series


class _Cfg:  # the parts of TetherConfig the monitor reads
    def __init__(self) -> None:
        self.health = HealthConfig()


CTX = RunContext("exact_match", {"exact_match": 1.0}, 0)


def _spike(row, step):
    row["grad_norm"] = 40.0


def _run(mon, rows, first_step):
    out = []
    for i, row in enumerate(rows, first_step):
        out.append([(f.detector, f.severity, f.since) for f in mon.run_detectors(i, dict(row), CTX)])
    return out


def test_restored_monitor_continues_exactly_and_a_fresh_one_does_not():
    rows = series(24, seed=3, change={"g": _spike}, start=16)
    k = 17  # mid-alarm: the spike started at step 16
    whole = HealthMonitor(_Cfg(), watchdog=False)
    expected = _run(whole, rows, 1)
    first = HealthMonitor(_Cfg(), watchdog=False)
    _run(first, rows[:k], 1)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)  # as in a checkpoint's trainer_state.pt
    buf.seek(0)
    resumed = build_health(_Cfg(), state=torch.load(buf, weights_only=True))
    assert _run(resumed, rows[k:], k + 1) == expected[k:]
    assert resumed.history.excluded == whole.history.excluded
    assert [f.to_json() for f in resumed.findings] == [f.to_json() for f in whole.findings]
    assert any(sev == "critical" for step in expected[k:] for _, sev, _ in step)
    fresh = HealthMonitor(_Cfg(), watchdog=False)  # what a resume did before: detectors start over
    for i, row in enumerate(rows[:k], 1):
        fresh.history.add(i, dict(row))
    assert _run(fresh, rows[k:], k + 1) != expected[k:]


def test_detector_parameters_follow_the_resumed_config():
    mon = HealthMonitor(_Cfg(), watchdog=False)
    _run(mon, series(6, seed=1), 1)
    cfg = _Cfg()
    cfg.health = HealthConfig(thresholds={"grad_spike.factor": 9.0})
    resumed = HealthMonitor(cfg, watchdog=False)
    resumed.load_state_dict(mon.state_dict())
    assert resumed.detectors["grad_spike"].p["factor"] == 9.0
    assert len(resumed.history.rows) == 6


def test_the_weight_versions_go_into_the_checkpoint_with_the_monitor():
    """The per-tensor sums of the trainer's weights by version (the sync check's reference) survive a
    checkpoint: a resumed run tells a stale sync from a wrong one as the uninterrupted run does."""
    from types import SimpleNamespace

    from tether.health.telemetry import compute_sums_match

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    st = SimpleNamespace(policy=SimpleNamespace(model=model, version=0), step=0)
    mon = build_health(_Cfg(), st=st)  # a fresh run records its starting weights
    old = mon.weight_sums[0].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    st.policy.version = 1
    mon._record_weights(st)
    buf = io.BytesIO()
    torch.save(mon.state_dict(), buf)
    buf.seek(0)
    resumed = build_health(_Cfg(), state=torch.load(buf, weights_only=True))
    assert sorted(resumed.weight_sums) == [0, 1] and torch.equal(resumed.weight_sums[0], old)
    # a sampler still at version 0 is stale (every tensor some version's), one with two tensors swapped is not
    assert compute_sums_match(old, resumed.weight_sums) == {"health/weights_foreign_frac": 0.0}
    swapped = old.clone()
    swapped[[0, 2]] = old[[2, 0]]
    assert compute_sums_match(swapped, resumed.weight_sums)["health/weights_foreign_frac"] == 0.5
