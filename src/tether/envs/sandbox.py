"""Run model-written Python in a sandbox; grade coding tasks by unit tests (pitfalls.md #18).

    res = run_sandboxed_python("print(sum(range(10)))", SandboxLimits(wall_seconds=5))
    res.outcome, res.stdout          # ("ok", "45\\n")
    passed, total, res = run_python_tests(solution_code, test_code, SandboxLimits())

Never run model code on the training host as the training user (wshobson PR#624). Each
execution gets a fresh scratch directory; with the `bwrap` backend (chosen when it works):
`bwrap --unshare-all` (no network; own pid, ipc, uts namespaces), the host read-only with the
scratch directory as the only writable place (`/work`), a private `/tmp`, `--cap-drop ALL`;
before exec, `setsid`, rlimits (CPU, AS, FSIZE, NPROC, NOFILE, CORE=0) and, when we are root, a
drop to uid/gid 65534 (the kernel does not apply NPROC to root); a wall clock that SIGKILLs the
program, pid 1 of its namespace, whose death takes every descendant with it.

Fallbacks, each announced once by a loud `logging.warning`: `unshare` (user, network and pid
namespaces, but the host filesystem is visible), then `rlimits` (limits and the dropped uid only).

Failures are values (DESIGN.md rule 9): `outcome` is `ok | error | timeout | killed | denied`;
`infra_error` is set when the *sandbox* failed, not the program: mask or retry such a sample,
never score it 0 (NeMo-Gym PR#2015). Known limits: uid 65534 is shared by concurrent executions,
so NPROC is a joint budget (a fork bomb can stop a concurrent execution from starting: the
launch is retried for about a second, then it is an `infra_error`); in-process grading defeats naive tampering, not deliberate introspection.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import math
import os
import re
import resource
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
from typing import Callable, Literal

log = logging.getLogger(__name__)

Outcome = Literal["ok", "error", "timeout", "killed", "denied"]
Backend = Literal["bwrap", "unshare", "rlimits"]
BACKENDS: tuple[Backend, ...] = ("bwrap", "unshare", "rlimits")  # strongest first

SANDBOX_UID = SANDBOX_GID = 65534  # nobody/nogroup: owns nothing on the host
MAIN_FILE = ".tether_main.py"  # the program itself; a dot name so `files` rarely collide
_MARK = b"\x1etether-sandbox\x1e"  # written before the program runs: proves the sandbox started
_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")  # world-readable system pythons
_INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: `dnf install bubblewrap`)"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one execution. Memory is address space (RLIMIT_AS), not RSS."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 32  # RLIMIT_NPROC of the sandbox uid, shared by concurrent executions
    max_open_files: int = 64
    network: bool = False
    max_output_bytes: int = 64 * 1024  # per stream; the head and the tail are kept

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "file_size_mb", "max_processes",
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


# --------------------------------------------------------------------------- backend detection

_detect_lock = threading.Lock()
_probed: dict[str, str | None] = {}  # backend -> None (works) or why it does not
_warned: set[str] = set()


def _warn_once(backend: Backend, why: str) -> None:
    """One loud warning per backend and process: a weak sandbox must never go unnoticed."""
    if backend in _warned:
        return
    _warned.add(backend)
    what = {"unshare": "namespaces without filesystem isolation: the code can read the host "
                       "filesystem and write wherever uid 65534 may",
            "rlimits": "resource limits and a dropped uid ONLY: the code can use the network and "
                       "read the host filesystem"}[backend]
    log.warning("SANDBOX IS WEAK: model-written code runs with backend %r (%s). Why: %s. To fix, %s.",
                backend, what, why, _INSTALL_HINT)


def _probe(backend: Backend) -> str | None:
    """Run `print('ok')` under `backend`; None when it works, else the reason it does not."""
    if backend != "rlimits" and shutil.which(backend) is None:  # the launcher is named like the backend
        return f"`{backend}` is not on PATH"
    res = _run("print('ok')", SandboxLimits(wall_seconds=10.0), None, "", backend)
    if res.ok and res.stdout.strip() == "ok":
        return None
    return res.infra_error or f"probe program ended {res.outcome}: {res.stderr.strip()[-300:]}"


def detect_sandbox_backend(refresh: bool = False) -> Backend:
    """The strongest backend that works here: bwrap, else `unshare -rn` + rlimits, else rlimits.

    Probes once per process (about 50 ms each) and warns loudly, once, when it settles on a
    fallback, naming what is missing and how to install bubblewrap.
    """
    with _detect_lock:
        if refresh:
            _probed.clear()
            _warned.clear()
        reasons = []
        for backend in BACKENDS[:-1]:
            if backend not in _probed:
                _probed[backend] = _probe(backend)
            if _probed[backend] is None:
                if backend != "bwrap":
                    _warn_once(backend, "; ".join(reasons))
                return backend
            reasons.append(f"{backend}: {_probed[backend]}")
        _warn_once("rlimits", "; ".join(reasons))
        return "rlimits"


def _find_python() -> str:
    """A system interpreter the dropped uid can execute (a venv under /root would be unreadable)."""
    return next((p for p in _PYTHONS if os.access(p, os.X_OK)), shutil.which("python3") or "python3")


def _build_command(backend: Backend, scratch: str, limits: SandboxLimits) -> tuple[list[str], str]:
    """(argv, cwd) for the backend; the program is MAIN_FILE run by the bootstrap below."""
    py = [_find_python(), "-I", "-S", "-c", _BOOTSTRAP]
    if backend == "bwrap":
        net = ["--share-net"] if limits.network else []
        # --as-pid-1: without it bwrap's own init exits after the monitor, which leaves a zombie
        # of uid 65534 to the host's init; until that reaps it (late, in containers), it counts
        # against NPROC and executions start failing with EAGAIN.
        return ["bwrap", "--unshare-all", *net, "--as-pid-1", "--die-with-parent", "--new-session",
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--bind", scratch, "/work", "--chdir", "/work", "--cap-drop", "ALL", *py], scratch
    if backend == "unshare":
        # --pid --fork --kill-child: descendants die with us, as with bwrap's pid namespace.
        net = [] if limits.network else ["--net"]
        return ["unshare", "--user", "--map-root-user", *net, "--pid", "--fork", "--kill-child",
                "--", *py], scratch
    return py, scratch


def _own_process_count() -> int:
    """Processes of our uid: when we cannot drop privileges they count against NPROC too."""
    n = 0
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # exited while we looked
            n += entry.stat().st_uid == os.getuid()
    return n


def _make_preexec(limits: SandboxLimits) -> Callable[[], None]:
    """The child-side set-up: new session, rlimits, then (as root) drop to uid/gid 65534.

    Everything is computed here, in the parent: after fork only plain system calls run, which
    keeps the documented preexec_fn/threads hazard (a lock held by another thread) out of reach.
    """
    mb = 1024 * 1024
    cpu = math.ceil(limits.cpu_seconds)
    drop = os.geteuid() == 0
    # NPROC counts every process of the real uid; unprivileged, our own processes count too.
    nproc = limits.max_processes + (0 if drop else _own_process_count())
    wanted = [(resource.RLIMIT_CPU, cpu, cpu),  # SIGKILL at the limit (pid 1 would ignore SIGXCPU)
              (resource.RLIMIT_AS, limits.memory_mb * mb, limits.memory_mb * mb),
              (resource.RLIMIT_FSIZE, limits.file_size_mb * mb, limits.file_size_mb * mb),
              (resource.RLIMIT_NPROC, nproc, nproc),
              (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
              (resource.RLIMIT_CORE, 0, 0)]
    rlimits = []
    for res, soft, hard in wanted:  # never above the current hard limit (unprivileged callers)
        cur_hard = resource.getrlimit(res)[1]
        cap = hard if cur_hard == resource.RLIM_INFINITY or drop else min(hard, cur_hard)
        rlimits.append((res, min(soft, cap), cap))

    def preexec() -> None:
        os.setsid()
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))
        if drop:  # groups first: after setuid we could no longer change them
            os.setgroups([])
            os.setgid(SANDBOX_GID)
            os.setuid(SANDBOX_UID)

    return preexec


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


def _write_files(scratch: str, code: str, files: dict[str, str] | None, owner: int | None) -> None:
    """Write the program and `files` (relative paths only) into the scratch directory."""
    for rel, text in {**(files or {}), MAIN_FILE: code}.items():
        path = Path(scratch, rel)
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not rel:
            raise ValueError(f"sandbox file path must be relative and inside the scratch dir: {rel!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if owner is not None:  # the dropped uid must be able to write its own working directory
        for root, dirs, names in os.walk(scratch):
            for name in [*dirs, *names]:
                os.chown(os.path.join(root, name), owner, owner)
        os.chown(scratch, owner, owner)


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
_LIMITED = re.compile(r"^(MemoryError|\w*Error: \[Errno (11|24|27)\])")  # EAGAIN (NPROC), EMFILE, EFBIG


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


def _run(code: str, limits: SandboxLimits, files: dict[str, str] | None, stdin: str,
         backend: Backend) -> SandboxResult:
    """One execution under `backend`, without backend detection or warnings (see the public API)."""
    t0 = time.monotonic()
    scratch = ""
    try:
        try:  # a full disk or a missing launcher is the sandbox's failure, not the program's
            scratch = tempfile.mkdtemp(prefix="tether-sandbox-")
            _write_files(scratch, code, files, SANDBOX_UID if os.geteuid() == 0 else None)
            argv, cwd = _build_command(backend, scratch, limits)
            with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: no writer to block
                stdin_file.write(stdin.encode())
                stdin_file.seek(0)
                proc = subprocess.Popen(argv, cwd=cwd, env=_ENV, stdin=stdin_file, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, preexec_fn=_make_preexec(limits))
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("error", None, "", "", time.monotonic() - t0, backend,
                                 infra_error=f"could not start the {backend} sandbox: {exc}")
        with proc:
            timed_out = True  # if the pump itself fails, stop the program the hard way
            try:
                out, err, timed_out = _pump(proc, t0 + limits.wall_seconds, limits.max_output_bytes)
            finally:
                cpu = _stop(proc, backend, force=timed_out)
            _drain(proc, out, err)
            exit_code = proc.returncode
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    stdout, stderr = out.text(strip=_MARK), err.text()
    outcome, exit_code = _classify(exit_code, timed_out, cpu >= math.ceil(limits.cpu_seconds) - 0.05, stderr)
    infra = None
    if not out.head.startswith(_MARK):  # the interpreter never reached the program
        infra = (f"the sandbox did not start the program within {limits.wall_seconds:g}s" if timed_out
                 else f"the sandbox failed before the program ran (exit {exit_code}): {stderr.strip()[-500:]}")
    return SandboxResult(outcome, exit_code, stdout, stderr, time.monotonic() - t0, backend, infra)


def run_sandboxed_python(code: str, limits: SandboxLimits | None = None, files: dict[str, str] | None = None,
                         stdin: str = "", backend: Backend | None = None) -> SandboxResult:
    """Run `code` with `python3 -I -S` in a fresh scratch directory under the sandbox.

    `files` (relative path -> text) are written into the scratch directory first (the program's
    working directory, `/work` under bwrap); `stdin` is fed to the program. `backend=None`
    picks the strongest working one (`detect_sandbox_backend`); forcing a weaker one logs the
    same loud warning. Never raises for anything the program does: see `SandboxResult`.
    """
    limits = limits or SandboxLimits()
    if backend is None:
        backend = detect_sandbox_backend()
    elif backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; valid: {', '.join(BACKENDS)}")
    elif backend != "bwrap":
        _warn_once(backend, "forced by the caller (backend=...)")
    for delay in _LAUNCH_RETRIES:  # EAGAIN at launch: a concurrent execution holds uid 65534's NPROC
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
        return 0, total, SandboxResult("error", None, "", "", 0.0, backend or detect_sandbox_backend(), infra_error=why)
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
