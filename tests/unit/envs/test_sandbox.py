"""Hostile programs in the sandbox: each is contained, tagged with the right outcome, and the
next execution still works (issue 3 item 5, pitfalls.md #18).

Tests that need bubblewrap skip when it is missing; tests that rely on the drop to uid 65534
(fork bomb, root-only files) skip when not run as root. The rlimits-fallback tests always run.
Network isolation is only ever tested against a listener the test opens on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tether.envs import sandbox
from tether.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    detect_sandbox_backend,
    run_python_tests,
    run_sandboxed_python,
)

# No two of these run at once (any worker): uid 65534's NPROC budget is shared by concurrent executions.
pytestmark = pytest.mark.exclusive("sandbox")

HAVE_BWRAP = sandbox._probe("bwrap") is None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=f"bubblewrap unusable here ({sandbox._probe('bwrap')}); "
                                 "install it with `apt-get install -y bubblewrap` (make test tries to)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the drop to uid 65534 (and NPROC) needs root")

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=256, file_size_mb=4, max_processes=16,
                     max_open_files=64)


def assert_still_works(backend: str) -> None:
    """The execution after a hostile one is unaffected."""
    res = run_sandboxed_python("print(6 * 7)", FAST, backend=backend)
    assert (res.outcome, res.stdout, res.infra_error) == ("ok", "42\n", None), res


def live_processes_with(token: str) -> list[int]:
    """Host pids whose command line contains `token` (the sandbox's pid namespace is visible here)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


# --------------------------------------------------------------------------- basics (bwrap)


@needs_bwrap
def test_ok_program_stdin_files_and_workdir():
    res = run_sandboxed_python("import os, sys\nprint(open('data/in.txt').read(), sys.stdin.read(), os.getcwd())",
                               FAST, files={"data/in.txt": "from-file"}, stdin="from-stdin", backend="bwrap")
    assert res == SandboxResult("ok", 0, "from-file from-stdin /work\n", "", res.wall_seconds, "bwrap")
    assert detect_sandbox_backend() == "bwrap"


@needs_bwrap
def test_exit_codes_errors_and_output_truncation():
    res = run_sandboxed_python("exit(3)", FAST, backend="bwrap")
    assert (res.outcome, res.exit_code) == ("error", 3)
    res = run_sandboxed_python("1/0", FAST, backend="bwrap")
    assert res.outcome == "error" and res.stderr.strip().endswith("ZeroDivisionError: division by zero")
    # A print loop cannot fill the host's memory: head and tail are kept, the middle is dropped.
    res = run_sandboxed_python("print('start'); print('x' * 5_000_000); print('end')",
                               SandboxLimits(max_output_bytes=1000), backend="bwrap")
    assert res.outcome == "ok" and res.stdout.startswith("start\n") and res.stdout.endswith("end\n")
    assert len(res.stdout) < 1100 and "bytes truncated" in res.stdout


# --------------------------------------------------------------------------- hostile programs (bwrap)


@needs_bwrap
def test_endless_loop_hits_cpu_limit_and_sleeper_hits_wall_clock():
    res = run_sandboxed_python("while True: pass", SandboxLimits(cpu_seconds=1, wall_seconds=5), backend="bwrap")
    assert res.outcome == "timeout" and res.exit_code == -9  # RLIMIT_CPU's SIGKILL, told apart by rusage
    assert res.wall_seconds < 4
    t0 = time.monotonic()
    res = run_sandboxed_python("import time\nprint('started')\ntime.sleep(60)", SandboxLimits(wall_seconds=1),
                               backend="bwrap")
    assert res.outcome == "timeout" and time.monotonic() - t0 < 3 and res.infra_error is None
    assert res.stdout == "started\n"  # what it printed before the kill is kept
    assert_still_works("bwrap")


@needs_bwrap
@needs_root
def test_fork_bomb_is_capped_by_nproc_and_host_stays_responsive():
    token = f"bomb{uuid.uuid4().hex}"
    bomb = ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    code = (f"import os, sys\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            f"            os.execv(sys.executable, [sys.executable, '-S', '-c', {bomb!r}, {token!r}])\n"
            f"    except OSError:\n        pass\n")
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=2, max_processes=16)
    box: list[SandboxResult] = []
    worker = threading.Thread(target=lambda: box.append(run_sandboxed_python(code, limits, backend="bwrap")))
    worker.start()
    peak, host_latency = 0, []
    while worker.is_alive():
        peak = max(peak, len(live_processes_with(token)))
        t0 = time.monotonic()
        subprocess.run(["true"], check=True)  # the host can still start processes
        host_latency.append(time.monotonic() - t0)
        time.sleep(0.05)
    worker.join()
    assert box[0].outcome in ("timeout", "killed") and box[0].infra_error is None
    assert 0 < peak <= limits.max_processes, peak
    assert max(host_latency) < 1.0
    time.sleep(0.1)
    assert live_processes_with(token) == []  # the pid namespace took every bomb process with it
    assert_still_works("bwrap")


@needs_bwrap
def test_memory_bomb_is_killed():
    res = run_sandboxed_python("chunks = []\nwhile True:\n    chunks.append(b'x' * 10_000_000)",
                               SandboxLimits(memory_mb=200), backend="bwrap")
    assert res.outcome == "killed" and res.stderr.strip().endswith("MemoryError")
    assert_still_works("bwrap")


@needs_bwrap
def test_huge_file_is_cut_at_fsize():
    code = ("import os\ntry:\n    with open('big', 'wb') as f:\n        while True:\n            f.write(b'x' * 1_000_000)\n"
            "finally:\n    print(os.path.getsize('big'))")
    res = run_sandboxed_python(code, SandboxLimits(file_size_mb=4), backend="bwrap")
    assert res.outcome == "killed" and "File too large" in res.stderr
    assert int(res.stdout) == 4 * 1024 * 1024
    assert_still_works("bwrap")


@needs_bwrap
def test_writes_outside_scratch_are_denied_or_invisible_on_host():
    name = f"tether-sandbox-escape-{uuid.uuid4().hex}"
    targets = [f"/etc/{name}", f"/var/tmp/{name}", f"/root/{name}", f"/tmp/{name}", f"/dev/shm/{name}",
               f"{Path.cwd()}/{name}"]
    code = (f"results = []\nfor path in {targets!r}:\n    try:\n        open(path, 'w').write('pwned')\n"
            f"        results.append('wrote')\n    except OSError as exc:\n        results.append(type(exc).__name__)\n"
            f"print(results)\nopen({targets[0]!r}, 'w')\n")
    res = run_sandboxed_python(code, FAST, backend="bwrap")
    assert res.outcome == "denied", res
    for path in targets:
        assert not os.path.exists(path), f"{path} escaped the sandbox"
    assert_still_works("bwrap")


@needs_bwrap
@needs_root
def test_planted_files_outside_the_sandbox_cannot_be_read(tmp_path):
    secret = f"secret-{uuid.uuid4().hex}"
    in_tmp = tmp_path / "planted.txt"  # host /tmp: hidden by the sandbox's private /tmp
    in_tmp.write_text(secret)
    root_dir = Path(tempfile.mkdtemp(prefix="tether-sandbox-test-", dir="/root"))
    in_root = root_dir / "planted.txt"  # elsewhere: root-owned, mode 600
    in_root.write_text(secret)
    os.chmod(in_root, 0o600)
    try:
        code = (f"for path in {[str(in_tmp), str(in_root)]!r}:\n    try:\n        print(open(path).read())\n"
                f"    except OSError as exc:\n        print(type(exc).__name__)\nopen({str(in_root)!r}).read()\n")
        res = run_sandboxed_python(code, FAST, backend="bwrap")
    finally:
        in_root.unlink()
        root_dir.rmdir()
    assert secret not in res.stdout + res.stderr
    assert res.stdout.split() == ["FileNotFoundError", "PermissionError"]
    assert res.outcome == "denied"
    assert_still_works("bwrap")


@needs_bwrap
def test_connecting_to_a_host_loopback_listener_fails():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        res = run_sandboxed_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                                   FAST, backend="bwrap")
        assert res.outcome == "denied" and "ConnectionRefusedError" in res.stderr, res
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host's listener
    assert_still_works("bwrap")


@needs_bwrap
@needs_root
def test_shell_commands_run_confined_and_die_with_the_execution():
    token = f"{time.time_ns() % 10**9}"  # a unique sleep length that marks the orphan
    code = ("import os, subprocess\n"
            "print(subprocess.run(['sh', '-c', 'id -u'], capture_output=True, text=True).stdout.strip())\n"
            "print(os.system('echo pwned > /etc/tether-sandbox-shell 2>/dev/null') != 0)\n"
            f"os.system('setsid nohup sleep 1000.{token} >/dev/null 2>&1 &')\n")
    res = run_sandboxed_python(code, FAST, backend="bwrap")
    assert (res.outcome, res.stdout.split()) == ("ok", ["65534", "True"]), res
    assert not os.path.exists("/etc/tether-sandbox-shell")
    time.sleep(0.1)
    assert live_processes_with(f"1000.{token}") == []  # even a setsid'd orphan died with the pid namespace
    assert_still_works("bwrap")


# --------------------------------------------------------------------------- grading by unit tests

TESTS = """\
from solution import add

def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-1, -2) == -3

class TestMore:
    def test_zero(self):
        assert add(0, 0) == 0
"""


@pytest.mark.parametrize("backend", ["rlimits", pytest.param("bwrap", marks=needs_bwrap)])
def test_grading_counts_passes_and_partial_credit(backend):
    passed, total, res = run_python_tests("def add(a, b):\n    return a + b", TESTS, FAST, backend=backend)
    assert (passed, total) == (3, 3), res
    passed, total, res = run_python_tests("def add(a, b):\n    return abs(a) + abs(b)", TESTS, FAST, backend=backend)
    assert (passed, total, res.outcome, res.infra_error) == (2, 3, "error", None)
    assert "FAILED test_negative" in res.stderr
    unittest_tests = ("import unittest\nfrom solution import add\nclass T(unittest.TestCase):\n"
                      "    def test_a(self):\n        self.assertEqual(add(1, 1), 2)\n"
                      "    def test_b(self):\n        self.assertEqual(add(1, 1), 3)\n")
    assert run_python_tests("def add(a, b):\n    return a + b", unittest_tests, FAST, backend=backend)[:2] == (1, 2)


@pytest.mark.parametrize("backend", ["rlimits", pytest.param("bwrap", marks=needs_bwrap)])
def test_grading_ignores_tampered_tests(backend):
    """daydream#452: a solution that rewrites the tests, or a workspace that ships its own."""
    tamper = ("open('test_solution.py', 'w').write('def test_small():\\n    pass\\n')\n"
              "def add(a, b):\n    return 0\n")
    passed, total, res = run_python_tests(tamper, TESTS, FAST, backend=backend)
    assert (passed, total) == (1, 3) and res.infra_error is None, res  # only add(0, 0) == 0 holds
    workspace = {"test_solution.py": "def test_fake():\n    pass\n"}
    assert run_python_tests("def add(a, b):\n    return 0", TESTS, FAST, files=workspace, backend=backend)[:2] == (1, 3)
    # A workspace module that shadows the stdlib the runner and unittest use is never imported.
    shadow = {name: "raise SystemExit('hijacked')\n" for name in ("ast.py", "traceback.py", "unittest.py")}
    assert run_python_tests("def add(a, b):\n    return 0", TESTS, FAST, files=shadow, backend=backend)[:2] == (1, 3)
    # Deleting tests at import time lowers the pass count, never the total (counted on the host).
    assert run_python_tests("import sys\nsys.exit(0)", TESTS, FAST, backend=backend)[:2] == (0, 3)


def test_grading_tells_infrastructure_failure_from_a_real_zero(monkeypatch):
    """NeMo-Gym PR#2015: a broken sandbox must not look like a wrong answer."""
    passed, total, res = run_python_tests("raise ImportError('nope')", TESTS, FAST, backend="rlimits")
    assert (passed, total, res.infra_error) == (0, 3, None)  # the model's fault: a real 0
    passed, total, res = run_python_tests("while True: pass", TESTS, SandboxLimits(cpu_seconds=1), backend="rlimits")
    assert (passed, total, res.outcome, res.infra_error) == (0, 3, "timeout", None)
    monkeypatch.setattr(sandbox, "_find_python", lambda: "/nonexistent/python3")
    passed, total, res = run_python_tests("def add(a, b):\n    return a + b", TESTS, FAST, backend="rlimits")
    assert (passed, total) == (0, 3) and res.infra_error and "could not start" in res.infra_error
    assert run_python_tests("x = 1", "def helper():\n    pass\n", FAST, backend="rlimits")[2].infra_error
    assert "does not parse" in run_python_tests("x = 1", "def test(:\n", FAST, backend="rlimits")[2].infra_error


def test_grading_partial_count_survives_a_timeout():
    tests = TESTS + "\ndef test_hangs():\n    add.hang()\n\ndef test_after():\n    assert add(2, 2) == 4\n"
    solution = "import time\ndef add(a, b):\n    return a + b\nadd.hang = lambda: time.sleep(60)\n"
    passed, total, res = run_python_tests(solution, tests, SandboxLimits(wall_seconds=1.5), backend="rlimits")
    assert (passed, total, res.outcome, res.infra_error) == (3, 5, "timeout", None)


# --------------------------------------------------------------------------- fallbacks (always run)


def test_detection_falls_back_loudly_when_bwrap_is_missing(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_probed", {})
    monkeypatch.setattr(sandbox, "_warned", set())
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which",
                        lambda name, *a, **k: None if name in ("bwrap", "unshare") else real_which(name, *a, **k))
    with caplog.at_level(logging.WARNING, logger="tether.envs.sandbox"):
        assert detect_sandbox_backend() == "rlimits"
        assert detect_sandbox_backend() == "rlimits"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # loud, but once
    assert "SANDBOX IS WEAK" in warnings[0] and "`bwrap` is not on PATH" in warnings[0]
    assert "apt-get install -y bubblewrap" in warnings[0]


