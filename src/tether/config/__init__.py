"""Typed configuration: YAML + `a.b=c` overrides, validated by pydantic (`extra="forbid"`).

Every section is a frozen pydantic model owned by the package that reads it (`tether.section`);
this package assembles them. Unknown keys are rejected with the nearest valid key
suggested; combinations that would silently do nothing are rejected with the fix named
(docs/design.md, correctness rule 21). The resolved config is written into the run directory.

    cfg = load_config("configs/demo.yaml", ["algo.kl.coef=0.01", "train.steps=50"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from tether.algos.config import (
    AdvantageConfig, AggConfig, AlgoConfig, DynamicSamplingConfig, ISCorrectionConfig, KLConfig, PolicyLossConfig,
    ShapingConfig, ValueConfig,
)
from tether.config.checks import find_noop_combinations
from tether.config.fit import do_fit_auto
from tether.config.stages import (
    DistillConfig, DPOConfig, MergeConfig, PipelineConfig, RMConfig, RSSFTConfig, SFTConfig, StageConfig,
)
from tether.config_text import (ConfigError, apply_overrides, dump_config, format_validation_error, load_yaml,
                                parse_override)
from tether.dist.config import DistConfig
from tether.envs.config import ContextConfig, EnvConfig, SandboxConfig
from tether.eval.config import EvalConfig
from tether.health.config import FaultSpecConfig, HealthConfig
from tether.io.config import CheckpointConfig, LoggingConfig
from tether.policy.config import LoraConfig, ModelConfig, SamplingConfig, TinyModelConfig
from tether.rewards.config import RewardComponentConfig, RewardConfig
from tether.rollout.config import HarnessConfig, RolloutConfig
from tether.section import Section
from tether.tasks.config import DataConfig
from tether.train.config import RunConfig, TrainConfig


class TetherConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rm: RMConfig = Field(default_factory=RMConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    dist: DistConfig = Field(default_factory=DistConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    rs_sft: RSSFTConfig = Field(default_factory=RSSFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)

    @model_validator(mode="after")
    def _no_silent_noops(self) -> "TetherConfig":
        for problem in find_noop_combinations(self):
            raise ValueError(problem)
        return self


# ----------------------------------------------------------------------------- loading


def build_config(data: dict[str, Any], source: str = "<dict>") -> TetherConfig:
    try:
        return TetherConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, TetherConfig)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TetherConfig:
    """Read YAML (or start from defaults when `path` is None), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"{p} is a directory; expected a YAML config file (e.g. configs/demo.yaml)")
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            line = p.read_bytes()[: err.start].count(b"\n") + 1
            raise ConfigError(f"{p}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x}): save the file as UTF-8") from None
        try:
            loaded = load_yaml(text)  # no dates: `name: 2024-01-01` is text
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {' '.join(str(err).split())}") from None
        if loaded is None:
            raise ConfigError(f"{p}: the config file is empty; write at least one section (e.g. 'train: {{steps: 100}}'; "
                              "configs/demo.yaml is a complete example)")
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
        source = str(p)
        data.setdefault("run", {}).setdefault("name", p.stem)
    data = apply_overrides(data, overrides or [], TetherConfig().model_dump(mode="json"))  # list items: a.0.b=c
    return build_config(do_fit_auto(data, source), source)  # `auto` values follow the model and the data (config.fit)


def load_doctor_config(run_dir: str | Path) -> TetherConfig:
    """A run directory's config as the doctor reads it (`tether doctor`, tether.health.doctor): its
    config.yaml (defaults without one), with no fault injection (the doctor is not told what was injected)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return TetherConfig()
    data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("health", {})["inject"] = []
    return build_config(data, str(path))


__all__ = [
    "AdvantageConfig", "AggConfig", "AlgoConfig", "CheckpointConfig", "ConfigError", "ContextConfig", "DataConfig",
    "DistConfig", "DistillConfig", "DPOConfig", "DynamicSamplingConfig", "EnvConfig", "EvalConfig", "FaultSpecConfig",
    "HarnessConfig", "HealthConfig", "ISCorrectionConfig", "KLConfig", "LoggingConfig", "LoraConfig", "MergeConfig",
    "ModelConfig", "PipelineConfig", "PolicyLossConfig", "RMConfig", "RSSFTConfig", "RewardComponentConfig",
    "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig", "SamplingConfig", "SandboxConfig", "ShapingConfig",
    "StageConfig", "TetherConfig", "TinyModelConfig", "TrainConfig", "ValueConfig", "apply_overrides", "build_config",
    "dump_config", "find_noop_combinations", "load_config", "load_doctor_config", "parse_override",
]
