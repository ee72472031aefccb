"""Live objects as plain data, for checkpoints: `torch.load(..., weights_only=True)` reads it back.

`encode_state(obj)` turns nested containers, dataclasses and tether objects into dicts, lists,
numbers, strings and tensors, with a `"__t__"` tag where the type matters (tuple, set, deque,
a dict with non-string keys, a dataclass or object); `decode_state` rebuilds them. Used for the
health monitor's state (detector streaks, history, findings, snapshots), so that a resumed run
continues it exactly without each class writing its own serialiser.

Only classes from the `tether` package are rebuilt (a checkpoint cannot name arbitrary code).
Callables (an undo closure, a hook) are behaviour, not state: they are dropped on encode, and a
dataclass rebuilt without one gets its field default.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import deque
from typing import Any

import torch

TAG = "__t__"


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _fields(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    else:
        items = vars(obj).items()
    return {k: encode_state(v) for k, v in items if not callable(v) or isinstance(v, type)}


def encode_state(obj: Any) -> Any:
    """`obj` as tagged plain data (see the module docstring); raises TypeError for what it cannot hold."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, list):
        return [encode_state(v) for v in obj]
    if isinstance(obj, tuple):
        return {TAG: "tuple", "v": [encode_state(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {TAG: type(obj).__name__, "v": [encode_state(v) for v in sorted(obj, key=repr)]}
    if isinstance(obj, deque):
        return {TAG: "deque", "v": [encode_state(v) for v in obj], "maxlen": obj.maxlen}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and TAG not in obj:
            return {k: encode_state(v) for k, v in obj.items()}
        return {TAG: "dict", "v": [[encode_state(k), encode_state(v)] for k, v in obj.items()]}
    if type(obj).__module__.split(".")[0] == "tether" and (dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__")):
        return {TAG: "obj", "cls": _class_name(obj), "v": _fields(obj)}
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy scalar
        return obj.item()
    raise TypeError(f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a checkpoint")


def _import_class(name: str) -> type:
    module, _, qualname = name.partition(":")
    if module.split(".")[0] != "tether":
        raise ValueError(f"checkpoint state names a class outside tether: {name}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def decode_state(data: Any) -> Any:
    """Inverse of `encode_state`."""
    if isinstance(data, list):
        return [decode_state(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag = data.get(TAG)
    if tag is None:
        return {k: decode_state(v) for k, v in data.items()}
    if tag == "tuple":
        return tuple(decode_state(v) for v in data["v"])
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(decode_state(v) for v in data["v"])
    if tag == "deque":
        return deque((decode_state(v) for v in data["v"]), maxlen=data["maxlen"])
    if tag == "dict":
        return {decode_state(k): decode_state(v) for k, v in data["v"]}
    if tag == "obj":
        cls = _import_class(data["cls"])
        values = {k: decode_state(v) for k, v in data["v"].items()}
        if dataclasses.is_dataclass(cls):
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            return cls(**{k: v for k, v in values.items() if k in names})
        obj = cls.__new__(cls)
        obj.__dict__.update(values)
        return obj
    raise ValueError(f"unknown state tag {tag!r}")
