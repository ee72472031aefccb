"""The run directory: the on-disk contract between a run, its report and external tools.

Layout (docs/resume.md)::

    runs/<name>/
      config.yaml                  resolved config (after overrides), written once at start
      metrics.jsonl                one JSON object per step, "step" first; the contract
      samples/step_000001.jsonl.gz completions of one step (eval: eval_000001.jsonl.gz)
      checkpoints/                 step_000010/ ... + `latest` pointer (see checkpoint.py)
      health.jsonl                 one JSON object per health event
      settings.jsonl               one JSON object per run-settings change (tether.settings: repairs, caps, faults)
      summary.json                 final/rolling summary, replaced atomically
      plots/                       PNGs (plots.py)
      tb/                          TensorBoard event files (sinks.py)

Why the care with I/O (docs/design.md, correctness rules 14 and 20):

* `metrics.jsonl` is appended, flushed and fsynced per step, so a crash loses at most the row
  being written; the reader skips such a truncated last line with a warning.
* Non-finite floats become `null` and their keys are listed under `"nonfinite"`: the file stays
  valid JSON (Python's `NaN` token is not JSON and breaks `jq`, pandas' strict mode, browsers).
* On resume, rows after the checkpoint's step are dropped, so curves never show a step twice.
* Sample files are per step and never overwritten (a table logged under one fixed key keeps only
  the last step: trl PR#6568, #2045).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from tether.config_text import dump_config
from tether.io.killpoints import do_kill_point

METRICS_FILE = "metrics.jsonl"
NONFINITE_KEY = "nonfinite"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory plus the writers for its files. Create with `make_run_dir`."""

    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def samples_dir(self) -> Path:
        return self.root / "samples"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def health_path(self) -> Path:
        return self.root / "health.jsonl"

    @property
    def settings_path(self) -> Path:
        return self.root / "settings.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.json"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    @property
    def tb_dir(self) -> Path:
        return self.root / "tb"

    # ------------------------------------------------------------------ writers

    def write_config(self, cfg: Any) -> Path:
        """Write the resolved config as YAML (a `TetherConfig`, a pydantic model or a dict)."""
        # dump_config works for any pydantic model (it calls model_dump(mode="json")).
        text = dump_config(cfg) if hasattr(cfg, "model_dump") else yaml.safe_dump(dict(cfg), sort_keys=False)
        write_text_atomic(self.config_path, text)
        return self.config_path

    def append_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one row `{"step": step, **metrics}` to metrics.jsonl; flush + fsync.

        NaN/inf values are written as `null` and their (dotted) keys listed under "nonfinite".
        """
        do_append_jsonl(self.metrics_path, make_metrics_row(step, metrics))

    def append_health(self, record: Mapping[str, Any]) -> None:
        """Append one health event (detector finding, repair action) to health.jsonl."""
        row, _ = sanitize_json(dict(record))
        do_append_jsonl(self.health_path, row)

    def append_settings(self, event: Mapping[str, Any]) -> None:
        """Append one run-settings change (`step`, `path`, `old`, `new`, `source`) to settings.jsonl."""
        row, _ = sanitize_json(dict(event))
        do_append_jsonl(self.settings_path, row)

    def read_metrics(self) -> list[dict[str, Any]]:
        """All rows of this run's metrics.jsonl ([] before the first step)."""
        return read_metrics(self.metrics_path) if self.metrics_path.exists() else []

    def truncate_metrics_after(self, step: int) -> int:
        """Resume: drop rows with `step > step` (and a torn last line); returns rows dropped."""
        return do_truncate_jsonl_after(self.metrics_path, step)

    def write_samples(self, step: int, rows: list[Mapping[str, Any]], kind: str = "step") -> Path:
        """Write one step's completions to `samples/<kind>_<step:06d>.jsonl.gz`.

        Never overwrites: when the file exists (a resumed run re-doing a step, or a second
        eval at the same step) the new file gets a `-1`, `-2`, ... suffix. Use `kind="eval"`
        for evaluation samples (docs/design.md, correctness rule 20: eval samples are kept, not thrown away).
        """
        if not kind or "/" in kind or kind.startswith("."):
            raise ValueError(f"write_samples: kind must be a plain file-name prefix, got {kind!r}")
        self.samples_dir.mkdir(parents=True, exist_ok=True)
        base = f"{kind}_{step:06d}"
        path = self.samples_dir / f"{base}.jsonl.gz"
        suffix = 0
        while path.exists():
            suffix += 1
            path = self.samples_dir / f"{base}-{suffix}.jsonl.gz"
        lines = [json.dumps(sanitize_json(dict(r))[0], allow_nan=False, default=_json_default) for r in rows]
        payload = gzip.compress(("\n".join(lines) + ("\n" if lines else "")).encode(), mtime=0)
        write_bytes_atomic(path, payload)
        return path

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Write summary.json atomically (tmp file + fsync + os.replace): never half-written."""
        write_summary_json(self.summary_path, summary)
        return self.summary_path


def write_summary_json(path: Path, summary: Mapping[str, Any]) -> None:
    """A summary as JSON at `path`, sanitised (non-finite values named) and written atomically."""
    row, _ = sanitize_json(dict(summary))
    write_text_atomic(path, json.dumps(row, indent=2, allow_nan=False, default=_json_default) + "\n")


def make_run_dir(path: str | os.PathLike[str]) -> RunDir:
    """Create (or reopen, for resume) the run directory at `path` with its sub-folders."""
    run = RunDir(Path(path))
    for d in (run.root, run.samples_dir, run.checkpoints_dir, run.plots_dir, run.tb_dir):
        d.mkdir(parents=True, exist_ok=True)
    return run


# ----------------------------------------------------------------------------- JSON helpers


def _json_default(obj: Any) -> Any:
    """Encode what `json` cannot: tensors/numpy scalars and arrays, paths, sets."""
    if hasattr(obj, "tolist"):  # torch.Tensor, np.ndarray, np.generic
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return repr(obj)


def _to_plain(value: Any) -> Any:
    """0-d tensors / numpy scalars -> Python numbers, so non-finite checks see them."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def sanitize_json(value: Any, prefix: str = "") -> tuple[Any, list[str]]:
    """Replace NaN/inf floats by None (recursively); return the value and the dotted keys hit."""
    value = _to_plain(value)
    if isinstance(value, float):
        return (value, []) if math.isfinite(value) else (None, [prefix or "<value>"])
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        bad: list[str] = []
        for k, v in value.items():
            out[str(k)], b = sanitize_json(v, f"{prefix}.{k}" if prefix else str(k))
            bad += b
        return out, bad
    if isinstance(value, (list, tuple)):
        items = [sanitize_json(v, f"{prefix}[{i}]") for i, v in enumerate(value)]
        return [v for v, _ in items], [k for _, b in items for k in b]
    return value, []


