"""Run model-written Python in a sandbox; grade coding tasks by unit tests (docs/design.md, correctness rule 18).

    res = run_sandboxed_python("print(sum(range(10)))", SandboxLimits(wall_seconds=5))
    res.outcome, res.stdout          # ("ok", "45\\n")
    passed, total, res = run_python_tests(solution_code, test_code, SandboxLimits())

Never run model code on the training host as the training user (wshobson PR#624). The backend
is bubblewrap unless the user opts in to a weaker one (`sandbox.backend=unshare|rlimits`, which
warns loudly, once, naming what it does not protect); without a usable bwrap and without the
opt-in, `resolve_backend` raises `SandboxUnavailable` with the install hint. What each backend
mounts, which uid the program gets and why: `tether.envs.sandbox_backends`. Each execution gets
fresh files (a tmpfs `/work` under bwrap, a new host directory otherwise), a uid of its own when
the trainer is root, and a wall clock that SIGKILLs the program — pid 1 of its namespace, whose
death takes every descendant with it (under `rlimits`: the process group, then the uid).

Failures are values (docs/design.md, correctness rule 6): `outcome` is `ok | error | timeout | killed | denied`
(`timeout`: the CPU or wall clock; `killed`: another limit — memory, processes, files, disk);
`infra_error` is set when the *sandbox* failed, not the program: mask or retry such a sample,
never score it 0 (NeMo-Gym PR#2015). Known limit: in-process grading defeats naive tampering,
not deliberate introspection.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tether.envs.sandbox_backends import (
    BACKENDS,
    INSTALL_HINT,
    OPT_IN_HINT,
    Backend,
    SandboxUnavailable,
    bwrap_argv,
    configure_sandbox,
    configured_backend,
    find_python,
    make_preexec,
    sweep_uid,
    uid_slot,
    unshare_argv,
    weak_backend_warning,
)

__all__ = ["BACKENDS", "Backend", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "compute_test_count",
           "configure_sandbox", "resolve_backend", "run_python_tests", "run_sandboxed_python"]

log = logging.getLogger(__name__)

Outcome = Literal["ok", "error", "timeout", "killed", "denied"]

MAIN_FILE = ".tether_main.py"  # the program itself; a dot name so `files` rarely collide
_MARK = b"\x1etether-sandbox\x1e"  # written before the program runs: proves the sandbox started


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one execution. Memory is address space (RLIMIT_AS), not RSS."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_mb: int = 512
    file_size_mb: int = 16
    disk_mb: int = 64  # bwrap: the size of each of /work, /tmp and /dev/shm (tmpfs, in memory)
    max_processes: int = 32  # RLIMIT_NPROC: of the execution's own uid (root trainers)
    max_open_files: int = 64
    network: bool = False
    max_output_bytes: int = 64 * 1024  # per stream; the head and the tail are kept

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "file_size_mb", "disk_mb", "max_processes",
                     "max_open_files", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one execution did. `exit_code` is -N when signal N ended it, None when never started."""

    outcome: Outcome
    exit_code: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    backend: Backend
    infra_error: str | None = None  # set: the sandbox failed, not the program — do not score as 0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok" and self.infra_error is None


# --------------------------------------------------------------------------- backend choice

_detect_lock = threading.Lock()
_probed: dict[str, str | None] = {}  # backend -> None (works) or why it does not
_warned: set[str] = set()


def _warn_once(backend: Backend, why: str) -> None:
    """One loud warning per weak backend and process: a weak sandbox must never go unnoticed."""
    if backend not in _warned:
        _warned.add(backend)
        log.warning(weak_backend_warning(backend, why))


def _probe(backend: Backend) -> str | None:
    """Run `print('ok')` under `backend`; None when it works, else the reason it does not."""
    if backend != "rlimits" and shutil.which(backend) is None:  # the launcher is named like the backend
        return f"`{backend}` is not on PATH"
    res = _run("print('ok')", SandboxLimits(wall_seconds=10.0), None, "", backend)
    if res.ok and res.stdout.strip() == "ok":
        return None
    return res.infra_error or f"probe program ended {res.outcome}: {res.stderr.strip()[-300:]}"


def resolve_backend(backend: Backend | None = None) -> Backend:
    """`backend`, else the configured one (`sandbox.backend`, bwrap by default), checked to work.

    bwrap or unshare that cannot run here raise `SandboxUnavailable` naming why and the fix —
    never a silent fallback; a weak backend logs a loud warning, once per process. Probes once
    per process (about 50 ms).
    """
    name = backend or configured_backend()
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; valid: {', '.join(BACKENDS)}")
    with _detect_lock:
        if name not in _probed:
            _probed[name] = _probe(name)
    why = _probed[name]
    if why:
        raise SandboxUnavailable(f"the code sandbox cannot start: backend {name} is unusable here ({why}). "
                                 f"To fix, {INSTALL_HINT}" + (f", {OPT_IN_HINT}" if name == "bwrap" else ""))
    if name != "bwrap":
        _warn_once(name, "forced by the caller" if backend else f"opted in with sandbox.backend={name}")
    return name


