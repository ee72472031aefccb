"""Re-rootable references: the files and directories a run's config names (data, models, reward
models, agent scripts, pairs files), stored so that the run works from any working directory and
after its directory (or the project around it) is moved.

A path in a config is relative to the working directory of the command that started the run. The
run record keeps each one twice (`compute_refs`): relative to the run directory (`rel`: right
when the project moved as a whole) and absolute (`abs`: right when only the run directory moved).
`resolve_refs` rewrites the stored config with the first of the two that exists, never reading
the current working directory; a reference that exists under neither is reported with both.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any, Iterator

from tether.errors import UserError

# Dotted config keys whose string values may be paths (`*` spans any part, list indices included).
PATH_KEYS = (
    "model.path", "data.path", "data.eval_path", "data.task_kwargs.*", "rm.pairs", "rm.eval_pairs",
    "dpo.pairs_path", "dpo.strong_model", "dpo.weak_model", "distill.teacher", "merge.models.*", "merge.base",
    "rs_sft.mix_path", "harness.command.*", "reward.components.*.kwargs.*", "pipeline.stages.*.overrides.*",
)
STAGE_WORDS = ("previous",)


class MissingReference(UserError):
    """A file the run's config names exists neither where it was nor relative to the moved run."""


def _leaves(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, data


def _is_path_key(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pat) for pat in PATH_KEYS)


def _split(value: str) -> tuple[str, str]:
    """'dir/file.py:attr' -> ('dir/file.py', ':attr'); anything else -> (value, '')."""
    head, sep, tail = value.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        return head, sep + tail
    return value, ""


def compute_refs(config: dict[str, Any], run_dir: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
                 names: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """{dotted key: {"value", "rel", "abs"}} for every path-valued setting that names an existing file
    or directory (relative paths are taken from `cwd`, the working directory the run starts in).
    `names`: words that are not paths here (a pipeline's stage names)."""
    base = Path(cwd or os.getcwd())
    run_abs = os.path.abspath(run_dir)
    refs: dict[str, dict[str, str]] = {}
    for key, value in _leaves(config):
        if not isinstance(value, str) or not value or not _is_path_key(key) or value in names + STAGE_WORDS:
            continue
        path, suffix = _split(value)
        full = Path(path) if os.path.isabs(path) else base / path
        if not full.exists():
            continue
        full_abs = os.path.normpath(os.path.abspath(full))
        refs[key] = {"value": value, "rel": os.path.relpath(full_abs, run_abs) + suffix, "abs": full_abs + suffix}
    return refs


def _set(data: dict[str, Any], key: str, value: Any) -> bool:
    node: Any = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            return False
    last = parts[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
        return True
    if isinstance(node, dict) and last in node:
        node[last] = value
        return True
    return False


def _get(data: Any, key: str) -> Any:
    node = data
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def resolve_refs(config: dict[str, Any], refs: dict[str, dict[str, str]], run_dir: str | os.PathLike[str],
                 skip: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """`config` (a stored config.yaml as data) with every reference rewritten to the location that
    exists now; returns (config, problems), one line per reference found nowhere. `skip`: keys the
    caller overrides anyway (their old values do not matter)."""
    problems = []
    for key, ref in refs.items():
        if _get(config, key) != ref.get("value") or any(key == s or key.startswith(s + ".") for s in skip):
            continue  # changed since (a resumed run's new value), or about to be overridden
        path_rel, suffix = _split(ref["rel"])
        path_abs, _ = _split(ref["abs"])
        moved = os.path.normpath(os.path.join(os.path.abspath(run_dir), path_rel))
        for candidate in (moved, path_abs):
            if os.path.exists(candidate):
                _set(config, key, candidate + suffix)
                break
        else:
            problems.append(f"{key}={ref['value']!r} is gone: neither {path_abs} nor {moved} exists; restore it, "
                            f"or pass {key}=NEW_PATH")
    return config, problems


__all__ = ["MissingReference", "PATH_KEYS", "compute_refs", "resolve_refs"]
