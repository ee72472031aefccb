"""`run_rewards`: score a batch of completions with failures as values (house rule 9).

    results, metrics = run_rewards(texts, tasks, cfg.reward)
    valid_B = [r.outcome is Outcome.OK for r in results]   # mask the rest out of the update

Every (completion, component) pair is one call. A call that raises is ERROR (message kept,
truncated), one that runs past `reward.timeout_s` is TIMEOUT, one that returns None / NaN / inf /
a non-number is INVALID. One bad sample never changes the others (docs/design.md, correctness rule 6), and a
*systematic* failure — more than `reward.max_error_rate` of the samples failed — raises
`RewardFailure` naming the component and its first error, so the caller can stop the run with
the cause instead of training on zeros.

Isolation modes (`reward.isolation`):
- `process` (default): persistent forked workers (`rewards/pool.py`); a hung call's worker is
  SIGKILLed and replaced, a dead worker costs only its in-flight call. The only mode that can
  stop a runaway reward and that runs every call in a main thread (signal-based time-outs work).
- `thread`: daemon threads with a wall clock. A timed-out call is tagged TIMEOUT but its thread
  **cannot be killed**: it keeps running (and holding whatever it holds) until it returns by
  itself. Daemon threads rather than `concurrent.futures`, whose workers are joined at
  interpreter exit: one hung reward would then hang the program's exit. For I/O-bound rewards
  (an LLM judge over HTTP) where forking is unwanted.
- `inline`: plain calls in the caller's thread, no time-out, no isolation — for debugging with
  a breakpoint inside a reward function. Exceptions are still tagged, never raised.

Batched components (a reward model, an LLM judge: `fn.batched = True`, `fn(texts, tasks, **kw)`
returning one value per text) run once per scoring call in this process, on a daemon thread with
a wall clock of `reward.timeout_s` per sample (`base.run_batched_call`): a model is loaded once
and scores the whole batch, which a per-sample forked worker cannot do.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

from tether.rewards.config import RewardConfig
from tether.rewards.base import NOT_RUN, CallResult, RewardFailure, is_batched, run_batched_call, run_reward_call
from tether.rewards.compose import RewardSpec, build_reward_spec, compute_reward_metrics, compute_reward_result
from tether.rewards.pool import Job, make_reward_pool
from tether.types import Outcome, RewardResult
from tether.phase import marks_phase

THREAD_WORKERS = 8  # live (not abandoned) threads at once in `thread` mode
_THREAD_TIMEOUT = "no result within reward.timeout_s={:g}s; thread abandoned (it cannot be killed)"

Runner = Callable[[RewardSpec, Sequence[Job], float, int], list[CallResult]]


def run_inline_jobs(spec: RewardSpec, jobs: Sequence[Job], timeout_s: float, max_failed: int) -> list[CallResult]:
    """Each call in turn in the caller's thread; `timeout_s` and `max_failed` are not enforced."""
    out = []
    for _, c, text, task in jobs:
        comp = spec.components[c]
        out.append(run_reward_call(comp.fn, text, task, comp.kwargs))
    return out


def run_thread_jobs(spec: RewardSpec, jobs: Sequence[Job], timeout_s: float, max_failed: int) -> list[CallResult]:
    """Calls on daemon threads with a per-call wall clock; timed-out threads are abandoned."""
    done: queue.SimpleQueue = queue.SimpleQueue()  # per call: late answers of abandoned threads land here unread

    def serve(j: int) -> None:
        _, c, text, task = jobs[j]
        comp = spec.components[c]
        done.put((j, run_reward_call(comp.fn, text, task, comp.kwargs)))

    results: list[CallResult | None] = [None] * len(jobs)
    pending = deque(range(len(jobs)))
    running: dict[int, float] = {}  # job -> deadline
    failed: set[int] = set()
    while pending or running:
        while pending and len(running) < THREAD_WORKERS:
            j = pending.popleft()
            threading.Thread(target=serve, args=(j,), daemon=True, name="tether-reward").start()
            running[j] = time.monotonic() + timeout_s
        finished: dict[int, CallResult] = {}
        try:
            j, res = done.get(timeout=max(0.0, min(running.values()) - time.monotonic()))
            if j in running:  # else: the late answer of a call already tagged TIMEOUT
                finished[j] = res
        except queue.Empty:
            pass
        now = time.monotonic()
        for j, deadline in running.items():
            if now >= deadline and j not in finished:
                finished[j] = CallResult(Outcome.TIMEOUT, error=_THREAD_TIMEOUT.format(timeout_s))
        for j, res in finished.items():
            results[j] = res
            del running[j]
            if res.outcome is not Outcome.OK:
                failed.add(jobs[j][0])
        if len(failed) > max_failed:  # RewardFailure is certain: stop waiting on the rest
            for j in [*pending, *running]:
                results[j] = CallResult(Outcome.ERROR, error=NOT_RUN)
            pending.clear()
            running.clear()
    return [r for r in results if r is not None]