def make_metrics_row(step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """`{"step": step, **metrics, "nonfinite": [...]}` with non-finite floats nulled."""
    if isinstance(step, bool) or not isinstance(_to_plain(step), int):
        raise TypeError(f"append_metrics: step must be an int, got {step!r}")
    if NONFINITE_KEY in metrics:
        raise ValueError(f"append_metrics: {NONFINITE_KEY!r} is reserved for the writer")
    if "step" in metrics and _to_plain(metrics["step"]) != step:
        raise ValueError(f"append_metrics: metrics['step']={metrics['step']!r} != step={step}")
    body = {k: v for k, v in metrics.items() if k != "step"}
    clean, bad = sanitize_json(body)
    row: dict[str, Any] = {"step": int(_to_plain(step)), **clean}
    if bad:
        row[NONFINITE_KEY] = bad
    return row


# ----------------------------------------------------------------------------- JSONL files


def _drop_torn_tail(fh: Any, path: Path) -> None:
    """If the file does not end in a newline, a crash tore its last line: cut that line off.

    Appending after it would glue two rows into one malformed line in the middle of the file.
    `fh` is open in "a+b" mode.
    """
    size = fh.seek(0, os.SEEK_END)
    if size == 0:
        return
    fh.seek(size - 1)
    if fh.read(1) == b"\n":
        return
    fh.seek(0)
    data = fh.read()
    keep = data.rfind(b"\n") + 1
    warnings.warn(f"{path}: dropping a torn last line ({size - keep} bytes) left by a crash", stacklevel=4)
    fh.truncate(keep)
    fh.seek(0, os.SEEK_END)


def do_append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync) before returning."""
    line = json.dumps(row, allow_nan=False, default=_json_default) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        _drop_torn_tail(fh, path)
        if path.name == METRICS_FILE:
            do_kill_point("metrics/torn", lambda: (fh.write(line.encode()[: len(line) // 2]), fh.flush(), os.fsync(fh.fileno())))
        fh.write(line.encode())
        fh.flush()
        os.fsync(fh.fileno())


def _parse_jsonl_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(raw line, parsed row) for each line; skips a torn last line with a warning.

    A malformed line anywhere else is corruption, not a crash artefact: raise, naming file:line.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    # A complete file ends in "\n", so the final split element is "" ; anything else is torn.
    out: list[tuple[str, dict[str, Any]]] = []
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            if i == last:
                warnings.warn(f"{path}:{i + 1}: skipping truncated last line (crash mid-write?)", stacklevel=3)
                continue
            raise ValueError(f"{path}:{i + 1}: malformed JSON line: {err.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        out.append((raw, row))
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a metrics.jsonl (or any JSONL of objects), tolerating a torn last line.

    Non-finite values come back as None; their keys are in the row's "nonfinite" list.
    """
    return [row for _, row in _parse_jsonl_lines(Path(path))]


def do_truncate_jsonl_after(path: Path, step: int) -> int:
    """Rewrite `path` keeping only rows with `row["step"] <= step`; atomic. Returns rows dropped."""
    if not path.exists():
        return 0
    parsed = _parse_jsonl_lines(path)
    kept = [raw for raw, row in parsed if not isinstance(row.get("step"), int) or row["step"] <= step]
    text = "".join(raw + "\n" for raw in kept)
    write_text_atomic(path, text)
    return len(parsed) - len(kept)


# ----------------------------------------------------------------------------- atomic writes


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a sibling tmp file, fsync, then os.replace: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    do_fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def do_fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power loss (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
