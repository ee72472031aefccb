"""The futures and the one worker thread of the Tinker-compatible service (`tether.serve.tinker`).

The SDK's flow: every training, saving and sampling call is answered at once with a request id
(`UntypedAPIFuture`); the client then polls `retrieve_future` until the result is there. Here a
poll waits (long-polls) up to `poll_s` for the result and otherwise answers `try_again`, so a
client never spins. Results stay retrievable for `keep_s` after they are ready (the SDK may ask
again after a dropped connection).

All work on weights runs on one worker thread, in arrival order: a model's forward_backward,
optim_step and saves happen in the order the client sent them (the SDK sends them one after the
other, in its own sequence order). Sampling requests are the exception that makes the service
fast: they read fixed snapshots, never the weights being trained, so the worker takes every
sampling request that arrives within `batch_wait_s` of the previous one (at most `max_wait_s` in all)
and runs them together, equal
settings in one batch (`TinkerEngine.sample_many`), before the other requests it collected.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tether.errors import UserError
from tether.serve.tinker_engine import SampleJob, TinkerEngine
from tether.serve.tinker_wire import WireError


@dataclass
class FutureEntry:
    kind: str  # "json" or "proto" (ForwardBackwardOutput, SampleResponse)
    done: threading.Event = field(default_factory=threading.Event)
    payload: Any = None
    error: str | None = None
    category: str = "server"
    finished_at: float = 0.0
    waiters: list = field(default_factory=list)  # (loop, asyncio.Event) of the polls waiting on it


def category_of(err: BaseException) -> str:
    """The SDK's RequestErrorCategory: "user" for input the client can fix, else "server"."""
    return "user" if isinstance(err, (UserError, WireError)) else "server"


def describe(err: BaseException) -> str:
    message = " ".join(str(err).split())
    return message if category_of(err) == "user" else f"{type(err).__name__}: {message}"


class FutureTable:
    """Request id -> result; polls wait on an asyncio event set from the worker thread."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self._entries: dict[str, FutureEntry] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.keep_s = keep_s

    def new(self, kind: str = "json") -> str:
        rid = f"req-{next(self._ids)}"
        now = time.time()
        with self._lock:
            stale = [k for k, e in self._entries.items() if e.done.is_set() and now - e.finished_at > self.keep_s]
            for k in stale:
                del self._entries[k]
            self._entries[rid] = FutureEntry(kind)
        return rid

    def get(self, rid: str) -> FutureEntry | None:
        with self._lock:
            return self._entries.get(rid)

    def finish(self, rid: str, payload: Any = None, error: BaseException | None = None) -> None:
        entry = self.get(rid)
        if entry is None:
            return
        with self._lock:
            entry.payload = payload
            if error is not None:
                entry.error, entry.category = describe(error), category_of(error)
            entry.finished_at = time.time()
            entry.done.set()
            waiters, entry.waiters = entry.waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that poll's loop is gone
                pass

    async def wait(self, rid: str, timeout: float) -> FutureEntry | None:
        """The entry once done, or None after `timeout` seconds (or for an unknown id: see `get`)."""
        entry = self.get(rid)
        if entry is None or entry.done.is_set():
            return entry
        event = asyncio.Event()
        with self._lock:
            if entry.done.is_set():
                return entry
            entry.waiters.append((asyncio.get_running_loop(), event))
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return entry


@dataclass(frozen=True)
class Job:
    rid: str
    run: Callable[[], Any] | None = None  # a training/saving call: its result is the future's payload
    sample: SampleJob | None = None


class Worker:
    """The thread that runs every job (module docstring)."""

    def __init__(self, engine: TinkerEngine, table: FutureTable, batch_wait_s: float = 0.02, max_wait_s: float = 0.5) -> None:
        self.engine, self.table, self.batch_wait_s, self.max_wait_s = engine, table, batch_wait_s, max_wait_s
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="tether-tinker-worker")
        self.thread.start()

    def submit(self, job: Job) -> str:
        self.jobs.put(job)
        return job.rid

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(30.0)

    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        """`first` and every job that follows it within `batch_wait_s` of the previous one (a client
        submits a batch's sampling requests one HTTP call at a time), for at most `max_wait_s`."""
        batch, start = [first], time.monotonic()
        deadline = start + self.batch_wait_s
        while True:
            try:
                item = self.jobs.get(timeout=max(0.0, min(deadline, start + self.max_wait_s) - time.monotonic()))
            except queue.Empty:
                return batch, False
            if item is None:
                return batch, True
            batch.append(item)
            deadline = time.monotonic() + self.batch_wait_s

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self.jobs.get()
            if first is None:
                break
            batch, stop = self._collect(first) if first.sample is not None else ([first], False)
            samples = [j for j in batch if j.sample is not None]
            if samples:
                for job, result in zip(samples, self.engine.sample_many([j.sample for j in samples])):
                    if isinstance(result, Exception):
                        self.table.finish(job.rid, error=result)
                    else:
                        self.table.finish(job.rid, payload=result)
            for job in batch:
                if job.run is not None:
                    self._run(job)

    def _run(self, job: Job) -> None:
        try:
            result = job.run()
        except Exception as err:  # the request fails, the service lives on
            self.table.finish(job.rid, error=err)
        else:
            self.table.finish(job.rid, payload=result)
