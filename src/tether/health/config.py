"""The `health:` section of the config (kept here, next to the code that reads it).

    health:
      mode: advise            # off | advise (detect, diagnose, report) | auto (also repair)
      baseline_window: 8      # steps whose statistics every relative threshold refers to
      thresholds: {grad_spike.factor: 6.0}   # per-detector overrides, "detector.param": value
      inject: [{name: lr_spike, severity: obvious, start: 15}]   # fault injection (faultbench)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tether.section import Section



class FaultSpecConfig(Section):
    """One injected fault (see `tether faultbench --list`)."""

    name: str = Field(..., description="a registered fault, or 'package.module:ClassName'")
    severity: Literal["subtle", "obvious"] = "obvious"
    start: int = Field(10, ge=1, description="first RL step the fault is active")
    params: dict[str, Any] = Field(default_factory=dict, description="overrides of the severity's parameters")


class HealthConfig(Section):
    mode: Literal["off", "advise", "auto"] = Field(
        "advise", description="off | advise: detect + diagnose + report | auto: also roll back and repair")
    baseline_skip: int = Field(4, ge=0, description="first steps kept out of the baseline (the post-SFT transient)")
    baseline_window: int = Field(8, ge=3, description="steps whose statistics the relative thresholds refer to")
    rebase_every: int = Field(50, ge=0, description="re-anchor the baseline to recent healthy steps every N (0: never)")
    disable: list[str] = Field(default_factory=list, description="detector names to switch off")
    thresholds: dict[str, float] = Field(default_factory=dict, description="'detector.param': value overrides")
    max_staleness: int = Field(0, ge=0, description="policy versions a rollout may lag the trainer (0: synchronous)")
    snapshot_every: int = Field(4, ge=1, description="auto: in-memory rollback point every N healthy steps")
    trial_window: int = Field(6, ge=2, description="auto: steps a repair is watched before it is kept or reverted")
    max_actions: int = Field(3, ge=1, description="auto: repairs tried before halting with a report")
    watchdog_timeout_s: float | None = Field(
        1800.0, gt=0, description="a phase (rollout, reward, update, eval, checkpoint) silent this long: dump stacks, exit 3")
    inject: list[FaultSpecConfig] = Field(default_factory=list, description="faults to inject (tether faultbench)")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML reads a bare `off` as false (`health.mode=off` on the CLI)
