"""Running a black-box agent program and reading its result, strictly (`tether.rollout.harness`).

Two ways to run the program (`harness.command`):

- **one process per episode** (default): the program starts with `OPENAI_BASE_URL` (the episode's
  URL), `OPENAI_API_KEY`, `TETHER_TASK` (the problem as JSON, answer removed) and
  `TETHER_EPISODE_ID`, and its LAST stdout line is its result;
- **persistent** (`harness.persistent=true`): `harness.concurrency` processes start once, with
  `TETHER_AGENT_MODE=persistent` and `OPENAI_API_KEY`, and each serves many episodes: tether writes
  one JSON line per episode to its stdin, `{"episode_id", "base_url", "task"}`, and the program
  answers with one JSON line on stdout, `{"episode_id": ..., "reward": x}` or `{"episode_id": ...,
  "answer": "..."}` (logs go to stderr). A process that dies or runs past `harness.timeout_s` is
  restarted for the next episode.

A result is `{"reward": x}` (a finite number: the agent's own score), `{"answer": "42"}` (a string
or a number, scored by the run's reward), `{"error": "why"}` (the agent gives up on this episode:
an error outcome) or, per-episode mode only, a plain last line that is the answer. Anything else - output that is not UTF-8, a line that looks like JSON but is not, a
non-finite or non-numeric reward, a JSON object without either key - makes the episode INVALID:
counted, masked out of the update and reported with the program's stderr tail, never a crash of
the run (docs/errors.md, "Agent programs").

`python` / `python3` as the command's first word is the interpreter tether runs in
(`sys.executable`), so an agent sees the same installed packages as tether.
"""

from __future__ import annotations

import atexit
import collections
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tether.types import Outcome

MAX_OUTPUT_BYTES = 64_000  # of stdout kept per episode (the result is its last line)
STDERR_TAIL_LINES = 3


@dataclass(frozen=True)
class EpisodeResult:
    """What one agent run produced: its reward or answer, or why it failed."""

    reward: float | None = None
    answer: str | None = None
    error: str = ""
    outcome: Outcome = Outcome.OK
    seconds: float = 0.0


class AgentOutputError(ValueError):
    """The agent's output breaks the result protocol (module docstring); the episode is invalid."""

    outcome = Outcome.INVALID


class AgentReportedError(AgentOutputError):
    """The agent's result is `{"error": ...}`: it failed this episode, and says why."""

    outcome = Outcome.ERROR


def resolve_command(command: Sequence[str]) -> list[str]:
    """`python` / `python3` -> the interpreter tether runs in; everything else as given."""
    cmd = list(command)
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