def test_forced_rlimits_backend_warns_and_still_contains_resources(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="tether.envs.sandbox"):
        res = run_sandboxed_python("import sys\nprint(sys.stdin.read()[::-1])", FAST, stdin="abc", backend="rlimits")
    assert (res.outcome, res.stdout, res.backend) == ("ok", "cba\n", "rlimits")
    assert any("SANDBOX IS WEAK" in r.getMessage() and "'rlimits'" in r.getMessage() for r in caplog.records)
    res = run_sandboxed_python("while True: pass", SandboxLimits(cpu_seconds=1), backend="rlimits")
    assert res.outcome == "timeout", res
    res = run_sandboxed_python("b = bytearray(2_000_000_000)", SandboxLimits(memory_mb=200), backend="rlimits")
    assert res.outcome == "killed" and "MemoryError" in res.stderr
    res = run_sandboxed_python("open('big', 'wb').write(b'x' * 8_000_000)", SandboxLimits(file_size_mb=1),
                               backend="rlimits")
    assert res.outcome == "killed" and "File too large" in res.stderr
    res = run_sandboxed_python("import time; time.sleep(60)", SandboxLimits(wall_seconds=0.5), backend="rlimits")
    assert res.outcome == "timeout" and res.wall_seconds < 2
    assert_still_works("rlimits")


def test_rlimits_backend_kills_background_children_of_the_group():
    token = f"{time.time_ns() % 10**9}"
    res = run_sandboxed_python(f"import os\nos.system('sleep 1000.{token} >/dev/null 2>&1 &')", FAST, backend="rlimits")
    assert res.outcome == "ok"
    time.sleep(0.1)
    assert live_processes_with(f"1000.{token}") == []


@pytest.mark.skipif(sandbox._probe("unshare") is not None, reason="unshare (user namespaces) unusable here")
def test_unshare_backend_has_no_network_and_reaps_orphans():
    token = f"{time.time_ns() % 10**9}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        code = (f"import os, socket\nos.system('setsid sleep 1000.{token} >/dev/null 2>&1 &')\n"
                f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2)")
        res = run_sandboxed_python(code, FAST, backend="unshare")
        assert res.outcome == "denied" and res.backend == "unshare", res
        with pytest.raises(BlockingIOError):
            listener.accept()
    time.sleep(0.1)
    assert live_processes_with(f"1000.{token}") == []  # the pid namespace died with the program
    assert_still_works("unshare")


def test_bad_arguments_are_programmer_errors():
    with pytest.raises(ValueError, match="valid: bwrap, unshare, rlimits"):
        run_sandboxed_python("pass", backend="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="relative"):
        run_sandboxed_python("pass", files={"../escape.py": ""}, backend="rlimits")
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)


def test_launch_failing_for_lack_of_processes_is_retried_then_reported(monkeypatch):
    """A concurrent execution holding uid 65534's NPROC budget makes bwrap's clone fail with EAGAIN:
    transient, so the launch is retried; a persistent failure stays an infra_error, never a 0."""
    eagain = SandboxResult("error", 1, "", "bwrap: Creating new namespace failed: Resource temporarily unavailable",
                           0.0, "bwrap", infra_error="the sandbox failed before the program ran (exit 1): bwrap: "
                           "Creating new namespace failed: Resource temporarily unavailable")
    ok = SandboxResult("ok", 0, "42\n", "", 0.0, "bwrap")
    calls = []
    monkeypatch.setattr(sandbox, "_LAUNCH_RETRIES", (0.0, 0.0, 0.0))
    monkeypatch.setattr(sandbox, "_run", lambda *a: calls.append(a) or (eagain if len(calls) < 3 else ok))
    assert run_sandboxed_python("print(6 * 7)", FAST, backend="bwrap") is ok and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(sandbox, "_run", lambda *a: calls.append(a) or eagain)
    res = run_sandboxed_python("print(6 * 7)", FAST, backend="bwrap")
    assert res.infra_error and len(calls) == 4  # three retries, then the failure is reported
    other = SandboxResult("error", 1, "", "bwrap: No permissions to create new namespace", 0.0, "bwrap", infra_error="x")
    calls.clear()
    monkeypatch.setattr(sandbox, "_run", lambda *a: calls.append(a) or other)
    assert run_sandboxed_python("print(6 * 7)", FAST, backend="bwrap") is other and len(calls) == 1  # not transient
