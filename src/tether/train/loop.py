"""The loop's chrome, shared by every recipe: a graceful Ctrl-C (finish the step, checkpoint,
exit), a progress bar (rich on a terminal, a plain line every ~5% elsewhere) and the log of
run-settings changes (settings.jsonl)."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from tether.settings import RunSettings


class StopRequested:
    """Set by Ctrl-C (SIGINT) / SIGTERM: the loop finishes the step, checkpoints and exits."""

    def __init__(self) -> None:
        self.requested = False

    def __bool__(self) -> bool:
        return self.requested


@contextmanager
def graceful_interrupt() -> Iterator[StopRequested]:
    flag = StopRequested()
    previous = {}

    def handler(signum, frame):  # second Ctrl-C aborts immediately
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True
        print("\n[tether] stop requested: finishing this step, saving a checkpoint (Ctrl-C again to abort)", flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    try:
        yield flag
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


@contextmanager
def progress_bar(total: int, description: str, enabled: bool = True, start: int = 0):
    """A rich progress bar; `update(step, **fields)` advances it and shows reward/step time."""
    if not enabled:
        yield lambda *a, **k: None
        return
    if not sys.stdout.isatty():  # CI logs, pipes: a plain line every ~5% of the work
        every = max(1, total // 20)

        def plain(step: int, **fields: float) -> None:
            if step % every == 0 or step == total:
                info = "  ".join(f"{k}={v:.3g}" for k, v in fields.items())
                print(f"[{description}] {step}/{total}  {info}", flush=True)

        yield plain
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*cols, transient=False) as prog:
        task = prog.add_task(description, total=total, completed=start, info="")

        def update(step: int, **fields: float) -> None:
            info = "  ".join(f"{k}={v:.3g}" for k, v in fields.items())
            prog.update(task, completed=step, info=info)

        yield update


def do_log_settings(rd: Any, settings: RunSettings) -> None:
    """Append the run-settings changes made since the last call to the run's settings.jsonl
    (`rd`: a tether.io.run_dir.RunDir)."""
    for event in settings.drain():
        rd.append_settings(event)