def decode_output(raw: bytes, what: str = "output") -> str:
    """UTF-8 text of the agent's `raw` bytes; AgentOutputError naming the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise AgentOutputError(f"the agent's {what} is not UTF-8 text (byte {raw[err.start]:#04x} at offset "
                               f"{err.start}): print UTF-8") from None


def parse_result_object(obj: Any) -> tuple[float | None, str | None]:
    """(reward, answer) of a JSON result: {"reward": finite number} or {"answer": string or number}."""
    if not isinstance(obj, dict):
        raise AgentOutputError(f"the agent's result must be a JSON object, got {type(obj).__name__}")
    if "reward" in obj:
        r = obj["reward"]
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise AgentOutputError(f"the agent's \"reward\" must be a number, got {type(r).__name__} {r!r:.40}")
        if not math.isfinite(r):
            raise AgentOutputError(f"the agent's \"reward\" must be finite, got {r!r}")
        return float(r), None
    if "answer" in obj:
        a = obj["answer"]
        if isinstance(a, str):
            return None, a
        if isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a):
            return None, str(a)
        raise AgentOutputError(f"the agent's \"answer\" must be a string or a finite number, got "
                               f"{type(a).__name__} {a!r:.40}")
    if "error" in obj:
        raise AgentReportedError(f"the agent reported an error: {str(obj['error'])[:300]}")
    raise AgentOutputError(f"the agent's JSON result needs \"reward\" or \"answer\" (its keys: {sorted(obj)[:8]})")


def parse_agent_output(stdout: str | bytes) -> tuple[float | None, str | None]:
    """(reward, answer) from the program's last non-empty stdout line (module docstring);
    AgentOutputError when the output breaks the protocol."""
    text = decode_output(stdout, "stdout") if isinstance(stdout, bytes) else stdout
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        raise AgentOutputError("the agent printed nothing (its last stdout line must be its answer or {\"reward\": x})")
    last = lines[-1].strip()
    if last.startswith(("{", "[")):
        try:
            obj = json.loads(last)
        except json.JSONDecodeError as err:
            raise AgentOutputError(f"the agent's last stdout line looks like JSON but is not ({err.msg} at column "
                                   f"{err.colno}): {last[:80]!r}") from None
        return parse_result_object(obj)
    return None, last


def stderr_tail(raw: bytes | str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last `lines` non-empty lines of stderr, one line ('a | b | c'), for error messages."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    tail = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(t[:200] for t in tail)


def _with_tail(message: str, stderr: bytes | str) -> str:
    tail = stderr_tail(stderr)
    return f"{message}; stderr: {tail}" if tail else message


def run_agent(command: Sequence[str], task: Mapping[str, Any], base_url: str, api_key: str, episode_id: str,
              timeout_s: float, cwd: str | None = None) -> EpisodeResult:
    """Run the agent program once for one episode (module docstring); never raises."""
    env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, TETHER_EPISODE_ID=episode_id,
               TETHER_TASK=json.dumps({k: v for k, v in task.items() if k != "answer"}, default=str))
    cmd = resolve_command(command)
    t0 = time.perf_counter()
    try:  # bytes, not text: output that is not UTF-8 is this episode's problem, not the run's
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        return EpisodeResult(error=_with_tail(f"agent ran past harness.timeout_s={timeout_s:g}", err.stderr or b""),
                             outcome=Outcome.TIMEOUT, seconds=time.perf_counter() - t0)
    except OSError as err:
        return EpisodeResult(error=f"cannot start {cmd[0]!r}: {err.strerror or err} (harness.command)",
                             outcome=Outcome.ERROR)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        return EpisodeResult(error=_with_tail(f"agent exited with {proc.returncode}", proc.stderr or proc.stdout),
                             outcome=Outcome.ERROR, seconds=dt)
    try:
        reward, answer = parse_agent_output(proc.stdout[-MAX_OUTPUT_BYTES:])
    except AgentOutputError as err:
        return EpisodeResult(error=_with_tail(str(err), proc.stderr), outcome=err.outcome, seconds=dt)
    return EpisodeResult(reward=reward, answer=answer, seconds=dt)


class AgentProcess:
    """One persistent agent process (module docstring): episodes in on stdin, results out on stdout."""

    def __init__(self, command: Sequence[str], api_key: str, cwd: str | None = None) -> None:
        self.command, self.api_key, self.cwd = resolve_command(command), api_key, cwd
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()
        self.stderr: collections.deque[bytes] = collections.deque(maxlen=50)

    def _start(self) -> None:
        env = dict(os.environ, OPENAI_API_KEY=self.api_key, TETHER_AGENT_MODE="persistent")
        self.proc = subprocess.Popen(self.command, env=env, cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self.lines = queue.Queue()  # a fresh queue: a dead process's late lines never answer a new episode
        threading.Thread(target=_pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=_pump, args=(self.proc.stderr, self.stderr.append, False), daemon=True).start()

    def _tail(self) -> bytes:
        return b"".join(self.stderr)

    def play(self, task: Mapping[str, Any], base_url: str, episode_id: str, timeout_s: float) -> EpisodeResult:
        """One episode; never raises. A process that died or hung is replaced for the next one."""
        t0 = time.perf_counter()
        try:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            request = {"episode_id": episode_id, "base_url": base_url,
                       "task": {k: v for k, v in task.items() if k != "answer"}}
            self.proc.stdin.write((json.dumps(request, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as err:
            self.close()
            return EpisodeResult(error=_with_tail(f"cannot run {self.command[0]!r}: {err.strerror or err} "
                                                  "(harness.command)", self._tail()), outcome=Outcome.ERROR)
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            return EpisodeResult(error=_with_tail(f"agent ran past harness.timeout_s={timeout_s:g}", self._tail()),
                                 outcome=Outcome.TIMEOUT, seconds=time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        if line is None:  # stdout closed: the process exited
            code = self.proc.wait() if self.proc is not None else None
            self.close()
            return EpisodeResult(error=_with_tail(f"agent exited with {code} (persistent mode: it must keep reading "
                                                  "stdin)", self._tail()), outcome=Outcome.ERROR, seconds=dt)
        try:
            obj = _parse_line(decode_output(line.strip(), "stdout line"))
            if obj.get("episode_id") != episode_id:
                raise AgentOutputError(f"the agent answered episode {obj.get('episode_id')!r:.60}, not {episode_id!r} "
                                       "(persistent mode: one result line per request, in order)")
            reward, answer = parse_result_object({k: v for k, v in obj.items() if k != "episode_id"})
        except AgentOutputError as err:
            return EpisodeResult(error=_with_tail(str(err), self._tail()), outcome=err.outcome, seconds=dt)
        return EpisodeResult(reward=reward, answer=answer, seconds=dt)

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for f in (proc.stdin, proc.stdout, proc.stderr) if proc is not None else ():
            try:
                f.close()
            except OSError:
                pass


def _parse_line(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise AgentOutputError(f"persistent mode: every stdout line must be a JSON result ({err.msg}): {text[:80]!r}; "
                               "print logs to stderr") from None
    if not isinstance(obj, dict):
        raise AgentOutputError(f"persistent mode: a result line must be a JSON object, got {type(obj).__name__}")
    return obj


def _pump(stream, put, end: bool = True) -> None:
    """Lines of `stream` to `put`, then (`end`) None at end of file (a reader thread per pipe)."""
    for line in iter(stream.readline, b""):
        put(line)
    if end:
        put(None)


class AgentPool:
    """Persistent agent processes shared by every harness rollout of this process with the same
    command: started on first use, reused across steps and evaluations, stopped at exit."""

    _pools: dict[tuple, "AgentPool"] = {}
    _lock = threading.Lock()

    def __init__(self, command: Sequence[str], api_key: str, cwd: str | None) -> None:
        self.command, self.api_key, self.cwd = tuple(command), api_key, cwd
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.all: list[AgentProcess] = []

    @classmethod
    def get(cls, command: Sequence[str], api_key: str, cwd: str | None = None) -> "AgentPool":
        key = (tuple(command), api_key, cwd)
        with cls._lock:
            if key not in cls._pools:
                cls._pools[key] = AgentPool(command, api_key, cwd)
            return cls._pools[key]

    def play(self, task: Mapping[str, Any], base_url: str, api_key: str, episode_id: str,
             timeout_s: float) -> EpisodeResult:
        """The HarnessRollout agent signature; borrows an idle process (or starts one)."""
        try:
            agent = self.idle.get_nowait()
        except queue.Empty:
            agent = AgentProcess(self.command, self.api_key, self.cwd)
            with self._lock:
                self.all.append(agent)
        try:
            return agent.play(task, base_url, episode_id, timeout_s)
        finally:
            self.idle.put(agent)

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            pools, cls._pools = list(cls._pools.values()), {}
        for pool in pools:
            for agent in pool.all:
                agent.close()


atexit.register(AgentPool.close_all)
