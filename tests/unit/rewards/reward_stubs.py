"""Misbehaving reward functions for the isolation tests, loaded as `reward_stubs:<name>`.

Each keys its behaviour on the text or on `task["i"]`, so one batch mixes good and bad samples.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Mapping


def raise_on_third(text: str, task: Mapping[str, Any]) -> float:
    """Raises for the sample with i == 2; otherwise returns i / 10 (so each value is checkable)."""
    if task["i"] == 2:
        raise RuntimeError("boom on sample 2")
    return task["i"] / 10


def sleep_if_hang(text: str, task: Mapping[str, Any], *, seconds: float = 1e6) -> float:
    """Sleeps (forever by default) when text == "hang"; returns 1.0 otherwise."""
    if text == "hang":
        time.sleep(seconds)
    return 1.0


def exit_if_die(text: str, task: Mapping[str, Any]) -> float:
    """Kills its own process without cleanup when text == "die" (like a segfault)."""
    if text == "die":
        os._exit(3)
    return 1.0


BAD_VALUES: dict[str, Any] = {
    "none": None,
    "nan": float("nan"),
    "inf": float("inf"),
    "str": "abc",
    "list": [1.0],
    "dict_no_score": {"acc": 1.0},
    "dict_nan": {"score": 1.0, "aux": float("nan")},
    "dict_str": {"score": "1"},
}


def bad_value(text: str, task: Mapping[str, Any]) -> Any:
    """Returns BAD_VALUES[text], or 1.0 for any other text."""
    return BAD_VALUES.get(text, 1.0)


def always_raise(text: str, task: Mapping[str, Any]) -> float:
    raise ValueError("verifier misconfigured: no gold answer column")


def with_diagnostics(text: str, task: Mapping[str, Any]) -> dict[str, float]:
    """A dict result: 'score' is the value, 'chars' a logged diagnostic."""
    return {"score": 0.5, "chars": float(len(text))}


def worker_pid(text: str, task: Mapping[str, Any]) -> float:
    return float(os.getpid())


def in_main_thread(text: str, task: Mapping[str, Any]) -> float:
    """1.0 when called on a main thread (where signal.alarm works), else 0.0."""
    return 1.0 if threading.current_thread() is threading.main_thread() else 0.0


def constant(text: str, task: Mapping[str, Any], *, value: float = 1.0) -> float:
    return value
