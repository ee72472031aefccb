"""Run environment and tool calls with a wall clock; failures are values (docs/design.md, correctness rule 6).

Environments own mutable state (a simulated world, an open MCP session), so their calls cannot
move to a forked process the way pure reward functions do (`tether.rewards.pool`). They run on
daemon threads instead, with the reward layer's conventions: a call that raises is ERROR (type,
message and location kept, truncated), one that runs past its deadline is TIMEOUT. A timed-out
thread cannot be killed; it is abandoned (daemon, so it never blocks interpreter exit) and its
late result is dropped. The rollout then ends that episode (`StopReason.TIMEOUT`), so an
abandoned thread never races the episode's next step. Calls that must be killable (model-written
code) belong in the sandbox, which kills a process group.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tether.rewards.base import make_error_text
from tether.types import Outcome

MAX_THREADS = 16  # calls in flight at once


@dataclass(frozen=True)
class CallOutcome:
    """The tagged result of one call: `value` when OK, else `error` text."""

    outcome: Outcome
    value: Any = None
    error: str = ""
    seconds: float = 0.0


def _call(fn: Callable[[], Any]) -> CallOutcome:
    t0 = time.perf_counter()
    try:
        value = fn()
    except (Exception, SystemExit) as err:  # sys.exit() in an env must not end the trainer
        return CallOutcome(Outcome.ERROR, error=make_error_text(err), seconds=time.perf_counter() - t0)
    return CallOutcome(Outcome.OK, value=value, seconds=time.perf_counter() - t0)


def run_calls(fns: Sequence[Callable[[], Any]], timeout_s: float | None) -> list[CallOutcome]:
    """Run the zero-argument callables concurrently, each with its own deadline; results in order.

    `timeout_s=None` runs them inline in the caller's thread (no deadline; for debugging).
    """
    if timeout_s is None:
        return [_call(fn) for fn in fns]
    done: queue.SimpleQueue = queue.SimpleQueue()
    results: list[CallOutcome | None] = [None] * len(fns)
    pending = list(range(len(fns)))[::-1]
    running: dict[int, float] = {}
    while pending or running:
        while pending and len(running) < MAX_THREADS:
            j = pending.pop()
            threading.Thread(target=lambda j=j: done.put((j, _call(fns[j]))), daemon=True, name="tether-env").start()
            running[j] = time.monotonic() + timeout_s
        try:
            j, res = done.get(timeout=max(0.0, min(running.values()) - time.monotonic()))
            if j in running:  # else: the late answer of a call already tagged TIMEOUT
                results[j] = res
                del running[j]
        except queue.Empty:
            pass
        now = time.monotonic()
        for j in [j for j, deadline in running.items() if now >= deadline]:
            results[j] = CallOutcome(Outcome.TIMEOUT, error=f"no result within {timeout_s:g}s; call abandoned",
                                     seconds=timeout_s)
            del running[j]
    return [r for r in results if r is not None]


def run_call(fn: Callable[[], Any], timeout_s: float | None) -> CallOutcome:
    """One call with a deadline (see `run_calls`)."""
    return run_calls([fn], timeout_s)[0]
