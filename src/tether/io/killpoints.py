"""Named crash points, for the kill -9 resume test (tests/integration/test_resume_kill.py).

`do_kill_point("ckpt/optimizer")` does nothing unless the environment variable `TETHER_KILL_AT`
names that point (`ckpt/optimizer`, or `ckpt/optimizer@2` for the second time it is reached);
then the process sends itself SIGKILL: the same as `kill -9` from outside, at exactly that line
(no handler, no flush, no atexit). The points are listed in `KILL_POINTS`.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

ENV = "TETHER_KILL_AT"
KILL_POINTS = (
    "step/computed",      # a step's update is done, nothing of it written yet
    "metrics/torn",       # half of the step's metrics.jsonl row written (a torn last line)
    "step/logged",        # the step's metrics row is durable, its samples are not
    "step/samples",       # the step's samples are written, the checkpoint (if due) is not
    "ckpt/model",         # inside a checkpoint write: model.safetensors written
    "ckpt/optimizer",     # ... optimizer.pt written
    "ckpt/state",         # ... trainer_state.pt written, no manifest yet
    "ckpt/manifest",      # ... manifest written, not yet renamed into place
    "ckpt/renamed",       # the checkpoint is in place, the `latest` pointer is not moved
    "ckpt/done",          # the checkpoint is complete (pointer moved, old ones pruned)
    "eval/done",          # an evaluation finished, its metrics not yet logged
)
_reached: dict[str, int] = {}


def do_kill_point(name: str, before: Callable[[], Any] | None = None) -> None:
    """SIGKILL this process when `TETHER_KILL_AT` names `name` and the count is reached
    (`before()` runs first: e.g. write half a line, to leave a torn file behind)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, nth = spec.partition("@")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == int(nth or 1):
        if before is not None:
            before()
        os.kill(os.getpid(), signal.SIGKILL)
