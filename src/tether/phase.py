"""Explicit phase markers: what the training loop is doing now, for the watchdog (tether.health).

    with phase("rollout"):          # the recipe marks its steps; library functions mark theirs
        ...

Markers nest per thread (the innermost is the current phase); `current_phase()` reads the main
thread's, from any thread. No dependencies: every layer may mark a phase, and the watchdog
learns the phase from the markers rather than from function names on the stack.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_STACKS: dict[int, list[str]] = {}


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the current thread as in phase `name` while the block runs."""
    stack = _STACKS.setdefault(threading.get_ident(), [])
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def marks_phase(name: str) -> Callable[[F], F]:
    """Decorator: the function runs in phase `name`."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def current_phase(thread_id: int | None = None) -> str | None:
    """The innermost phase of `thread_id` (default: the main thread); None outside any phase."""
    stack = _STACKS.get(thread_id or threading.main_thread().ident or 0)
    return stack[-1] if stack else None
