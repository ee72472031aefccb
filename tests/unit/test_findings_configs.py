"""configs/findings/*.yaml: every sweep block is valid and every arm of it (and every prepare step) is a
valid config, so a typo in a reproduction's override fails here, not minutes into its sweep; and no
reproduction starts from a model that another command must build first (one command each)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tether.config import load_config
from tether.sweep import COMMANDS, SweepError, SweepSpec, load_sweep_config
from tether.sweep_prepare import resolve_prepare, substitute

FINDINGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "findings").glob("*.yaml"))


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_every_arm_of_a_findings_config_validates(path, tmp_path):
    base, block = load_sweep_config(path)
    if not block:  # a plain config (e.g. a shared SFT start): it validates as is
        load_config(str(path), [])
        return
    spec = SweepSpec(grid={k: [str(x) for x in v] for k, v in (block.get("grid") or {}).items()},
                     seeds=list(block.get("seeds", [0, 1, 2])), command=block.get("command", "train"),
                     arm_list=[list(a) for a in block.get("arms", [])],
                     overrides=[str(o) for o in block.get("overrides") or []],
                     prepare=resolve_prepare(block.get("prepare"), path.parent, COMMANDS, SweepError))
    spec.validate()
    if spec.command != "sft":  # an SFT sweep builds starting points (one seed); a reproduction runs >= 3
        assert len(spec.seeds) >= 3, f"{path.name}: a reproduction runs at least 3 seeds"
    base_path = tmp_path / "base.yaml"
    base_path.write_text(yaml.safe_dump(base))
    for name, step in spec.prepare.items():  # a prepare step (e.g. the shared SFT) validates too
        step_path = tmp_path / f"prepare-{name}.yaml"
        step_path.write_text(yaml.safe_dump(step["config"]))
        load_config(str(step_path), step["overrides"])
    for arm in spec.arms():
        overrides = substitute(spec.overrides + list(arm.overrides), spec.prepare, tmp_path / "out", 0)
        cfg = load_config(str(base_path), overrides)
        # one command: a reproduction never starts from a model that another command must build first
        assert not (cfg.model.path or "").startswith("runs/"), (
            f"{path.name}: model.path {cfg.model.path} must come from a sweep.prepare step ({{prepare.NAME}})")
