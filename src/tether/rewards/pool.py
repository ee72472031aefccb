"""A small pool of persistent, forked worker processes that run reward calls with a wall clock.

Why processes, and why this shape (docs/design.md, correctness rules 6, 12 and 18):
- A hung reward (an infinite loop in C, a stuck sandbox) cannot be interrupted inside the
  process that runs it; it can only be killed. Each call has a deadline; past it the worker gets
  SIGKILL, the call is tagged TIMEOUT and a fresh worker takes its slot (AReaL PR#1426: a hung
  verification held pool workers forever; compose-rl PR#87: the pool must be recreated).
- A worker that dies (`os._exit`, segfault, OOM kill) costs only its in-flight call (ERROR).
- Each call runs in the worker's *main thread*, so `signal.alarm`-based time-outs such as
  math-verify's work (verl PR#5635).
- Fork, not spawn: workers are forked *after* the spec's functions are resolved and inherit
  them in memory, so a reward function defined anywhere (a notebook, `__main__`, a closure
  behind a registered name) runs without being pickled. Only (text, task) travel per call.
- Persistent: forking per call would cost milliseconds each; a pool is kept per spec (at most
  `MAX_POOLS` specs, e.g. train and eval rewards) and closed at exit.

The dispatcher runs in the caller's thread: it keeps one call in flight per worker and waits on
the workers' pipes and process sentinels with the nearest deadline as time-out.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Mapping, Sequence

from tether.rewards.base import NOT_RUN, CallResult, run_reward_call
from tether.rewards.compose import RewardSpec
from tether.types import Outcome

POOL_SIZE = 2  # workers per spec; the brief's min(2, n): a call with one job uses one worker
MAX_POOLS = 2  # specs kept warm at once (train + eval); the least recently used is closed
_PARENT_CHECK_S = 2.0  # how often an idle worker checks that its parent is still alive

Job = tuple[int, int, str, Mapping[str, Any]]  # (sample index, component index, text, task)

_POOLS: OrderedDict[tuple, "RewardPool"] = OrderedDict()
_POOLS_LOCK = threading.Lock()


def _worker_main(conn: Connection, spec: RewardSpec, parent_pid: int, inherited: list[Connection]) -> None:
    """Serve calls until told to stop, the pipe closes, or the parent dies."""
    for c in inherited:  # other workers' parent-side pipe ends, copied by fork: close them so
        try:  # those workers see EOF when the parent closes its end
            c.close()
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # Handlers the trainer installed (checkpoint on SIGTERM, ...) must not run in a stale copy.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    while True:
        try:
            if not conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent_pid:
                    return  # orphaned (parent was killed): don't linger
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job_id, comp_idx, text, task = msg
        comp = spec.components[comp_idx]
        result = run_reward_call(comp.fn, text, task, comp.kwargs)
        try:
            conn.send((job_id, result))
        except (OSError, ValueError):
            return


class _Worker:
    """One forked process and the parent's end of its pipe."""

    def __init__(self, spec: RewardSpec, inherited: list[Connection]) -> None:
        parent_end, child_end = mp.Pipe(duplex=True)
        ctx = mp.get_context("fork")
        # daemon=False so a reward function may itself start processes; close() and the atexit
        # hook end workers, and an orphaned worker exits on its own (parent pid check).
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child_end, spec, os.getpid(), [parent_end, *inherited]),
            name="tether-reward-worker",
            daemon=False,
        )
        self.proc.start()
        child_end.close()
        self.conn = parent_end

    def do_kill(self) -> None:
        """SIGKILL the process (a hung call cannot be interrupted any other way) and reap it."""
        try:
            self.proc.kill()
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=5.0)
        self.conn.close()

    def do_stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within a moment."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.do_kill()
        else:
            self.conn.close()


