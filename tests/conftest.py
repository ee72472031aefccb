"""Shared test setup: offline, deterministic, small thread counts (CI has 2 cores)."""

import contextlib
import fcntl
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # xdist runs two workers on two cores


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _exclusive(request):
    """Tests marked `exclusive(name)` hold an inter-process lock on `name` while they run.

    pytest-xdist's `xdist_group` does not keep a group on one worker with pytest 9 (measured:
    a file's tests alternate between gw0 and gw1), so a resource that two workers must not use
    at once — uid 65534's process budget in the sandbox tests, one Ray cluster — is guarded by a
    file lock instead, whatever the scheduling.
    """
    names = sorted({str(m.args[0]) for m in request.node.iter_markers("exclusive")})
    with contextlib.ExitStack() as stack:
        for name in names:
            fh = stack.enter_context(open(os.path.join(tempfile.gettempdir(), f"tether-tests-{name}.lock"), "w"))
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield
