"""The multi-run engine: one way to run a family of runs, shared by pipelines (stages), sweeps
(arms x seeds), the context comparison (builders x seeds) and faultbench (fault cases).

    outcomes = run_members(parent, "sweep", members, execute, collect, workers=2)

**Which runs belong to a multi-run**: its `members`, each a run directory under the parent; the
parent's run record lists them (`{name, kind, path, status}`, paths relative to the parent) after
every member, so `tether show` / `doctor` / `report` of the parent find them all.

**The one resume rule.** A member is *done* when its outcome is recorded: the engine writes
`<member>/member.json` (or the owner's marker name) after `execute` returned and `collect` read
the outcome; a done member is not run again (its outcome is read back, through `collect` when the
owner recomputes it from the run, e.g. a sweep's metric). A member that is not done runs: resumed
from its own latest checkpoint when it has one (the member kind's own resume rules apply: a
changed config is refused there), otherwise whatever an earlier attempt left is moved aside
(`<name>.incomplete-<k>`, never deleted) and it starts afresh.

**One progress display**: a line per member as it starts and as it ends, `[tether NAME] k/N
member: what it gave (seconds) ETA`, the ETA from the mean time of the members run so far.

**One summary format**: `members_table(outcomes)`, a row per member (name, kind, path, status,
seconds, message), which each owner puts in its summary.json under `members`.

Workers: members run in order one at a time (`workers=1`: a later one may use an earlier one's
outcome, as pipeline stages do), or `workers` at a time in threads (members that are processes of
their own: a sweep's `tether` subprocesses) or in forked processes (`pool="process"`: in-process
runs such as faultbench's cases; `execute` must then be a picklable module-level function).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tether.io.checkpoint import find_latest_checkpoint
from tether.io.run_dir import write_text_atomic
from tether.runs.lifecycle import do_set_members
from tether.runs.record import relative_to_run

MARKER = "member.json"


@dataclass(frozen=True)
class Member:
    """One run of a multi-run: `name` (unique, for progress and the record), its run directory,
    its run kind, and `data`: what the owner needs to run it (an arm and seed, a stage, a case)."""

    name: str
    path: Path
    kind: str | None = None
    data: Any = None


@dataclass
class Outcome:
    """What one member gave: `status` ran | reused | failed, its `value` (the owner's record of it;
    None when failed), the seconds it took now (0 when reused) and a one-line `message`."""

    member: Member
    status: str
    value: Any = None
    seconds: float = 0.0
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("ran", "reused")


@dataclass(frozen=True)
class Interrupted:
    """What `collect` returns for a member that stopped early (Ctrl-C, a health halt): not done,
    nothing recorded, and no member after it is started."""

    message: str = "interrupted"


def fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m {s:02d}s" if m else f"{s}s"


class Progress:
    """The one progress display of multi-runs (see the module doc)."""

    def __init__(self, name: str, total: int, done: int, log: Callable[[str], None]) -> None:
        self.name, self.total, self.done, self.log = name, total, done, log
        self.ran, self.t0 = 0, time.perf_counter()
        self.todo = total - done

    def start(self, member: Member) -> None:
        self.log(f"[tether {self.name}] start {member.name} -> {member.path}")

    def finish(self, outcome: Outcome) -> None:
        self.done += 1
        if outcome.status != "reused":
            self.ran += 1
        rate = (time.perf_counter() - self.t0) / max(self.ran, 1)
        eta = rate * max(self.todo - self.ran, 0)
        what = outcome.message or "done" if outcome.ok else f"{outcome.status}: {outcome.message}"
        took = "reused" if outcome.status == "reused" else f"{outcome.seconds:.0f}s"
        self.log(f"[tether {self.name}] {self.done}/{self.total} {outcome.member.name}: {what} ({took})"
                 + (f"  ETA {fmt_eta(eta)}" if outcome.status != "reused" and self.ran < self.todo else ""))


def do_move_aside(path: Path) -> Path | None:
    """Rename an unfinished member's directory to `<name>.incomplete-<k>` (never deleted)."""
    if not path.exists():
        return None
    k = 1
    while path.with_name(f"{path.name}.incomplete-{k}").exists():
        k += 1
    target = path.with_name(f"{path.name}.incomplete-{k}")
    path.rename(target)
    return target


def read_marker(member: Member, marker: str = MARKER) -> dict[str, Any] | None:
    """The outcome recorded for `member` ({"value": ...}), or None when it is not done."""
    path = member.path / marker
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _prepare(member: Member, resumable: bool | Callable[[Member], bool]) -> bool:
    """True: resume the member (from its checkpoint, or as the predicate says); False: start afresh
    (leftovers moved aside)."""
    if callable(resumable):
        if member.path.is_dir() and resumable(member):
            return True
    elif resumable and member.path.is_dir() and find_latest_checkpoint(member.path) is not None:
        return True
    do_move_aside(member.path)
    return False


def _timed(execute: Callable[[Member, bool], Any], member: Member, resume: bool) -> tuple[Any, float]:
    t = time.perf_counter()
    result = execute(member, resume)
    return result, time.perf_counter() - t


