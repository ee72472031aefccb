"""Training health: telemetry, detectors, diagnosis, remediation and fault injection.

    st.faults = build_faults(cfg.health.inject, st)        # seams; NO_FAULTS when none injected
    st.health = build_health(cfg, run_dir, st)             # the monitor: observe() after each step

Modules: `telemetry` (signals + history), `detectors` (one documented rule each), `diagnosis`
(ranked root causes), `remediation` (rollback + safe changes), `monitor` (the online loop and the
watchdog), `doctor` (offline analysis of a run directory), `faults/` (injector plugins). The benchmark
that scores them, `tether faultbench`, is a recipe: `tether.recipes.faultbench`. Docs: docs/health/.

This package is imported by `tether.config` (for `HealthConfig`), so names are loaded lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "build_health": "tether.health.monitor",
    "HealthMonitor": "tether.health.monitor",
    "compute_advantage_alignment": "tether.health.telemetry",
    "compute_mask_coverage": "tether.health.invariants",
    "compute_token_agreement": "tether.health.invariants",
    "compute_trajectory_stats": "tether.health.telemetry",
    "compute_weights_fingerprint": "tether.health.telemetry",
    "build_faults": "tether.health.faults",
    "NO_FAULTS": "tether.health.faults",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tether.health' has no attribute {name!r}")


__all__ = list(_LAZY)
