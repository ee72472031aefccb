"""Hostile programs against the sandbox, run by a root trainer and by a non-root trainer, on
bubblewrap and on each opt-in fallback (issue 14 item 7).

A trainer process (`sandbox_helpers.Trainer`) runs the programs, so an attack on "the trainer"
hits that process and never pytest. Escapes from the filesystem, secrets, network, processes
left behind and attacks on the caller: bwrap must stop all of them for both trainers; a weak
backend must stop what its warning does not list (`sandbox_backends.GAPS`), and nothing more is
asserted of it. Network is only ever tried against a listener the test opens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from sandbox_helpers import ATTACK_CODE, NOBODY, Trainer, daemon_code, escape_code, host_uid_of, live_processes_with, \
    wait_until_gone

from tether.envs import sandbox
from tether.envs.sandbox import SandboxLimits, run_sandboxed_python
from tether.envs.sandbox_backends import GAPS, sweep_uid, uid_slot

pytestmark = pytest.mark.exclusive("sandbox")

IS_ROOT = os.geteuid() == 0
OTHER_UID = 4242  # "another user": neither the trainer nor the sandbox


def digits() -> str:
    """A unique token that `sleep` accepts as the fraction of its argument."""
    return str(uuid.uuid4().int)[:15]
BWRAP_WHY = sandbox._probe("bwrap")
UNSHARE_WHY = sandbox._probe("unshare")
LIMITS = {"cpu_seconds": 5, "wall_seconds": 30, "memory_mb": 256, "file_size_mb": 4, "disk_mb": 8,
          "max_processes": 16}  # wall: generous, the machine may be busy


def backend_param(name: str):
    why = {"bwrap": BWRAP_WHY, "unshare": UNSHARE_WHY}.get(name)
    reason = f"{name} unusable here ({why}); install bubblewrap with `apt-get install bubblewrap`"
    return pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=reason), id=name)


def trainer_param(kind: str):
    """root: needs root. user: as root, uid 65534 via setuid; not root, the current (non-root) uid."""
    skip = kind == "root" and not IS_ROOT
    return pytest.param(kind, marks=pytest.mark.skipif(skip, reason="a root trainer needs the tests to run as root"),
                        id=f"{kind}-trainer")


BACKENDS = [backend_param(b) for b in ("bwrap", "unshare", "rlimits")]
TRAINERS = [trainer_param("root"), trainer_param("user")]


@pytest.fixture(scope="module")
def trainer():
    t = Trainer()
    yield t
    t.close()


def trainer_uid(kind: str) -> int | None:
    return None if kind == "root" or not IS_ROOT else NOBODY


def protected(backend: str, kind: str, gap: str) -> bool:
    """Whether `backend` claims to protect against `gap` (words from GAPS) for this trainer."""
    hits = [g for g in GAPS.get(backend, ()) if gap in g]
    return not hits or (kind == "root" and all("unless the trainer is root" in g for g in hits))


@pytest.fixture
def secrets_on_host():
    """A 0600 file of the trainer in its private home, one of another user, and an env secret."""
    token = digits()
    home = Path(tempfile.mkdtemp(prefix="tether-sandbox-home-", dir="/tmp"))
    own, other = home / "own-secret.txt", Path(tempfile.mkdtemp(prefix="tether-sandbox-other-", dir="/tmp")) / "x.txt"
    own.write_text(f"OWN-{token}")
    other.write_text(f"OTHER-{token}")
    os.chmod(own, 0o600)
    os.chmod(other, 0o600)
    os.chmod(other.parent, 0o755)
    if IS_ROOT:
        os.chown(other, OTHER_UID, OTHER_UID)
    yield home, own, other, token
    for path in (own, other):
        path.unlink(missing_ok=True)
    home.rmdir()
    other.parent.rmdir()


@pytest.mark.parametrize("kind", TRAINERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_escapes_secrets_network_and_daemons(backend, kind, trainer, secrets_on_host):
    home, own, other, token = secrets_on_host
    uid = trainer_uid(kind)
    if uid is not None:  # the trainer's own home and file are its own; the other user's is root's, 0600
        os.chown(home, uid, uid)
        os.chown(own, uid, uid)
    name = f"tether-escape-{token}"
    writes = [f"/tmp/{name}", f"/dev/shm/{name}", f"/var/tmp/{name}", str(trainer.run_dir / name), f"{home}/{name}"]
    reads = ["/etc/shadow", str(own), str(other), str(trainer.run_dir / "metrics.jsonl")]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        jobs = [{"code": escape_code(reads, writes, listener.getsockname()[1], f"ENV-{token}"), "backend": backend,
                 "limits": LIMITS},
                {"code": daemon_code(token), "backend": backend, "limits": LIMITS}]
        results, alive, proc = trainer.run(uid, jobs, env={"TRAINER_TOKEN": f"ENV-{token}", "HOME": str(home)})
        assert alive and len(results) == 2, proc.stderr
        if protected(backend, kind, "network"):
            with pytest.raises(BlockingIOError):
                listener.accept()  # nothing reached the host's listener
    got = json.loads(results[0]["stdout"].splitlines()[-1])
    leftovers = wait_until_gone(token) if protected(backend, kind, "processes left behind") else []
    try:
        assert not got["env_leak"] and "TRAINER_TOKEN" not in got["env"]  # every backend: a clean environment
        assert got["read"]["/etc/shadow"] in ("FileNotFoundError", "PermissionError")
        if IS_ROOT:  # another user's 0600 file (without root the test cannot make one)
            assert got["read"][str(other)] in ("FileNotFoundError", "PermissionError")
        if protected(backend, kind, "filesystem is readable"):
            assert got["read"][str(own)] == "FileNotFoundError"  # the trainer's own 0600 file: not even there
            assert got["read"][str(trainer.run_dir / "metrics.jsonl")] == "FileNotFoundError"
            assert got["listing"]["/home"] == got["listing"]["/root"] == "FileNotFoundError"
            assert "shadow" not in str(got["listing"]["/etc"]) and "work" in got["listing"]["/"]
            assert got["wrote"] == [f"/tmp/{name}", f"/dev/shm/{name}"]  # its own fresh ones
            for path in writes:
                assert not os.path.exists(path), f"{path} escaped the sandbox"
        if protected(backend, kind, "network"):
            assert got["connected"] in ("ConnectionRefusedError", "OSError"), got
        if protected(backend, kind, "processes left behind"):
            assert results[1]["outcome"] == "ok" and leftovers == [], leftovers
    finally:
        for path in writes:
            Path(path).unlink(missing_ok=True)
        for pid in live_processes_with(token):  # a weak backend's daemon
            os.kill(pid, 9)


@pytest.mark.parametrize("kind", TRAINERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trainer_cannot_be_killed_from_inside(backend, kind, trainer):
    if not protected(backend, kind, "killed from inside"):
        pytest.skip(f"{backend} with a non-root trainer does not protect the trainer (its warning says so)")
    everyone = "os.getppid()" if backend == "rlimits" else "-1"
    code = ATTACK_CODE.replace("PYTEST_PID", str(os.getpid())).replace("EVERYONE", everyone)
    jobs = [{"code": code, "backend": backend, "limits": LIMITS},
            {"code": "print(6 * 7)", "backend": backend, "limits": LIMITS}]
    results, alive, proc = trainer.run(trainer_uid(kind), jobs)
    assert alive, f"the trainer died: rc={proc.returncode} {proc.stderr[-500:]}"
    assert [r["stdout"] for r in results] == ["attacked\n", "42\n"]


@pytest.mark.parametrize("kind", TRAINERS)
def test_resource_exhaustion_under_bwrap(kind, trainer):
    """Fork bomb, memory, disk fill of /tmp, /dev/shm and /work, CPU spin, a sleeper: each ends
    `timeout` or `killed` (never a plain error), and the trainer carries on."""
    if BWRAP_WHY:
        pytest.skip(f"bubblewrap unusable here ({BWRAP_WHY}); `apt-get install bubblewrap`")
    token = digits()
    bomb = (f"import os, sys\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            f"            os.execv('/bin/sleep', ['sleep', '1000.{token}'])\n    except OSError:\n        pass\n")
    fill = ("import os\ngot = {}\nfor d in ('/tmp', '.', '/dev/shm'):\n    n = 0\n    try:\n        while True:\n"
            "            with open(f'{d}/fill{n}', 'wb') as f:\n                f.write(b'x' * 1_000_000)\n"
            "            n += 1\n    except OSError as exc:\n        got[d] = [n, exc.errno]\nprint(got)\n"
            "open('/tmp/one-more', 'wb').write(b'x' * 1_000_000)\n")
    jobs = [{"code": bomb, "backend": "bwrap", "limits": {**LIMITS, "wall_seconds": 2}},
            {"code": "b = []\nwhile True:\n    b.append(bytearray(10_000_000))", "backend": "bwrap", "limits": LIMITS},
            {"code": fill, "backend": "bwrap", "limits": LIMITS},
            {"code": "while True: pass", "backend": "bwrap", "limits": {**LIMITS, "cpu_seconds": 1}},
            {"code": "import time; time.sleep(60)", "backend": "bwrap", "limits": {**LIMITS, "wall_seconds": 1}}]
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak.append(len(live_processes_with(token)))
            time.sleep(0.05)

    # A non-root trainer's NPROC counts its uid's other processes too (the sandbox adds them to the budget).
    others = 0 if kind == "root" else sum(host_uid_of(int(p.name)) == NOBODY for p in Path("/proc").glob("[0-9]*"))
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results, alive, proc = trainer.run(trainer_uid(kind), jobs)
    finally:
        done.set()
        watcher.join()
    assert alive and len(results) == 5, proc.stderr
    bomb_res, mem, disk, spin, sleeper = results
    assert bomb_res["outcome"] in ("timeout", "killed") and bomb_res["infra_error"] is None
    assert 0 < max(peak) <= LIMITS["max_processes"] + (0 if kind == "root" else others + 4), (max(peak), others)
    assert wait_until_gone(token) == []
    assert mem["outcome"] == "killed" and mem["stderr"].strip().endswith("MemoryError")
    assert disk["outcome"] == "killed" and "No space left" in disk["stderr"], disk
    filled = eval(disk["stdout"])  # noqa: S307 - a dict of ints the program printed
    assert all(n <= LIMITS["disk_mb"] and errno == 28 for n, errno in filled.values()), filled
    assert spin["outcome"] == "timeout" and spin["exit_code"] == -9 and spin["wall"] < 25  # the CPU limit, not the wall
    assert sleeper["outcome"] == "timeout" and sleeper["wall"] < 15


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_executions_never_share_a_uid_or_files(backend):
    if IS_ROOT:  # the pool: distinct uids that own nothing, whatever the timing
        with uid_slot() as a, uid_slot() as b, uid_slot() as c:
            assert len({a, b, c, 0, NOBODY}) == 5
        with pytest.raises(ValueError, match="not a sandbox pool uid"):
            sweep_uid(OTHER_UID)  # kill(-1) only ever from a pool uid (a harmless uid, should the guard fail)
    token = digits()
    tmp = backend == "bwrap"  # the weak backends share the host's /tmp (their warning says so): not written

    def program(i: int) -> str:
        return (f"import os, subprocess, time\nopen('mine-{i}', 'w').write('x')\n"
                + (f"open('/tmp/mine-{i}', 'w').write('x')\n" if tmp else "")
                + f"p = subprocess.Popen(['sleep', '3.{token}{i}'])\ntime.sleep(2)\n"
                "print(sorted(f for f in os.listdir('.') if f.startswith('mine')), "
                + ("sorted(os.listdir('/tmp')))\n" if tmp else "[])\n") + "p.kill()\n")

    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, run_sandboxed_python(program(i), SandboxLimits(wall_seconds=30), backend=backend)))
        for i in range(6)]
    for t in threads:
        t.start()
    scans = []
    while any(t.is_alive() for t in threads):
        scans.append([host_uid_of(pid) for pid in live_processes_with(token)])
        time.sleep(0.05)
    assert len(results) == 6
    for i, res in results.items():
        assert res.outcome == "ok" and res.stdout == f"['mine-{i}'] {[f'mine-{i}'] if tmp else []}\n", res
    assert max(len(s) for s in scans) >= 2  # they did run at once
    if IS_ROOT:
        for uids in scans:
            assert len(set(uids)) == len(uids) and not {0, NOBODY} & set(uids), scans
