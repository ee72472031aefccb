"""The config sections of the run directory: `checkpoint:` and `logging:`."""

from __future__ import annotations

from pydantic import Field

from tether.section import Section


class CheckpointConfig(Section):
    every: int = Field(50, ge=0, description="0 disables periodic checkpoints")
    keep: int = Field(2, ge=1)


class LoggingConfig(Section):
    tensorboard: bool = True
    wandb: bool = False
    mlflow: bool = False
    project: str = "tether"
    samples_per_step: int = Field(8, ge=0, description="completions stored per step")
    progress: bool = True


__all__ = ["CheckpointConfig", "LoggingConfig"]
