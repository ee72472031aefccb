"""The reward-function protocol, the registry of built-ins, and the checked call.

A reward function scores one completion:

    fn(text: str, task: Mapping[str, Any], **kwargs) -> float | dict[str, float] | None

- `text` is the completion decoded from the sampled ids and cut at the stop token by the caller
  (docs/design.md, correctness rule 16: nothing after EOS is ever scored).
- `task` is the problem record; it has at least "prompt" and "answer".
- `kwargs` come from `reward.components[i].kwargs` in the config.
- A float is the component's raw value. A dict must hold a numeric "score" (the value) and may
  hold further numeric diagnostics, logged as `<component>/<key>`.
- Raising `RewardTimeout` reports a time-out detected by the function itself (math-verify's
  internal alarm); any other exception is an ERROR outcome, never a silent 0 (docs/design.md, correctness rule 6).
- A function may carry a `prepare()` attribute: it is called once in the parent before the
  worker processes fork, so heavy imports (sympy) are paid once and shared copy-on-write.
- A function may carry a `check_kwargs(kwargs)` attribute: called when the run is checked, before
  any model is built, it raises ValueError (or a tether UserError) whose message names the kwarg
  ("kwargs.path=...: ...") for settings that cannot work (a missing model directory, a bad URL).

Built-ins live in `REWARD_FUNCTIONS`; a config name `package.module:function` imports a user
function instead (`load_reward_fn`).
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

from tether.config_text import ConfigError
from tether.registry import Registry, import_object
from tether.types import Outcome

@runtime_checkable
class RewardFn(Protocol):
    """What a reward function is (see the module doc): any callable `fn(text, task, **kwargs)`."""

    def __call__(self, text: str, task: Mapping[str, Any], /, **kwargs: Any) -> float | dict[str, float] | None: ...

REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function")

MAX_ERROR_CHARS = 500  # error messages travel through pipes and into logs: keep them short
NOT_RUN = "not run: aborted after a systematic reward failure"  # error of calls skipped by an abort


class RewardTimeout(Exception):
    """Raised by a reward function that detected its own time-out (maps to Outcome.TIMEOUT)."""


class RewardFailure(RuntimeError):
    """A systematic reward failure: the error rate of one call exceeded reward.max_error_rate.

    The caller decides to stop; `results` and `metrics` are attached so it can log them first.
    """

    def __init__(self, message: str, component: str, results: list, metrics: dict[str, float]):
        super().__init__(message)
        self.component = component
        self.results = results
        self.metrics = metrics


@dataclass(frozen=True)
class CallResult:
    """The checked outcome of one (text, component) call; plain data so it pickles cheaply."""

    outcome: Outcome
    value: float = 0.0
    extras: tuple[tuple[str, float], ...] = ()  # the non-"score" keys of a dict result
    error: str = ""


def make_error_text(err: BaseException) -> str:
    """`Type: message (at file:line in fn)`, truncated: enough to find the bug from a log line."""
    text = f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _as_finite_float(x: Any) -> float | None:
    """x as a finite float, or None. str/bytes are rejected even though float('1') works:
    a reward that returns text is a bug to surface, not a number to guess."""
    if isinstance(x, (str, bytes)) or not hasattr(type(x), "__float__"):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def compute_checked_value(raw: Any) -> CallResult:
    """Validate a reward function's return value; anything but a finite number is INVALID.

    None, NaN, inf, strings and dicts without a numeric "score" would otherwise poison every
    advantage of the group (ms-swift#8123); here they become a tagged, counted outcome.
    """
    if isinstance(raw, Mapping):
        if "score" not in raw:
            return CallResult(Outcome.INVALID, error=f"dict result has no 'score' key: {sorted(map(str, raw))}")
        extras: list[tuple[str, float]] = []
        for key, val in raw.items():
            v = _as_finite_float(val)
            if v is None:
                return CallResult(Outcome.INVALID, error=f"dict result[{key!r}] is not a finite number: {val!r:.80}")
            if key != "score":
                extras.append((str(key), v))
        return CallResult(Outcome.OK, value=float(raw["score"]), extras=tuple(extras))
    v = _as_finite_float(raw)
    if v is None:
        return CallResult(Outcome.INVALID, error=f"returned {type(raw).__name__} {raw!r:.80}, not a finite number")
    return CallResult(Outcome.OK, value=v)


def run_reward_call(fn: RewardFn, text: str, task: Mapping[str, Any], kwargs: Mapping[str, Any]) -> CallResult:
    """Run one reward function and tag the result; exceptions become values (house rule 9).

    SystemExit is caught too (a `sys.exit()` in user code must not end a worker silently);
    KeyboardInterrupt is not, so Ctrl-C still stops an inline run.
    """
    try:
        raw = fn(text, task, **kwargs)
    except RewardTimeout as err:
        return CallResult(Outcome.TIMEOUT, error=make_error_text(err))
    except (Exception, SystemExit) as err:
        return CallResult(Outcome.ERROR, error=make_error_text(err))
    return compute_checked_value(raw)


def is_batched(fn: RewardFn) -> bool:
    """A batched component scores all texts of a call at once: `fn(texts, tasks, **kwargs) -> list`."""
    return bool(getattr(fn, "batched", False))


def run_batched_call(fn: RewardFn, texts: list[str] | tuple, tasks: list | tuple, kwargs: Mapping[str, Any],
                     timeout_s: float) -> list[CallResult]:
    """Run one batched component over every text; failures are values, one per text.

    The call runs on a daemon thread with a wall clock (a hung model or HTTP judge is tagged
    TIMEOUT for every text and abandoned, as in `thread` isolation); an exception is ERROR for
    every text; a result list of the wrong length is INVALID for every text (never shifted onto
    other samples); each element is checked like a per-sample result (None / NaN -> INVALID, so a
    judge's unparseable answer is counted and handled by `reward.on_error`).
    """
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["raw"] = fn(list(texts), list(tasks), **kwargs)
        except RewardTimeout as err:
            box["timeout"] = make_error_text(err)
        except (Exception, SystemExit) as err:
            box["error"] = make_error_text(err)

    worker = threading.Thread(target=target, daemon=True, name="tether-batched-reward")
    worker.start()
    worker.join(timeout_s)
    n = len(texts)
    if worker.is_alive():
        return [CallResult(Outcome.TIMEOUT, error=f"batched reward: no result within {timeout_s:g}s")] * n
    if "timeout" in box or "error" in box:
        outcome = Outcome.TIMEOUT if "timeout" in box else Outcome.ERROR
        return [CallResult(outcome, error=box.get("timeout") or box["error"])] * n
    raw = box.get("raw")
    if not isinstance(raw, (list, tuple)) or len(raw) != n:
        got = f"{type(raw).__name__} of length {len(raw)}" if isinstance(raw, (list, tuple)) else type(raw).__name__
        return [CallResult(Outcome.INVALID, error=f"batched reward returned {got}, expected a list of {n}")] * n
    return [compute_checked_value(r) for r in raw]


def load_reward_fn(name: str) -> RewardFn:
    """A registered built-in by name, or `package.module:function` imported from user code.

    Errors name the module/function and say what was wrong, so a config typo is one read away.
    """
    if ":" not in name:
        return REWARD_FUNCTIONS[name]  # UnknownNameError lists valid names + nearest match
    fn = import_object(name, "reward function", ConfigError)
    fn_name = name.partition(":")[2]
    if not callable(fn):
        raise ConfigError(f"reward function {name!r}: {fn_name!r} is a {type(fn).__name__}, not a function")
    return fn
