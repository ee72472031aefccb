"""Run settings: what legitimately changes during a run, kept apart from the frozen config.

    settings = RunSettings(cfg)                                   # the run's validated, frozen config
    settings.set("algo.kl.coef", 0.05, source="health: raise_kl", step=st.step)
    cfg = settings.config                                         # the config in force: a new frozen object
    settings.drain()                                              # the changes since the last drain, to log

The config a run was started with never changes (nothing assigns into it: its sections are
frozen, `tether.section`). A change made during the run -- a health repair in force (learning
rate, KL anchor, temperature, clipping, ...), a reward cap that dropped a component, a fault under
test, the async recipe's staleness bound -- is an override of one dotted path, recorded here:

- `config` is the run's config with every override applied in the order they were made;
- `set` records the change as an event (`step`, `path`, `old`, `new`, `source`) that the loop
  appends to the run directory's `settings.jsonl` (`drain`);
- `state_dict` / `load_state_dict` carry the overrides through a checkpoint, so a resumed run
  trains under exactly the settings in force when it was saved (bit-exact resume holds).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter


def get_path(node: Any, path: str) -> Any:
    """The value at a dotted path of a (nested) pydantic model (KeyError naming the path if none)."""
    for part in path.split("."):
        if part not in type(node).model_fields:
            raise KeyError(f"{type(node).__name__} has no field {part!r} (setting {path!r})")
        node = getattr(node, part)
    return node


def replace_path(node: BaseModel, path: str, value: Any) -> BaseModel:
    """A copy of `node` with the dotted `path` set to `value` (the models on the way are copied,
    not validated again: a combination that is only valid once several changes are made, e.g.
    masked importance sampling's mode and its threshold, can be made one path at a time)."""
    head, _, rest = path.partition(".")
    if head not in type(node).model_fields:
        raise KeyError(f"{type(node).__name__} has no field {head!r} (setting {path!r})")
    new = replace_path(getattr(node, head), rest, value) if rest else value
    return node.model_copy(update={head: new})


def field_type(model: type[BaseModel], path: str) -> Any:
    """The annotation of the field at a dotted path of a model class."""
    annotation: Any = model
    for part in path.split("."):
        annotation = annotation.model_fields[part].annotation
    return annotation


def to_plain(value: Any) -> Any:
    """A value as plain data (what `torch.load(weights_only=True)` and JSON both read back)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


class RunSettings:
    """The overrides in force over a frozen config, in the order they were made (module docstring)."""

    def __init__(self, base: BaseModel) -> None:
        self.base = base
        self.overrides: dict[str, Any] = {}
        self.pending: list[dict[str, Any]] = []
        self._config = base

    @property
    def config(self) -> Any:
        """The run's config with every override applied (frozen; a new object after each change)."""
        return self._config

    def get(self, path: str) -> Any:
        return get_path(self._config, path)

    def set(self, path: str, value: Any, source: str, step: int | None = None) -> Any:
        """Put `value` in force at `path` (an override of it, or of what it is part of, is replaced);
        returns the value it replaces. A value equal to what is in force changes nothing."""
        old = self.get(path)
        if _same(old, value):
            return old
        for p in [p for p in self.overrides if p.startswith(path + ".")]:
            del self.overrides[p]  # the new value replaces that whole part of the config
        self.overrides.pop(path, None)
        if not _same(get_path(self._rebuilt(), path), value):
            self.overrides[path] = value
        self._config = self._rebuilt()
        self.pending.append({"step": step, "path": path, "old": to_plain(old), "new": to_plain(value), "source": source})
        return old

    def drain(self) -> list[dict[str, Any]]:
        """The change events since the last call (the loop logs them to settings.jsonl)."""
        out, self.pending = self.pending, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"overrides": [[p, to_plain(v)] for p, v in self.overrides.items()]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the overrides of a checkpoint (values validated back into their field types)."""
        self.overrides = {}
        for path, plain in (state or {}).get("overrides", []):
            self.overrides[path] = TypeAdapter(field_type(type(self.base), path)).validate_python(plain)
        self._config = self._rebuilt()

    def _rebuilt(self) -> Any:
        cfg = self.base
        for path, value in self.overrides.items():
            cfg = replace_path(cfg, path, value)
        return cfg


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and to_plain(a) == to_plain(b)


__all__ = ["RunSettings", "field_type", "get_path", "replace_path", "to_plain"]