def _own_process_count() -> int:
    """Processes of our uid: when we cannot drop privileges they count against NPROC too."""
    n = 0
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # exited while we looked
            n += entry.stat().st_uid == os.getuid()
    return n


_BOOTSTRAP = f"""\
import builtins, os, sys
sys.stdout.buffer.write({_MARK!r}); sys.stdout.flush()
sys.stdout.reconfigure(line_buffering=True)  # a program killed at its time-out still shows its prints
builtins.exit = builtins.quit = sys.exit  # -S skips site.py, which defines them
sys.argv = [{MAIN_FILE!r}]
sys.path.append(os.getcwd())  # last: a workspace `ast.py` must not shadow the stdlib
with open({MAIN_FILE!r}) as f:
    src = f.read()
del f
exec(compile(src, {MAIN_FILE!r}, "exec"), {{"__name__": "__main__", "__file__": {MAIN_FILE!r}}})
"""


def _workspace(code: str, files: dict[str, str] | None) -> dict[str, str]:
    """The program and `files` by relative path; a path that could leave the scratch dir is refused."""
    for rel in files or {}:
        if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"sandbox file path must be relative and inside the scratch dir: {rel!r}")
    return {**(files or {}), MAIN_FILE: code}


def _write_files(scratch: str, workspace: dict[str, str], owner: int | None) -> None:
    """Write the workspace into a host scratch directory (the weak backends), owned by `owner`."""
    for rel, text in workspace.items():
        path = Path(scratch, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if owner is not None:  # the dropped uid must be able to write its own working directory
        for root, dirs, names in os.walk(scratch):
            for name in [*dirs, *names]:
                os.chown(os.path.join(root, name), owner, owner)
        os.chown(scratch, owner, owner)


def _memfds(workspace: dict[str, str]) -> list[tuple[int, str]]:
    """The workspace as in-memory files for bwrap's `--file FD DEST` (nothing touches the host disk)."""
    fds = []
    try:
        for rel, text in workspace.items():
            fd = os.memfd_create("tether-sandbox-file")
            fds.append((fd, rel))
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
            os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        for fd, _ in fds:
            os.close(fd)
        raise
    return fds


class _Capped:
    """Keeps the head and the tail of a stream: a print loop must not fill the host's memory."""

    def __init__(self, cap: int) -> None:
        self.half = cap // 2
        self.head_cap = cap - self.half
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        take = max(0, self.head_cap - len(self.head))
        self.head += data[:take]
        self.tail += data[take:]
        if len(self.tail) > 2 * self.half + 4096:  # trim in batches, not per chunk
            del self.tail[: len(self.tail) - self.half]

    def text(self, strip: bytes = b"") -> str:
        head = self.head[len(strip):] if strip and self.head.startswith(strip) else self.head
        tail = self.tail[-self.half:] if self.half else b""
        dropped = self.total - len(self.head) - len(tail)
        gap = f"\n...[{dropped} bytes truncated]...\n".encode() if dropped > 0 else b""
        return bytes(head + gap + tail).decode("utf-8", errors="replace")


def _pump(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[_Capped, _Capped, bool]:
    """Drain stdout/stderr until both close or the deadline; True if it timed out.

    Once the main process has exited we wait only briefly for the pipes: an orphan (possible
    without a pid namespace) may hold them open forever.
    """
    out, err = _Capped(cap), _Capped(cap)
    sel = selectors.DefaultSelector()
    for stream, buf in ((proc.stdout, out), (proc.stderr, err)):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ, buf)
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return out, err, True
            if exited_at is None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                exited_at = now  # WNOWAIT: leave the status for wait4, which also reports CPU time
            if exited_at is not None and now - exited_at > 0.2:
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
                data = os.read(key.fd, 65536)
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
    return out, err, False


def _drain(proc: subprocess.Popen, out: _Capped, err: _Capped) -> None:
    """After the kill, collect what is still in the pipes: a timed-out program's last prints."""
    for stream, buf in ((proc.stdout, out), (proc.stderr, err)):
        with contextlib.suppress(OSError):  # BlockingIOError: an orphan still holds the pipe
            while data := os.read(stream.fileno(), 65536):
                buf.add(data)


_DENIED = re.compile(r"^(PermissionError|ConnectionRefusedError|socket\.gaierror|\w*Error: \[Errno "
                     r"(1|13|30|101|111|113)\])")
# EAGAIN (NPROC), EMFILE, EFBIG, ENOSPC (a full tmpfs), EDQUOT
_LIMITED = re.compile(r"^(MemoryError|\w*Error: \[Errno (11|24|27|28|122)\])")


def _classify(code: int | None, timed_out: bool, cpu_out: bool, stderr: str) -> tuple[Outcome, int | None]:
    """(outcome, normalised exit code) from how the process ended and its last stderr line."""
    if code is not None and code > 128:  # bwrap reports a signalled child as 128 + N
        code = 128 - code
    if timed_out:
        return "timeout", code
    if code == 0:
        return "ok", 0
    if code is not None and code < 0:
        # RLIMIT_CPU kills with SIGKILL (soft == hard: as pid 1 of its namespace the program would
        # ignore SIGXCPU); the CPU time from wait4 tells that from other kills.
        return ("timeout" if cpu_out or -code == signal.SIGXCPU else "killed"), code
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if _LIMITED.match(last):
        return "killed", code
    if _DENIED.match(last):
        return "denied", code
    return "error", code


# The program sees no host environment variables (tokens, proxies); -I ignores PYTHON* anyway.
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp"}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the execution's process group (the setsid in preexec made proc.pid its id)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(proc.pid, signal.SIGKILL)


def _reap(proc: subprocess.Popen, timeout: float) -> float | None:
    """wait4 the launcher: CPU seconds of it and of what it reaped (the program), None if running."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.001)


def _stop(proc: subprocess.Popen, backend: Backend, force: bool) -> float:
    """End the execution and reap it (sets proc.returncode); returns the CPU seconds it used.

    On a time-out, kill the launcher's children first — the program, pid 1 of its namespace,
    whose death takes every other process there with it — and let bwrap/unshare reap it and exit:
    killing the launcher too would hand the program's zombie to the host's init.
    """
    cpu = None if force else _reap(proc, 1.0)
    if cpu is None and backend != "rlimits":
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            children = []  # no CONFIG_PROC_CHILDREN: the group kill below still stops everything
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
        cpu = _reap(proc, 1.0)
    _kill_group(proc)  # the rest of the group: e.g. background children under `rlimits`
    if cpu is None:  # SIGKILLed above: it is going now
        cpu = _reap(proc, 10.0)
    return cpu or 0.0


# util-linux unshare re-raises the signal that killed its child, which fails for SIGKILL: exit 1 and this.
_UNSHARE_SIGKILL = re.compile(r"^unshare: sigprocmask unblock failed.*\n?\Z", re.M)


def _launch(workspace: dict[str, str], limits: SandboxLimits, stdin: str, backend: Backend, uid: int | None,
            scratch: str) -> subprocess.Popen:
    """Start the execution: bwrap gets the files as memfds, the weak backends a host scratch dir."""
    py = [find_python(), "-I", "-S", "-c", _BOOTSTRAP]
    fds: list[tuple[int, str]] = []
    try:
        if backend == "bwrap":
            fds = _memfds(workspace)
            argv, cwd = [*bwrap_argv(limits, py[0], fds), *py], "/"
        else:
            _write_files(scratch, workspace, uid)
            argv, cwd = ([*unshare_argv(limits), *py] if backend == "unshare" else py), scratch
        with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: no writer to block
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            return subprocess.Popen(argv, cwd=cwd, env=_ENV, stdin=stdin_file, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=[fd for fd, _ in fds],
                                    preexec_fn=make_preexec(limits, uid, _own_process_count))
    finally:
        for fd, _ in fds:
            os.close(fd)


def _run(code: str, limits: SandboxLimits, files: dict[str, str] | None, stdin: str,
         backend: Backend) -> SandboxResult:
    """One execution under `backend`, without backend checks or warnings (see the public API)."""
    t0 = time.monotonic()
    workspace = _workspace(code, files)
    with contextlib.ExitStack() as stack:
        try:  # a full disk, a missing launcher, no free uid: the sandbox's failure, not the program's
            uid = stack.enter_context(uid_slot())
            scratch = "" if backend == "bwrap" else tempfile.mkdtemp(prefix="tether-sandbox-")
            if scratch:
                stack.callback(shutil.rmtree, scratch, ignore_errors=True)
            proc = stack.enter_context(_launch(workspace, limits, stdin, backend, uid, scratch))
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("error", None, "", "", time.monotonic() - t0, backend,
                                 infra_error=f"could not start the {backend} sandbox: {exc}")
        timed_out = True  # if the pump itself fails, stop the program the hard way
        try:
            out, err, timed_out = _pump(proc, t0 + limits.wall_seconds, limits.max_output_bytes)
        finally:
            cpu = _stop(proc, backend, force=timed_out)
            if backend == "rlimits" and uid is not None:
                sweep_uid(uid)  # a daemon that left the process group: its uid gives it away
        _drain(proc, out, err)
        exit_code = proc.returncode
    stdout, stderr = out.text(strip=_MARK), err.text()
    if backend == "unshare" and exit_code == 1 and _UNSHARE_SIGKILL.search(stderr):
        exit_code, stderr = -signal.SIGKILL, _UNSHARE_SIGKILL.sub("", stderr)
    # RLIMIT_CPU's SIGKILL: rusage samples CPU time by ticks and reads low on a busy machine (0.94 s
    # for a 1 s limit measured at load 17), so half the budget tells it from other kills.
    outcome, exit_code = _classify(exit_code, timed_out, cpu >= 0.5 * math.ceil(limits.cpu_seconds), stderr)
    infra = None
    if not out.head.startswith(_MARK):  # the interpreter never reached the program
        infra = (f"the sandbox did not start the program within {limits.wall_seconds:g}s" if timed_out
                 else f"the sandbox failed before the program ran (exit {exit_code}): {stderr.strip()[-500:]}")
    return SandboxResult(outcome, exit_code, stdout, stderr, time.monotonic() - t0, backend, infra)


def run_sandboxed_python(code: str, limits: SandboxLimits | None = None, files: dict[str, str] | None = None,
                         stdin: str = "", backend: Backend | None = None) -> SandboxResult:
    """Run `code` with `python3 -I -S` in fresh files under the sandbox.

    `files` (relative path -> text) are written into the program's working directory first
    (`/work` under bwrap); `stdin` is fed to the program. `backend=None` uses the configured
    backend (`sandbox.backend`, bwrap by default; `resolve_backend`): `SandboxUnavailable` when
    it cannot run here. Never raises for anything the program does: see `SandboxResult`.
    """
    limits = limits or SandboxLimits()
    backend = resolve_backend(backend)
    for delay in _LAUNCH_RETRIES:  # EAGAIN at launch: a non-root trainer's processes share its NPROC
        res = _run(code, limits, files, stdin, backend)
        if "Resource temporarily unavailable" not in (res.infra_error or ""):
            return res
        time.sleep(delay)
    return _run(code, limits, files, stdin, backend)


_LAUNCH_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8)  # seconds between launches that failed with EAGAIN


# --------------------------------------------------------------------------- grading by unit tests

SOLUTION_FILE, TEST_FILE = "solution.py", "test_solution.py"

_RUNNER = Path(__file__).with_name("sandbox_runner.py")  # shipped into the sandbox as source


def compute_test_count(test_code: str) -> int:
    """Tests in `test_code`: top-level `test*` functions and `test*` methods of top-level classes.

    Counted on the host from the pristine source, so a solution that deletes tests at run time
    lowers its own pass count, never the total.
    """
    tree = ast.parse(test_code)
    count = 0
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        count += sum(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
                     for m in members)
    return count


def run_python_tests(solution_code: str, test_code: str, limits: SandboxLimits | None = None,
                     files: dict[str, str] | None = None,
                     backend: Backend | None = None) -> tuple[int, int, SandboxResult]:
    """Grade `solution_code` (as `solution.py`) by the tests in `test_code`: (passed, total, result).

    Tests are pytest-style `test*` functions with plain asserts, or `test*` methods of top-level
    classes (unittest.TestCase or plain); they `from solution import ...`. Every call uses a
    fresh scratch directory and writes the pristine tests last, over any same-named file in
    `files` (the model's workspace). `result.infra_error` set means the grading itself failed
    (sandbox, unparsable or empty tests): mask the sample, do not score it 0 (NeMo-Gym PR#2015).
    """
    limits = limits or SandboxLimits()
    try:
        total = compute_test_count(test_code)
        why = None if total else "the test code defines no test* functions or methods"
    except SyntaxError as exc:
        total, why = 0, f"the test code does not parse: {exc}"
    if why:
        return 0, total, SandboxResult("error", None, "", "", 0.0, resolve_backend(backend), infra_error=why)
    nonce = secrets.token_hex(16)
    workspace = {**(files or {}), SOLUTION_FILE: solution_code, TEST_FILE: test_code}
    res = run_sandboxed_python(_RUNNER.read_text(), limits, workspace, stdin=f"{nonce}\n{TEST_FILE}\n",
                               backend=backend)
    counts = re.findall(rf"^{nonce} (\d+)$", res.stdout, flags=re.M)
    res = dataclasses.replace(res, stdout=re.sub(rf"\n?{nonce} \d+\n", "", res.stdout))
    if res.infra_error:
        return 0, total, res
    if not counts:  # the first report precedes all model code: its absence is the runner's failure
        return 0, total, dataclasses.replace(res, infra_error="the test runner never reported")
    return min(int(counts[-1]), total), total, res