def member_rows(parent: Path, outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """The run record's `members` entries (name, kind, path relative to the parent, status)."""
    return [{"name": o.member.name, "kind": o.member.kind, "status": o.status,
             "path": relative_to_run(parent, o.member.path)} for o in outcomes]


def members_table(parent: Path, outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """The one summary format of a multi-run's members (see the module doc)."""
    return [{"name": o.member.name, "kind": o.member.kind, "path": relative_to_run(parent, o.member.path),
             "status": o.status, "seconds": o.seconds, "message": o.message} for o in outcomes]


@dataclass
class Plan:
    """How `run_members` treats the members: see its doc."""

    execute: Callable[[Member, bool], Any]
    collect: Callable[[Member, Any], Any]
    describe: Callable[[Any], str] = lambda value: ""
    recorded: Callable[[Member], Any] | None = None
    workers: int = 1
    pool: str = "thread"
    # may an unfinished member continue (True: when it holds a checkpoint; or a predicate of the member)
    resumable: bool | Callable[[Member], bool] = True
    marker: str = MARKER
    stop_on_failure: bool = False
    raise_errors: bool = False  # a member's exception propagates (a pipeline: its user errors exit 2)
    # recompute a reused member's value from its run (collect(member, None)) instead of reading it back
    recollect: bool = False


def _reuse(member: Member, plan: Plan) -> Outcome | None:
    stored = read_marker(member, plan.marker)
    value = stored.get("value") if stored is not None else (plan.recorded(member) if plan.recorded else None)
    if value is None and stored is None:
        return None
    if plan.recollect:
        value = plan.collect(member, None)
        if value is None:
            return None
    return Outcome(member, "reused", value, 0.0, plan.describe(value))


def _finish(member: Member, plan: Plan, result: Any, seconds: float, error: BaseException | None) -> Outcome:
    if error is not None:
        return Outcome(member, "failed", None, seconds, f"{type(error).__name__}: {' '.join(str(error).split())}"[:300])
    try:
        value = plan.collect(member, result)
    except Exception as err:  # the owner found the member's result unusable: failed, and run again next time
        if plan.raise_errors:
            raise
        return _finish(member, plan, None, seconds, err)
    if isinstance(value, Interrupted):
        return Outcome(member, "interrupted", None, seconds, value.message)
    if value is None:
        return Outcome(member, "failed", None, seconds, "finished without a result (see its log)")
    write_text_atomic(member.path / plan.marker, json.dumps({"member": member.name, "value": value}, default=str) + "\n")
    return Outcome(member, "ran", value, seconds, plan.describe(value))


def _pool(plan: Plan) -> Executor:
    if plan.pool == "process":
        return ProcessPoolExecutor(max_workers=plan.workers, mp_context=multiprocessing.get_context("fork"))
    return ThreadPoolExecutor(max_workers=plan.workers)


def run_members(parent: str | os.PathLike[str], name: str, members: Sequence[Member], plan: Plan,
                log: Callable[[str], None] = print, on_outcome: Callable[[Outcome], None] | None = None,
                record_members: bool = True) -> list[Outcome]:
    """Run every member of the multi-run at `parent` that is not done (see the module doc); returns
    one Outcome per member, in the members' order. `on_outcome` sees each as it ends (before the
    next member starts when `workers == 1`). A member that raises is a failed outcome; with
    `stop_on_failure` the members after it are not run (and not listed)."""
    parent = Path(parent)
    done = {m.name: o for m in members if (o := _reuse(m, plan)) is not None}
    progress = Progress(name, len(members), 0, log)
    progress.todo = len(members) - len(done)
    outcomes: dict[str, Outcome] = {}

    def record(o: Outcome) -> None:
        outcomes[o.member.name] = o
        progress.finish(o)
        if on_outcome is not None:
            on_outcome(o)
        if record_members:
            do_set_members(parent, member_rows(parent, [outcomes[m.name] for m in members if m.name in outcomes]))

    todo = []
    for m in members:  # members found done are reported first, in order
        if m.name in done:
            record(done[m.name])
        else:
            todo.append(m)
    log(f"[tether {name}] {len(members)} runs: {len(done)} done, {len(todo)} to run"
        + (f" ({plan.workers} at a time)" if plan.workers > 1 and todo else "") + f" -> {parent}")
    if plan.workers <= 1:
        for m in todo:
            progress.start(m)
            resume = _prepare(m, plan.resumable)
            try:
                result, secs = _timed(plan.execute, m, resume)
                o = _finish(m, plan, result, secs, None)
            except Exception as err:  # the member failed; Ctrl-C and exits propagate
                if plan.raise_errors:
                    raise
                o = _finish(m, plan, None, 0.0, err)
            record(o)
            if o.status == "interrupted" or (not o.ok and plan.stop_on_failure):
                break
    else:
        _run_parallel(todo, plan, progress, record)
    return [outcomes[m.name] for m in members if m.name in outcomes]


def _run_parallel(todo: Sequence[Member], plan: Plan, progress: Progress, record: Callable[[Outcome], None]) -> None:
    pool = _pool(plan)
    try:  # on Ctrl-C queued members are cancelled; finished ones stay done
        futures: dict[Future, Member] = {pool.submit(_timed, plan.execute, m, _prepare(m, plan.resumable)): m for m in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                m = futures[fut]
                try:
                    result, secs = fut.result()
                    o = _finish(m, plan, result, secs, None)
                except Exception as err:
                    if plan.raise_errors:
                        raise
                    o = _finish(m, plan, None, 0.0, err)
                record(o)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["MARKER", "Interrupted", "Member", "Outcome", "Plan", "Progress", "do_move_aside", "fmt_eta", "members_table",
           "read_marker", "run_members"]
