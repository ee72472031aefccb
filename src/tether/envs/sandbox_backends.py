"""How `tether.envs.sandbox` launches a program: backend choice, the bwrap mount plan, uids (stdlib only).

Backends, strongest first (the gaps are what `weak_backend_warning` says out loud):

- `bwrap` (the default, and the only one used unless the user opts out): bubblewrap with new
  user, pid, mount, ipc, uts, cgroup and network namespaces. Nothing of the host is mounted but
  what the interpreter needs, read-only (`/usr/bin`, `/usr/lib*`, `/usr/local/{bin,lib}`, the
  interpreter's own prefix, `/etc/ld.so.cache`; `/bin`, `/lib*` as on the host); `/work` (the
  program's files), `/tmp` and `/dev/shm` are fresh size-capped tmpfs mounts that vanish with it;
  `/dev` holds only null/zero/random/tty nodes and is read-only. The user's home, the trainer's
  run directory, /root and /etc are simply not there.
- `unshare` (opt-in): `unshare --user --map-root-user --net --pid --fork --kill-child`.
- `rlimits` (opt-in): resource limits, a new session and (as root) a dropped uid only.

Every backend: `setsid`, rlimits (CPU, AS, FSIZE, NPROC, NOFILE, CORE=0) in the child before
exec, a clean environment, and — when the trainer is root — a drop to a uid of its own from a
pool of uids that own nothing on the host (`uid_slot`): concurrent executions never share a
uid, so RLIMIT_NPROC is a per-execution budget and a finished execution's stragglers can be
killed by uid (`sweep_uid`). A non-root trainer cannot change uid; under bwrap the program then
runs in its own user namespace (uid 65534 inside, no capabilities over the trainer's namespace)
and its own pid namespace, where the trainer's processes do not exist.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import pwd
import resource
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

Backend = Literal["bwrap", "unshare", "rlimits"]
BACKENDS: tuple[Backend, ...] = ("bwrap", "unshare", "rlimits")  # strongest first
ENV_VAR = "TETHER_SANDBOX_BACKEND"  # the opt-in; set by `configure_sandbox` (config key sandbox.backend)
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`)"
OPT_IN_HINT = "or opt in to a weaker backend with sandbox.backend=unshare|rlimits (docs/agentic.md#the-code-sandbox)"

# What each weak backend does NOT protect; the warning quotes it (tests check every item).
GAPS: dict[str, tuple[str, ...]] = {
    "unshare": ("the host filesystem is readable (the user's home, the trainer's files)",
                "host /tmp and /dev/shm are writable (no fresh /tmp, /dev/shm)",
                "disk fill of the host (only the per-file size limit applies)"),
    "rlimits": ("the host filesystem is readable (the user's home, the trainer's files)",
                "host /tmp and /dev/shm are writable (no fresh /tmp, /dev/shm)",
                "disk fill of the host (only the per-file size limit applies)",
                "network: the program can connect to loopback and other services",
                "processes left behind: a daemonized child survives unless the trainer is root",
                "the trainer can be killed from inside unless the trainer is root"),
}

NOBODY = 65534
UID_SLOTS = 256  # concurrent executions per host, as root
_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")  # world-readable system pythons
MB = 1024 * 1024


class SandboxUnavailable(RuntimeError):
    """The configured backend cannot run here; the message says how to fix it."""


def configure_sandbox(backend: str | None) -> None:
    """Make `backend` the process-wide sandbox (config key `sandbox.backend`; None: leave it as is).

    An environment variable, so that worker processes started afterwards inherit the choice."""
    if backend is None:
        return
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; valid: {', '.join(BACKENDS)}")
    os.environ[ENV_VAR] = backend


def configured_backend() -> Backend:
    """The backend the user chose: $TETHER_SANDBOX_BACKEND (set by `configure_sandbox`), else bwrap."""
    name = os.environ.get(ENV_VAR, "").strip() or "bwrap"
    if name not in BACKENDS:
        raise SandboxUnavailable(f"{ENV_VAR}={name!r} is not a sandbox backend; valid: {', '.join(BACKENDS)}")
    return name  # type: ignore[return-value]


def weak_backend_warning(backend: Backend, why: str) -> str:
    """The loud message for an opted-in weak backend: what it does not protect, and the fix."""
    gaps = "; ".join(GAPS[backend])
    return (f"SANDBOX IS WEAK: model-written code runs with backend {backend!r} ({why}). It does NOT "
            f"protect against: {gaps}. To fix, {INSTALL_HINT} and use sandbox.backend=bwrap.")


def find_python() -> str:
    """A system interpreter the dropped uid can execute (a venv under /root would be unreadable)."""
    return next((p for p in _PYTHONS if os.access(p, os.X_OK)), shutil.which("python3") or "python3")


# --------------------------------------------------------------------------- uids (root trainers)


@lru_cache(maxsize=1)
def _pool_uids() -> tuple[int, ...]:
    """UID_SLOTS uids at the top of this user namespace's range (below 2**31: bwrap's limit)
    that no account uses: they own no file on the host."""
    top = NOBODY
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, _, count = (int(x) for x in line.split())
            top = max(top, min(inside + count - 1, 2**31 - 2))
    uids = []
    for uid in range(top, 0, -1):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid != NOBODY:
                uids.append(uid)
        if len(uids) == UID_SLOTS:
            break
    return tuple(uids)


def _lock_dir() -> Path:
    path = Path("/run/tether-sandbox") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir(), "tether-sandbox-uids")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def uid_slot(wait_seconds: float = 10.0) -> Iterator[int | None]:
    """A uid no other execution on this host holds (flock per slot, across processes), or None
    when the trainer is not root (it cannot change uid: the user namespace separates instead)."""
    if os.geteuid() != 0:
        yield None
        return
    lock_dir, deadline = _lock_dir(), time.monotonic() + wait_seconds
    while True:
        for uid in _pool_uids():
            fd = os.open(lock_dir / f"uid-{uid}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # releases the lock
            return
        if time.monotonic() > deadline:
            raise OSError(f"all {UID_SLOTS} sandbox uids are busy")
        time.sleep(0.02)


def sweep_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a daemon that left the process group): kill(-1) from that uid.

    Only ever for a pool uid: kill(-1) from the trainer's own uid would kill the trainer (and, as
    root, everything). If the drop to `uid` fails, the child never execs, so nothing is signalled."""
    if uid not in _pool_uids():
        raise ValueError(f"refusing to sweep uid {uid}: not a sandbox pool uid")

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            os._exit(1)

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([find_python(), "-I", "-S", "-c", "import os; os.kill(-1, 9)"], env={}, timeout=10,
                       preexec_fn=drop)  # noqa: PLW1509


