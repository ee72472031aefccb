"""The sandbox's contract: programs run, limits end them as `timeout`/`killed` on every backend,
grading by unit tests, the choice of backend — bubblewrap or refuse, weaker ones only when opted
in, with a warning naming what they do not protect (issue 3 item 5, issue 14 item 7).

Hostile programs (escapes, secrets, network, daemons, attacks on the trainer, as root and as a
non-root trainer): test_sandbox_hostile.py. Tests that need bubblewrap skip when it is missing;
the refusal without it is tested by simulating its absence.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

from sandbox_helpers import wait_until_gone

from tether.config import ConfigError, load_config
from tether.envs import sandbox
from tether.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    resolve_backend,
    run_python_tests,
    run_sandboxed_python,
)
from tether.envs.sandbox_backends import ENV_VAR, GAPS
from tether.tasks import make_problems

# One at a time across xdist workers: a non-root trainer's executions share its NPROC budget.
pytestmark = pytest.mark.exclusive("sandbox")

BWRAP_WHY = sandbox._probe("bwrap")
UNSHARE_WHY = sandbox._probe("unshare")
needs_bwrap = pytest.mark.skipif(BWRAP_WHY is not None, reason=f"bubblewrap unusable here ({BWRAP_WHY}); "
                                 "install it with `apt-get install bubblewrap` (make test tries to)")
BACKENDS = ["rlimits", pytest.param("unshare", marks=pytest.mark.skipif(UNSHARE_WHY is not None, reason=f"unshare "
                                                                         f"unusable here ({UNSHARE_WHY})")),
            pytest.param("bwrap", marks=needs_bwrap)]
IS_ROOT = os.geteuid() == 0

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=20, memory_mb=256, file_size_mb=4, max_processes=16,
                     max_open_files=64)


def assert_still_works(backend: str) -> None:
    """The execution after a hostile one is unaffected."""
    res = run_sandboxed_python("print(6 * 7)", FAST, backend=backend)
    assert (res.outcome, res.stdout, res.infra_error) == ("ok", "42\n", None), res


@pytest.fixture
def no_bwrap(monkeypatch):
    """This machine as if bubblewrap were not installed, and no backend configured."""
    monkeypatch.setattr(sandbox, "_probed", {})
    monkeypatch.setattr(sandbox, "_warned", set())
    monkeypatch.delenv(ENV_VAR, raising=False)
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))


# --------------------------------------------------------------------------- basics (bwrap)


@needs_bwrap
def test_ok_program_stdin_files_and_workdir():
    res = run_sandboxed_python("import os, sys\nprint(open('data/in.txt').read(), sys.stdin.read(), os.getcwd())",
                               FAST, files={"data/in.txt": "from-file"}, stdin="from-stdin", backend="bwrap")
    assert res == SandboxResult("ok", 0, "from-file from-stdin /work\n", "", res.wall_seconds, "bwrap")
    assert resolve_backend() == "bwrap"  # the default


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


# --------------------------------------------------------------------------- limits, every backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_limit_ends_as_timeout_or_killed_on_every_backend(backend):
    """Never a plain `error`: the unshare backend reported RLIMIT_CPU's SIGKILL as exit 1 (issue 14)."""
    res = run_sandboxed_python("while True: pass", SandboxLimits(cpu_seconds=1, wall_seconds=30), backend=backend)
    assert (res.outcome, res.exit_code, res.infra_error) == ("timeout", -9, None), res
    assert res.wall_seconds < 25  # the CPU limit ended it, not the wall clock
    t0 = time.monotonic()
    res = run_sandboxed_python("import time\nprint('started')\ntime.sleep(60)", SandboxLimits(wall_seconds=1),
                               backend=backend)
    assert (res.outcome, res.stdout, res.infra_error) == ("timeout", "started\n", None), res
    assert time.monotonic() - t0 < 15
    res = run_sandboxed_python("chunks = []\nwhile True:\n    chunks.append(b'x' * 10_000_000)",
                               SandboxLimits(memory_mb=200, wall_seconds=30), backend=backend)
    assert res.outcome == "killed" and res.stderr.strip().endswith("MemoryError"), res
    code = ("import os\ntry:\n    with open('big', 'wb') as f:\n        while True:\n            f.write(b'x' * 1_000_000)\n"
            "finally:\n    print(os.path.getsize('big'))")
    res = run_sandboxed_python(code, SandboxLimits(file_size_mb=4, wall_seconds=30), backend=backend)
    assert res.outcome == "killed" and "File too large" in res.stderr and int(res.stdout) == 4 * 1024 * 1024
    if IS_ROOT or backend == "bwrap":  # NPROC: of the execution's own uid (root trainer) or namespace
        bomb = ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError as exc:\n"
                "        raise SystemExit(f'OSError: [Errno {exc.errno}]') from None\n")
        res = run_sandboxed_python(bomb, SandboxLimits(max_processes=8, wall_seconds=30), backend=backend)
        assert res.outcome in ("killed", "timeout") and res.infra_error is None, res
    assert_still_works(backend)