class RewardPool:
    """Persistent forked workers running the components of one RewardSpec; see the module doc.

    `run_jobs` is serialised by a lock, so threads may share a pool; `close()` ends the workers.
    """

    def __init__(self, spec: RewardSpec, size: int = POOL_SIZE) -> None:
        self.spec = spec
        self.size = size
        self.owner_pid = os.getpid()
        self._slots: list[_Worker | None] = [None] * size
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or found dead and replaced (for tests and logs)

    def _live_conns(self) -> list[Connection]:
        return [w.conn for w in self._slots if w is not None]

    def _get_worker(self, slot: int) -> _Worker:
        """The slot's worker, forking a fresh one if it is missing or has died while idle."""
        w = self._slots[slot]
        if w is not None and not w.proc.is_alive():
            w.do_kill()
            w, self._slots[slot] = None, None
            self.replaced += 1
        if w is None:
            inherited = [c for p in list(_POOLS.values()) + [self] for c in p._live_conns()]
            w = self._slots[slot] = _Worker(self.spec, inherited)
        return w

    def _do_retire(self, slot: int) -> None:
        """Kill the slot's worker; the next dispatch to this slot forks a replacement."""
        w = self._slots[slot]
        if w is not None:
            w.do_kill()
        self._slots[slot] = None
        self.replaced += 1

    def run_jobs(
        self, jobs: Sequence[Job], timeout_s: float, max_failed_samples: int | None = None
    ) -> list[CallResult]:
        """Run every job with a per-call wall clock; results in job order.

        If more than `max_failed_samples` distinct samples have failed, the outcome of the whole
        call (RewardFailure) is already certain: dispatching stops, in-flight workers are killed
        and the jobs left are tagged ERROR ("not run") so a systematic hang cannot hold the run
        for jobs x timeout seconds.
        """
        with self._lock:
            results: list[CallResult | None] = [None] * len(jobs)
            queue = deque(range(len(jobs)))
            inflight: dict[int, tuple[int, float]] = {}  # slot -> (job index, deadline)
            failed: set[int] = set()
            n_slots = min(self.size, len(jobs))
            while queue or inflight:
                for slot in range(n_slots):
                    if slot not in inflight and queue:
                        j = queue.popleft()
                        if not self._do_dispatch(slot, j, jobs, results, inflight, timeout_s):
                            failed.add(jobs[j][0])
                for j in self._do_collect(inflight, results, timeout_s):
                    if results[j].outcome is not Outcome.OK:
                        failed.add(jobs[j][0])
                if max_failed_samples is not None and len(failed) > max_failed_samples:
                    self._do_abort(queue, inflight, results)
            return [r for r in results if r is not None]

    def _do_dispatch(
        self, slot: int, j: int, jobs: Sequence[Job], results: list, inflight: dict, timeout_s: float
    ) -> bool:
        """Send job j to the slot's worker and start its clock; False (job tagged ERROR) if it cannot go."""
        _, comp_idx, text, task = jobs[j]
        try:  # pickle first, so a task that cannot travel is told apart from a dead pipe
            payload = ForkingPickler.dumps((j, comp_idx, text, task))
        except Exception as err:  # noqa: BLE001 - PicklingError, AttributeError, TypeError, ...
            results[j] = CallResult(Outcome.ERROR, error=f"cannot send call to worker: {err!r:.300}")
            return False
        try:
            self._get_worker(slot).conn.send_bytes(payload)
        except OSError:  # the worker died between the liveness check and the send: one retry
            self._do_retire(slot)
            try:
                self._get_worker(slot).conn.send_bytes(payload)
            except OSError as err:
                results[j] = CallResult(Outcome.ERROR, error=f"cannot send call to a fresh worker: {err!r:.300}")
                return False
        inflight[slot] = (j, time.monotonic() + timeout_s)
        return True

    def _do_collect(self, inflight: dict[int, tuple[int, float]], results: list, timeout_s: float) -> list[int]:
        """Wait for the first result, death or deadline among in-flight calls; return finished jobs."""
        if not inflight:
            return []
        nearest = min(deadline for _, deadline in inflight.values())
        waitables: list[Any] = []
        for slot in inflight:
            w = self._slots[slot]
            waitables += [w.conn, w.proc.sentinel]
        ready = set(wait(waitables, timeout=max(0.0, nearest - time.monotonic())))
        done = []
        for slot, (j, deadline) in list(inflight.items()):
            w = self._slots[slot]
            if w.conn in ready:
                try:
                    job_id, result = w.conn.recv()
                    assert job_id == j, f"worker answered job {job_id}, expected {j}"
                    results[j] = result
                except (EOFError, OSError):  # died mid-call: the pipe closed under us
                    results[j] = self._died_result(slot)
                    self._do_retire(slot)
            elif w.proc.sentinel in ready:
                results[j] = self._died_result(slot)
                self._do_retire(slot)
            elif time.monotonic() >= deadline:
                results[j] = CallResult(Outcome.TIMEOUT, error=f"no result within reward.timeout_s={timeout_s:g}s; worker killed")
                self._do_retire(slot)
            else:
                continue
            del inflight[slot]
            done.append(j)
        return done

    def _died_result(self, slot: int) -> CallResult:
        w = self._slots[slot]
        w.proc.join(timeout=1.0)
        return CallResult(Outcome.ERROR, error=f"reward worker died mid-call (exit code {w.proc.exitcode})")

    def _do_abort(self, queue: deque, inflight: dict, results: list) -> None:
        """Kill in-flight calls and mark everything not finished as not run."""
        for slot, (j, _) in list(inflight.items()):
            self._do_retire(slot)
            results[j] = CallResult(Outcome.ERROR, error=NOT_RUN)
        inflight.clear()
        while queue:
            results[queue.popleft()] = CallResult(Outcome.ERROR, error=NOT_RUN)

    def close(self) -> None:
        """End all workers (idempotent). Only the process that forked them may do it."""
        if os.getpid() != self.owner_pid:
            return
        for slot, w in enumerate(self._slots):
            if w is not None:
                w.do_stop()
            self._slots[slot] = None


def make_reward_pool(spec: RewardSpec) -> RewardPool:
    """The warm pool for `spec`, or a new one (workers fork lazily on first use).

    Pools are per process: one inherited through a fork (pytest-xdist, a Ray worker, a reward
    worker calling `run_rewards`) belongs to the parent and is dropped, never used or closed.
    """
    key = spec.cache_key()
    with _POOLS_LOCK:
        for k in [k for k, p in _POOLS.items() if p.owner_pid != os.getpid()]:
            del _POOLS[k]
        pool = _POOLS.get(key)
        if pool is not None:
            _POOLS.move_to_end(key)
            return pool
        while len(_POOLS) >= MAX_POOLS:
            _, old = _POOLS.popitem(last=False)
            old.close()
        pool = _POOLS[key] = RewardPool(spec)
        return pool


def close_reward_pools() -> None:
    """End every pool's workers; registered with atexit, safe to call any time."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        p.close()


atexit.register(close_reward_pools)
