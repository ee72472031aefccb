"""The one registry mechanism, used only at algorithm seams (docs/design.md, house rule 3).

A lookup error lists the valid names and suggests the nearest one, so a typo in a config
(`advantage: grpoo`) says what was meant.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

from tether.errors import UserError

F = TypeVar("F", bound=Callable)


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[F]):
    """A name -> function table for one kind of algorithm piece (all with one signature)."""

    def __init__(self, kind: str, default_facts: Any = None) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}
        self._facts: dict[str, Any] = {}
        self.default_facts = default_facts

    def register(self, name: str, facts: Any = None) -> Callable[[F], F]:
        """Register under `name`; `facts` (a frozen dataclass of this registry's fact type) is what
        callers ask instead of comparing names (needs a critic, compares within a group, ...)."""

        def deco(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._fns[name] = fn
            if facts is not None:
                self._facts[name] = facts
            return fn

        return deco

    def facts(self, name: str) -> Any:
        """The facts registered with `name` (the registry's defaults when none were given)."""
        self[name]  # unknown names raise with the valid ones listed
        return self._facts.get(name, self.default_facts)

    def check(self, name: str, key: str) -> str | None:
        """None when `name` is registered, else the one-line problem for config key `key`."""
        return None if name in self._fns else f"{key}: {self.unknown_message(name)}"

    def __getitem__(self, name: str) -> F:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        valid = sorted(self._fns)
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.4)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Valid: {', '.join(valid)}"

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._fns))

    def names(self) -> list[str]:
        return sorted(self._fns)


def import_object(name: str, what: str, error: type[Exception] = ValueError, form: str = "package.module:function") -> Any:
    """The object `package.module:attr` names (user code on PYTHONPATH), for configs that accept
    one in place of a registry name; `error(message)` names `what`, the module and what was wrong."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise error(f"{what} {name!r}: expected the form {form!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or an error raised while executing the module
        raise error(f"{what} {name!r}: cannot import module {module_name!r} ({type(err).__name__}: {err}); "
                    "is its folder on PYTHONPATH?") from err
    obj = getattr(module, attr, None)
    if obj is None:
        public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise error(f"{what} {name!r}: module {module_name!r} has no attribute {attr!r} "
                    f"(callables there: {', '.join(public[:20]) or 'none'})")
    return obj
