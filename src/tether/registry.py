"""The one registry mechanism, used only at algorithm seams (DESIGN.md house rule 3).

A lookup error lists the valid names and suggests the nearest one, so a typo in a config
(`advantage: grpoo`) says what was meant.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from tether.errors import UserError

F = TypeVar("F", bound=Callable)


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[F]):
    """A name -> function table for one kind of algorithm piece (all with one signature)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._fns[name] = fn
            return fn

        return deco

    def __getitem__(self, name: str) -> F:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        valid = sorted(self._fns)
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Valid: {', '.join(valid)}"

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._fns))

    def names(self) -> list[str]:
        return sorted(self._fns)
