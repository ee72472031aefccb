"""Reading a run directory for the report and compare commands (read-only, tolerant).

Everything a run writes is optional here: a run that crashed early, an SFT run (no rollouts),
a run without health monitoring or an older run without some keys still gets a report of what
exists. A pipeline directory (the demo's `<dir>/{sft,rl}`) resolves to its RL sub-run.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tether.io.run_dir import read_metrics

SAMPLE_FILE = re.compile(r"^(?P<kind>[A-Za-z0-9_.-]+?)_(?P<step>\d+)(?:-(?P<dup>\d+))?\.jsonl\.gz$")


@dataclass(frozen=True)
class SampleFile:
    kind: str
    step: int
    path: Path


@dataclass
class RunData:
    """What a run directory holds; absent files give empty values."""

    root: Path
    name: str
    config_text: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] | None = None  # None: no health.jsonl
    summary: dict[str, Any] = field(default_factory=dict)
    eval_json: dict[str, Any] | None = None
    sample_files: list[SampleFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def files(self, kind: str) -> list[SampleFile]:
        return sorted((f for f in self.sample_files if f.kind == kind), key=lambda f: (f.step, f.path.name))

    def series(self, key: str, x_key: str = "step") -> list[tuple[float, Any]]:
        return [(r[x_key], r.get(key)) for r in self.metrics if key in r and isinstance(r.get(x_key), (int, float))]

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.metrics:
            for k in r:
                seen.setdefault(k, None)
        return list(seen)


def resolve_run_dir(path: Path) -> Path:
    """The run directory itself, or the rl/ (else sft/) sub-run of a pipeline directory."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    if (path / "metrics.jsonl").is_file():
        return path
    for sub in ("rl", "sft"):
        if (path / sub / "metrics.jsonl").is_file() or (path / sub / "config.yaml").is_file():
            return path / sub
    if (path / "config.yaml").is_file():
        return path
    raise FileNotFoundError(f"{path}: no metrics.jsonl or config.yaml (nor in rl/ or sft/): not a tether run directory")


def read_jsonl_gz(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a gzipped JSONL file; a torn or corrupt file yields the rows read so far."""
    rows: list[dict[str, Any]] = []
    try:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if limit is not None and len(rows) >= limit:
                    break
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break
                if isinstance(row, dict):
                    rows.append(row)
    except (OSError, EOFError) as err:
        warnings.warn(f"{path}: {err}", stacklevel=2)
    return rows


def _read_jsonl(path: Path, what: str, notes: list[str]) -> list[dict[str, Any]]:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = read_metrics(path)
        notes.extend(str(w.message) for w in caught)
        return rows
    except (OSError, ValueError) as err:
        notes.append(f"{what}: {err}")
        return []


def load_run(path: Path) -> RunData:
    root = resolve_run_dir(Path(path))
    name = root.name if root.name not in ("rl", "sft") else f"{root.parent.name}/{root.name}"
    data = RunData(root=root, name=name)
    cfg_path = root / "config.yaml"
    if cfg_path.is_file():
        data.config_text = cfg_path.read_text(errors="replace")
        try:
            loaded = yaml.safe_load(data.config_text)
            data.config = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError as err:
            data.warnings.append(f"config.yaml: {err}")
    if (root / "metrics.jsonl").is_file():
        data.metrics = _read_jsonl(root / "metrics.jsonl", "metrics.jsonl", data.warnings)
    if (root / "health.jsonl").is_file():
        data.health = _read_jsonl(root / "health.jsonl", "health.jsonl", data.warnings)
    for fname, attr in (("summary.json", "summary"), ("eval.json", "eval_json")):
        p = root / fname
        if p.is_file():
            try:
                setattr(data, attr, json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError) as err:
                data.warnings.append(f"{fname}: {err}")
    sdir = root / "samples"
    if sdir.is_dir():
        for p in sdir.iterdir():
            m = SAMPLE_FILE.match(p.name)
            if m:
                data.sample_files.append(SampleFile(m["kind"], int(m["step"]), p))
    return data


def compute_rollouts_per_step(data: RunData) -> list[tuple[int, float]]:
    """(step, rollouts generated that step) from the config (n x B_p x dynamic-sampling rounds)."""
    ro = data.config.get("rollout", {}) if isinstance(data.config.get("rollout"), dict) else {}
    n, bp = ro.get("n"), ro.get("problems_per_step")
    out = []
    for r in data.metrics:
        step = r.get("step")
        if not isinstance(step, int) or step <= 0 or "reward/mean" not in r:
            continue
        rounds = r.get("dynamic_sampling/rounds") or 1.0
        if isinstance(n, int) and isinstance(bp, int):
            out.append((step, float(n * bp * rounds)))
        elif isinstance(r.get("batch/sequences"), (int, float)):
            out.append((step, float(r["batch/sequences"])))
    return out


def compute_cumulative_compute(data: RunData, unit: str = "rollouts") -> dict[int, float]:
    """step -> compute spent after that step (step 0: 0) in rollouts, sampled tokens, steps or seconds."""
    per_step: dict[int, float] = {}
    if unit == "rollouts":
        per_step = dict(compute_rollouts_per_step(data))
    else:
        key = {"tokens": "rollout/gen_tokens", "seconds": "time/step", "steps": None}[unit]
        for r in data.metrics:
            step = r.get("step")
            if isinstance(step, int) and step > 0 and "reward/mean" in r:
                v = 1.0 if key is None else r.get(key)
                if isinstance(v, (int, float)):
                    per_step[step] = float(v)
    out, total = {0: 0.0}, 0.0
    for step in sorted(per_step):
        total += per_step[step]
        out[step] = total
    return out
