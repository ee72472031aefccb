"""The text side of the config: `a.b=c` overrides, pydantic errors as one readable line, and the
YAML a run directory keeps. Below every package (each owns its config section, `tether.section`);
`tether.config` re-exports these names.
"""

from __future__ import annotations

import copy
import difflib
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tether.errors import UserError


class ConfigError(UserError, ValueError):
    """A config problem, with a message that names the key and the fix."""


class _ConfigLoader(yaml.SafeLoader):
    """YAML as configs mean it: a date-like value (`run.name=2024-01-01`) stays text; no field is a date."""


_ConfigLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load_yaml(text: str) -> Any:
    """`yaml.safe_load` without dates (config files and override values)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value parsed as YAML: 3 -> int, true -> bool). A value that
    opens a YAML list or mapping ([ or {) and does not parse is refused, not taken as text."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key segment")
    try:
        value = load_yaml(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        if raw.lstrip().startswith(("[", "{")):
            problem = " ".join(str(getattr(err, "problem", None) or err).split())
            raise ConfigError(f"override {key}: the value {raw[:80]!r} is not valid YAML ({problem}); "
                              "quote the whole override, e.g. 'a.b=[1, 2]'") from None
        value = raw
    return [part.strip() for part in key.split(".")], value


def apply_overrides(data: dict[str, Any], overrides: list[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Set each `a.b.c=value` in `data`; a numeric segment addresses a list item (`reward.components.0.weight=2`),
    the list taken from `defaults` (the config's defaults as data) when `data` does not hold it yet."""
    for ov in overrides:
        path, value = parse_override(ov)
        node: Any = data
        default: Any = defaults
        for i, part in enumerate(path[:-1]):
            default = _child(default, part)
            child = _child(node, part)
            if isinstance(default, list) and child is None:
                child = copy.deepcopy(default)
            if not isinstance(child, (dict, list)):
                child = {}
            _set(node, part, child, path[: i + 1])
            node = child
        _set(node, path[-1], value, path)
    return data


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None


def _set(node: Any, part: str, value: Any, path: list[str]) -> None:
    """node[part] = value; into a list only at an existing index (a list item is replaced or edited, not added)."""
    if isinstance(node, dict):
        node[part] = value
        return
    where = ".".join(path[:-1])
    if not part.isdigit():
        raise ConfigError(f"override {'.'.join(path)}: {where} is a list; address an item by its index "
                          f"({where}.0.{part}=...) or set the whole list ({where}=[...])")
    if int(part) >= len(node):
        raise ConfigError(f"override {'.'.join(path)}: {where} has {len(node)} item(s), so index {part} is out of range; "
                          f"set the whole list instead ({where}=[...])")
    node[int(part)] = value


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at `loc` (for 'did you mean')."""
    model: Any = root
    for part in loc:
        if isinstance(part, int) and typing.get_origin(model) is list:  # an item of a list of sections
            model = typing.get_args(model)[0]
            continue
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

