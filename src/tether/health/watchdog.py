"""The watchdog: a thread that names the phase a hung run is stuck in (reward, generate, update,
eval, checkpoint, ...), dumps every thread's stack and exits with code 3 (docs/health/stall.md)."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Any


def current_phase(thread_id: int | None = None) -> str | None:
    """The phase the main thread's recipe marked (`tether.phase`); None outside training."""
    from tether.phase import current_phase as marked

    return marked(thread_id)


class Watchdog:
    """Samples the main thread's phase every `interval` s; one phase lasting `timeout_s` is a
    hang: stacks go to stderr and `<run>/health_stacks.txt`, health.jsonl gets a record, and the
    process exits with code 3. Stops by itself once no phase is marked (training is over)."""

    def __init__(self, timeout_s: float, rd: Any = None, interval: float = 1.0, exit_fn=os._exit) -> None:
        self.timeout_s, self.rd, self.interval, self.exit_fn = timeout_s, rd, interval, exit_fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tether-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        phase, since, idle = None, time.monotonic(), 0
        while not self._stop.wait(self.interval):
            now, p = time.monotonic(), current_phase()
            idle = idle + 1 if p is None else 0
            if idle > 5:
                return
            if p != phase:
                phase, since = p, now
            elif p is not None and now - since > self.timeout_s:
                self.fire(p, now - since)
                return

    def fire(self, phase: str, seconds: float) -> None:
        msg = (f"tether watchdog: the run is stuck in phase '{phase}' for {seconds:.0f}s "
               f"(health.watchdog_timeout_s={self.timeout_s:g}); stacks follow, exiting with code 3")
        print(msg, file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.rd is not None:
            try:
                with open(self.rd.root / "health_stacks.txt", "w") as fh:
                    faulthandler.dump_traceback(file=fh, all_threads=True)
                self.rd.append_health({"kind": "hang", "phase": phase, "seconds": seconds, "message": msg})
            except OSError:
                pass
        sys.stderr.flush()
        self.exit_fn(3)

    def stop(self) -> None:
        self._stop.set()


__all__ = ["Watchdog", "current_phase"]
