"""The text side of the config: `a.b=c` overrides, pydantic errors as one readable line, and the
YAML a run directory keeps. Below every package (each owns its config section, `tether.section`);
`tether.config` re-exports these names.
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tether.errors import UserError


class ConfigError(UserError, ValueError):
    """A config problem, with a message that names the key and the fix."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value parsed as YAML: 3 -> int, true -> bool)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key segment")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for ov in overrides:
        path, value = parse_override(ov)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return data


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at `loc` (for 'did you mean')."""
    model: Any = root
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return model
        model = field.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """One line naming every invalid key of `root` (the config model) and, for unknown keys, the nearest valid one."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        dotted = ".".join(str(p) for p in loc) or "<root>"
        if e["type"] == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" — did you mean {'.'.join(map(str, loc[:-1] + (close[0],)))!r}?" if close else ""
            lines.append(f"unknown key {dotted!r}{hint} (valid here: {', '.join(valid)})")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = "" if e["type"] == "value_error" else f" (got {e.get('input')!r})"
            lines.append(f"{dotted}: {msg}{got}" if loc else msg)
    return f"invalid config {source}: " + "; ".join(lines)


def dump_config(cfg: BaseModel) -> str:
    """A config as the YAML written into a run directory (config.yaml)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