# --------------------------------------------------------------------------- launching


def make_preexec(limits: Any, uid: int | None, own_processes: Callable[[], int]) -> Callable[[], None]:
    """The child-side set-up: new session, rlimits, then (root) the drop to `uid`.

    Everything is computed here, in the parent: after fork only plain system calls run, which
    keeps the documented preexec_fn/threads hazard (a lock held by another thread) out of reach.
    """
    cpu = math.ceil(limits.cpu_seconds)
    # NPROC counts every process of the real uid: unprivileged, the trainer's own processes count too.
    nproc = limits.max_processes + (0 if uid is not None else own_processes())
    wanted = [(resource.RLIMIT_CPU, cpu),  # SIGKILL at the limit (pid 1 would ignore SIGXCPU)
              (resource.RLIMIT_AS, limits.memory_mb * MB),
              (resource.RLIMIT_FSIZE, limits.file_size_mb * MB),
              (resource.RLIMIT_NPROC, nproc),
              (resource.RLIMIT_NOFILE, limits.max_open_files),
              (resource.RLIMIT_CORE, 0)]
    rlimits = []
    for res, value in wanted:  # never above the current hard limit (unprivileged callers)
        cur_hard = resource.getrlimit(res)[1]
        cap = value if cur_hard == resource.RLIM_INFINITY or uid is not None else min(value, cur_hard)
        rlimits.append((res, cap))

    def preexec() -> None:
        os.setsid()
        for res, value in rlimits:
            resource.setrlimit(res, (value, value))
        if uid is not None:  # groups first: after setuid we could no longer change them
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return preexec


@lru_cache(maxsize=4)
def _system_mounts(python: str) -> tuple[str, ...]:
    """Read-only mounts for the interpreter and its libraries, nothing else of the host."""
    args: list[str] = []
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged /usr: symlinks; else the dirs
        host = Path("/", top)
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir() and top != "sbin":
            args += ["--ro-bind", str(host), str(host)]
    dirs = ["/usr/bin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/local/bin", "/usr/local/lib"]
    prefix = Path(os.path.realpath(python)).parents[1]  # e.g. /opt/python3.11 for /opt/python3.11/bin/python3
    dirs += [str(prefix / "bin"), str(prefix / "lib")]
    for d in dict.fromkeys(dirs):
        if Path(d).is_dir() and not Path(d).is_symlink():
            args += ["--ro-bind", d, d]
    return (*args, "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache")


def bwrap_argv(limits: Any, python: str, files: list[tuple[int, str]]) -> list[str]:
    """bwrap's command line; `files` are (fd, path in /work) copied into the fresh /work tmpfs."""
    size = str(limits.disk_mb * MB)
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY),
            *(["--share-net"] if limits.network else []),
            # --as-pid-1: without it bwrap's own init exits after the monitor, which leaves a zombie
            # to the host's init; until that reaps it (late, in containers), it counts against NPROC.
            "--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            *_system_mounts(python),
            "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--proc", "/proc",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work"]
    for fd, rel in files:
        argv += ["--file", str(fd), f"/work/{rel}"]
    return [*argv, "--remount-ro", "/", "--chdir", "/work"]  # the root tmpfs: no writable place but the three


def unshare_argv(limits: Any) -> list[str]:
    """--pid --fork --kill-child: descendants die with the program, as with bwrap's pid namespace."""
    return ["unshare", "--user", "--map-root-user", *([] if limits.network else ["--net"]),
            "--pid", "--fork", "--kill-child", "--"]