def run_process_jobs(spec: RewardSpec, jobs: Sequence[Job], timeout_s: float, max_failed: int) -> list[CallResult]:
    """Calls on the spec's warm pool of forked workers (killed and replaced on time-out)."""
    return make_reward_pool(spec).run_jobs(jobs, timeout_s, max_failed_samples=max_failed)


RUNNERS: dict[str, Runner] = {"process": run_process_jobs, "thread": run_thread_jobs, "inline": run_inline_jobs}


def compute_max_tolerated(n: int, max_error_rate: float) -> int:
    """Most failed samples out of n that are not systematic (failed / n <= max_error_rate).

    One integer threshold, used both to stop early and to raise, so the two never disagree; the
    epsilon keeps 0.29 * 100 = 28.999... from tolerating one failure too few.
    """
    return math.floor(max_error_rate * n + 1e-9)


def compute_failure_message(spec: RewardSpec, calls_by_sample: Sequence[Sequence[CallResult]], cfg: RewardConfig) -> tuple[str, str]:
    """(component, message) for a systematic failure: the component that failed most, its first error."""
    n = len(calls_by_sample)
    n_failed = sum(any(c.outcome is not Outcome.OK for c in calls) for calls in calls_by_sample)
    counts = [sum(calls[i].outcome is not Outcome.OK for calls in calls_by_sample) for i in range(len(spec.components))]
    worst = max(range(len(counts)), key=counts.__getitem__)
    fails = [calls[worst] for calls in calls_by_sample if calls[worst].outcome is not Outcome.OK]
    real = [c for c in fails if c.error != NOT_RUN] or fails
    kinds = {o.value: sum(c.outcome is o for c in real) for o in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.INVALID)}
    name = spec.components[worst].name
    message = (
        f"systematic reward failure: {n_failed}/{n} samples failed "
        f"({n_failed / n:.0%} > reward.max_error_rate={cfg.max_error_rate:g}); "
        f"component {name!r} failed {len(real)} times ({', '.join(f'{k}: {v}' for k, v in kinds.items())}); "
        f"first error: {real[0].outcome.value}: {real[0].error}"
    )
    if len(real) < len(fails):
        message += f" [{len(fails) - len(real)} calls not run after the failure became certain]"
    return name, message


@marks_phase("reward")
def run_rewards(
    texts: Sequence[str], tasks: Sequence[Mapping[str, Any]], cfg: RewardConfig
) -> tuple[list[RewardResult], dict[str, float]]:
    """Score `texts[i]` against `tasks[i]` with every component of `cfg`; one RewardResult each.

    `texts` are completions decoded from the sampled ids and cut at the stop token. Returns the
    tagged results (in order) and metrics: `reward/{error,timeout,invalid}_count`,
    `reward/error_rate`, `reward/<component>/{mean,std,fail_count}`, `reward/total/{mean,std}`,
    `reward/correct_rate`, `reward/seconds`. Raises `RewardFailure` (results and metrics attached)
    when more than `cfg.max_error_rate` of the samples failed, and ValueError when the two lists
    differ in length (a silently broadcast reward list is trl#6533).
    """
    if len(texts) != len(tasks):
        raise ValueError(f"run_rewards: {len(texts)} texts but {len(tasks)} tasks; they must pair one to one")
    start = time.perf_counter()
    spec = build_reward_spec(cfg)
    n, k = len(texts), len(spec.components)
    batched = [c for c in range(k) if is_batched(spec.components[c].fn)]  # model-based: one call per batch
    jobs: list[Job] = [(i, c, texts[i], tasks[i]) for i in range(n) for c in range(k) if c not in batched]
    max_failed = compute_max_tolerated(n, cfg.max_error_rate)
    calls = RUNNERS[cfg.isolation](spec, jobs, cfg.timeout_s, max_failed) if jobs else []
    if len(calls) != len(jobs):  # a runner bug must never shift results onto the wrong samples
        raise RuntimeError(f"reward runner {cfg.isolation!r} returned {len(calls)} results for {len(jobs)} calls")
    by_key = {(i, c): call for (i, c, _, _), call in zip(jobs, calls)}
    for c in batched:
        comp = spec.components[c]
        for i, call in enumerate(run_batched_call(comp.fn, texts, tasks, comp.kwargs, cfg.timeout_s * max(n, 1))):
            by_key[(i, c)] = call
    by_sample = [[by_key[(i, c)] for c in range(k)] for i in range(n)]
    results = [compute_reward_result(spec, cs, cfg.on_error) for cs in by_sample]
    metrics = compute_reward_metrics(spec, by_sample, results, time.perf_counter() - start)
    n_failed = sum(any(c.outcome is not Outcome.OK for c in cs) for cs in by_sample)
    if n_failed > max_failed:
        component, message = compute_failure_message(spec, by_sample, cfg)
        raise RewardFailure(message, component, results, metrics)
    return results, metrics
