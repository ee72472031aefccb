"""Runs `tether pipeline ARGS...` and kills its own process (SIGKILL, as kill -9) right after the
N-th RL step of the whole pipeline: `python stage_kill_driver.py N pipeline CONFIG --run-dir D`."""

import os
import signal
import sys

import tether.recipes.rl as rl
from tether.cli import app

KILL_AT = int(sys.argv[1])
_orig = rl.run_rl_step
_calls = [0]


def _killing_step(*args, **kwargs):
    out = _orig(*args, **kwargs)
    _calls[0] += 1
    if _calls[0] == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-stage: the step is done, its checkpoint is not written
    return out


rl.run_rl_step = _killing_step
app(sys.argv[2:], standalone_mode=True)
