"""Helpers of the sandbox tests: a "trainer" process that runs sandboxed programs as a chosen uid,
the hostile programs, and host-side checks (processes left behind).

`run_as_trainer` copies the sandbox modules (stdlib only) into a world-readable directory and runs
them with the system python in a new session, as root or as a non-root uid (setuid in preexec
when the tests run as root): the trainer a hostile program attacks is that process, not pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tether.envs import sandbox
from tether.envs.sandbox_backends import find_python

SRC = Path(sandbox.__file__).parent
NOBODY = 65534

_DRIVER = """\
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # -I leaves the script's dir out
from tether.envs.sandbox import SandboxLimits, run_sandboxed_python
jobs = json.loads(open(sys.argv[1]).read())
for job in jobs:
    code = job["code"].replace("TRAINER_PID", str(os.getpid())).replace("TRAINER_PGID", str(os.getpgrp()))
    res = run_sandboxed_python(code, SandboxLimits(**job["limits"]), job.get("files"), backend=job["backend"])
    print(json.dumps({"outcome": res.outcome, "stdout": res.stdout, "stderr": res.stderr,
                      "infra_error": res.infra_error, "exit_code": res.exit_code, "wall": res.wall_seconds}), flush=True)
print("TRAINER-ALIVE", flush=True)
"""


class Trainer:
    """A world-readable copy of the sandbox package and a driver, for trainer processes of any uid."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tether-sandbox-trainer-", dir="/tmp"))
        pkg = self.root / "tether" / "envs"
        pkg.mkdir(parents=True)
        (self.root / "tether" / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        for name in ("sandbox.py", "sandbox_backends.py", "sandbox_runner.py"):
            shutil.copy(SRC / name, pkg / name)
        (self.root / "driver.py").write_text(_DRIVER)
        self.run_dir = self.root / "run"  # the trainer's run directory: its cwd, world-readable files
        self.run_dir.mkdir()
        (self.run_dir / "metrics.jsonl").write_text('{"step": 0, "secret": "RUN-DIR-SECRET"}\n')
        for path in [self.root, *self.root.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        self.run_dir.chmod(0o777)

    def run(self, uid: int | None, jobs: list[dict[str, Any]], env: dict[str, str] | None = None,
            timeout: float = 120.0) -> tuple[list[dict[str, Any]], bool, subprocess.CompletedProcess]:
        """Run `jobs` in a trainer process (as `uid`; None: ours); (results, survived, process)."""
        jobs_file = self.root / f"jobs-{time.time_ns()}.json"
        jobs_file.write_text(json.dumps(jobs))
        jobs_file.chmod(0o644)

        def drop() -> None:
            if uid is not None and uid != os.geteuid():
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        proc = subprocess.run([find_python(), "-I", str(self.root / "driver.py"), str(jobs_file)],
                              cwd=self.run_dir, capture_output=True, text=True, timeout=timeout, start_new_session=True,
                              env={"PATH": "/usr/bin:/bin", **(env or {})},
                              preexec_fn=drop)
        lines = proc.stdout.splitlines()
        results = [json.loads(line) for line in lines if line.startswith("{")]
        return results, "TRAINER-ALIVE" in lines and proc.returncode == 0, proc

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def live_processes_with(token: str) -> list[int]:
    """Host pids whose command line contains `token` (every pid namespace is visible from here)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def host_uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_until_gone(token: str, seconds: float = 10.0) -> list[int]:
    """Processes with `token` still alive after up to `seconds` (a killed pid namespace dies asynchronously)."""
    deadline = time.monotonic() + seconds
    while (left := live_processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def daemon_code(token: str) -> str:
    """Double fork + setsid: a `sleep` that left the process group and the session."""
    return (f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '1000.{token}'])\n    os._exit(0)\n")


def escape_code(paths_to_read: list[str], paths_to_write: list[str], port: int, secret_env: str) -> str:
    """One program that tries every escape and prints what it got, as JSON on its last line."""
    return f"""\
import json, os, socket
got = {{"read": {{}}, "wrote": [], "env": sorted(os.environ), "listing": {{}}}}
for path in {paths_to_read!r}:
    try:
        got["read"][path] = open(path).read()
    except OSError as exc:
        got["read"][path] = type(exc).__name__
for path in {paths_to_write!r}:
    try:
        open(path, "w").write("pwned")
        got["wrote"].append(path)
    except OSError:
        pass
for d in ("/", "/home", "/root", "/etc"):
    try:
        got["listing"][d] = sorted(os.listdir(d))
    except OSError as exc:
        got["listing"][d] = type(exc).__name__
got["env_leak"] = {secret_env!r} in json.dumps(dict(os.environ))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    got["connected"] = True
except OSError as exc:
    got["connected"] = type(exc).__name__
print(json.dumps(got))
"""


# EVERYONE: -1 (every process the program may signal) where a pid namespace confines it; the
# test leaves it out under `rlimits`, where only the uid drop stands between it and the machine.
ATTACK_CODE = """\
import os, signal
for target in (TRAINER_PID, -TRAINER_PGID, PYTEST_PID, EVERYONE):
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
        try:
            os.kill(target, sig)
        except OSError:
            pass
print("attacked")
"""