def test_rlimits_backend_kills_background_children_of_the_group():
    token = f"{time.time_ns() % 10**9}"
    res = run_sandboxed_python(f"import os\nos.system('sleep 1000.{token} >/dev/null 2>&1 &')", FAST, backend="rlimits")
    assert res.outcome == "ok"
    assert wait_until_gone(token) == []


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
    monkeypatch.setattr(sandbox, "find_python", lambda: "/nonexistent/python3")
    passed, total, res = run_python_tests("def add(a, b):\n    return a + b", TESTS, FAST, backend="rlimits")
    assert (passed, total) == (0, 3) and res.infra_error and "could not start" in res.infra_error
    assert run_python_tests("x = 1", "def helper():\n    pass\n", FAST, backend="rlimits")[2].infra_error
    assert "does not parse" in run_python_tests("x = 1", "def test(:\n", FAST, backend="rlimits")[2].infra_error


def test_grading_partial_count_survives_a_timeout():
    tests = TESTS + "\ndef test_hangs():\n    add.hang()\n\ndef test_after():\n    assert add(2, 2) == 4\n"
    solution = "import time\ndef add(a, b):\n    return a + b\nadd.hang = lambda: time.sleep(60)\n"
    # 6 s: the three quick tests must finish first even when the machine is loaded (the hang sleeps 60 s)
    passed, total, res = run_python_tests(solution, tests, SandboxLimits(wall_seconds=6), backend="rlimits")
    assert (passed, total, res.outcome, res.infra_error) == (3, 5, "timeout", None)



# --------------------------------------------------------------------------- backend choice: bwrap or refuse


def test_without_bwrap_and_without_opt_in_the_sandbox_refuses_with_the_install_hint(no_bwrap):
    with pytest.raises(SandboxUnavailable, match=r"`bwrap` is not on PATH.*apt-get install bubblewrap.*"
                                                 r"sandbox.backend=unshare\|rlimits"):
        run_sandboxed_python("print(1)", FAST)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_python_tests("def add(a, b):\n    return a + b", TESTS, FAST)


def test_the_code_environment_refuses_to_start_without_bwrap(no_bwrap, tmp_path):
    with pytest.raises(ConfigError, match=r"env codefix runs model-written code: .*apt-get install bubblewrap"):
        make_problems("codefix", 2, 0)
    from tether.train.setup import configure_process, setup_problems

    cfg = load_config(None, ["data.task=codefix", "data.train_size=2", "data.eval_size=1"])
    configure_process(cfg.sandbox, cfg.model)
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        setup_problems(cfg.data)


@pytest.mark.parametrize("backend", ["rlimits", "unshare"])
def test_a_weak_backend_is_opt_in_and_its_warning_names_what_it_does_not_protect(no_bwrap, monkeypatch, caplog, backend):
    if backend == "unshare" and UNSHARE_WHY:
        pytest.skip(f"unshare unusable here ({UNSHARE_WHY})")
    from tether.train.setup import configure_process, setup_problems

    monkeypatch.setenv(ENV_VAR, "bwrap")  # restored after the test: configure_sandbox writes os.environ
    cfg = load_config(None, ["data.task=codefix", "data.train_size=2", "data.eval_size=1", f"sandbox.backend={backend}"])
    with caplog.at_level(logging.WARNING, logger="tether.envs.sandbox"):
        configure_process(cfg.sandbox, cfg.model)  # the opt-in (a run's start) ...
        train, _ = setup_problems(cfg.data)  # ... and the code environment starts
        assert os.environ[ENV_VAR] == backend and resolve_backend() == backend
        res = run_sandboxed_python("print(6 * 7)", FAST)
    assert (res.outcome, res.stdout, res.backend) == ("ok", "42\n", backend) and len(train) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # loud, but once
    assert f"SANDBOX IS WEAK: model-written code runs with backend {backend!r}" in warnings[0]
    assert all(gap in warnings[0] for gap in GAPS[backend]) and "apt-get install bubblewrap" in warnings[0]
    assert "network" in warnings[0] if backend == "rlimits" else "network" not in warnings[0]


def test_an_unknown_configured_backend_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "docker")
    with pytest.raises(SandboxUnavailable, match="valid: bwrap, unshare, rlimits"):
        run_sandboxed_python("pass")
    with pytest.raises(ConfigError, match="sandbox.backend"):
        load_config(None, ["sandbox.backend=docker"])


def test_bad_arguments_are_programmer_errors():
    with pytest.raises(ValueError, match="valid: bwrap, unshare, rlimits"):
        run_sandboxed_python("pass", backend="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="relative"):
        run_sandboxed_python("pass", files={"../escape.py": ""}, backend="rlimits")
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)


def test_launch_failing_for_lack_of_processes_is_retried_then_reported(monkeypatch):
    """A non-root trainer's processes share its NPROC budget: bwrap's clone can fail with EAGAIN.
    Transient, so the launch is retried; a persistent failure stays an infra_error, never a 0."""
    eagain = SandboxResult("error", 1, "", "bwrap: Creating new namespace failed: Resource temporarily unavailable",
                           0.0, "bwrap", infra_error="the sandbox failed before the program ran (exit 1): bwrap: "
                           "Creating new namespace failed: Resource temporarily unavailable")
    ok = SandboxResult("ok", 0, "42\n", "", 0.0, "bwrap")
    calls = []
    monkeypatch.setattr(sandbox, "_probed", {"bwrap": None})
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
