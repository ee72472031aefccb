"""Small coding tasks graded by unit tests in the sandbox (SWE-like; Jimenez et al., arXiv 2310.06770 §2).

Each task is a one-line Python function with one bug and three unit tests, e.g.

    def total(a, b):
        return a - b          # tests: assert total(2, 3) == 5, ...

The agent has two tools: `run_tests()` runs the tests in the sandbox and reports the failures;
`edit(old, new)` replaces text in solution.py, then runs the tests. The episode ends when an
edit makes every test pass (reward 1, `info["correct"]`), when the agent replies without a tool
call (it submits: reward 1 only if the tests pass) or at env.max_turns.

Tests run through `tether.envs.sandbox.run_python_tests` (bubblewrap, rlimits, pristine tests).
Without a usable sandbox (bubblewrap, or the weaker backend the user opted in to with
`sandbox.backend`) the environment refuses to start: generating its tasks raises a ConfigError
with the install hint (a one-line error from the CLI, before any model is built).
An *infrastructure* failure of the sandbox (`infra_error`) is not the program's fault: the step
raises, the runner ends the episode as `env_error`, and the episode is masked out of the update
instead of being scored 0 (NeMo-Gym PR#2015). Results are cached per (code, tests) — grading
is deterministic — so the n rollouts of one task share their identical runs.

The scripted expert runs the tests, then makes the fix. Its mistake (`sft.demo_noise`): a
wrong edit (another plausible but wrong fix), after which it submits.

Task kwargs: `families` (indices into FAMILIES).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.config_text import ConfigError
from tether.envs.sandbox import SandboxLimits, SandboxUnavailable, resolve_backend, run_python_tests
from tether.envs.tools import Tool, make_tool
from tether.types import Message

SYSTEM = "Fix solution.py so the tests pass. Tools: run_tests, edit."
LIMITS = SandboxLimits(cpu_seconds=2.0, wall_seconds=10.0, memory_mb=256)

# (function names, parameter kind, correct expression, wrong expressions, test-input drawer); the
# expressions name their parameters {a} {b} (two numbers), {n} (a number) or {xs} (a list).
Family = tuple[tuple[str, ...], str, str, tuple[str, ...], Callable[[random.Random], tuple]]
FAMILIES: tuple[Family, ...] = (
    (("add", "total", "plus"), "ab", "{a} + {b}", ("{a} - {b}", "{a} * {b}"),
     lambda r: (r.randint(1, 9), r.randint(2, 9))),
    (("mul", "times", "area"), "ab", "{a} * {b}", ("{a} + {b}", "{a} - {b}"),
     lambda r: (r.randint(2, 9), r.randint(3, 9))),
    (("sub", "minus", "diff"), "ab", "{a} - {b}", ("{a} + {b}", "{b} - {a}"),
     lambda r: (r.randint(5, 9), r.randint(1, 4))),
    (("is_even", "even"), "n", "{n} % 2 == 0", ("{n} % 2 == 1", "{n} % 2"), lambda r: (r.randint(0, 20),)),
    (("largest", "biggest"), "xs", "max({xs})", ("min({xs})", "{xs}[0]"), lambda r: (r.sample(range(1, 30), 3),)),
    (("smallest", "lowest"), "xs", "min({xs})", ("max({xs})", "{xs}[0]"), lambda r: (r.sample(range(1, 30), 3),)),
    (("first", "head"), "xs", "{xs}[0]", ("{xs}[1]", "{xs}[-1]"), lambda r: (r.sample(range(1, 30), 3),)),
    (("last", "tail"), "xs", "{xs}[-1]", ("{xs}[0]", "{xs}[1]"), lambda r: (r.sample(range(1, 30), 3),)),
    (("halve", "half"), "n", "{n} // 2", ("{n} * 2", "{n} // 3"), lambda r: (r.randint(6, 40),)),
    (("square", "sq"), "n", "{n} * {n}", ("{n} * 2", "{n} + {n}"), lambda r: (r.randint(3, 9),)),
)
PARAMS = {"ab": (("a", "b"), ("x", "y"), ("m", "n"), ("p", "q"), ("u", "v")),
          "n": (("n",), ("x",), ("k",), ("num",), ("val",)),
          "xs": (("xs",), ("nums",), ("vals",), ("items",), ("data",))}
_CACHE: OrderedDict[str, tuple[int, int, str]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed: the episode becomes env_error (masked), never a 0."""


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def require_sandbox() -> None:
    """Refuse to start without a working sandbox of the configured backend (probed once per process)."""
    try:
        resolve_backend()
    except SandboxUnavailable as exc:
        raise ConfigError(f"env codefix runs model-written code: {exc}") from None


def make_codefix_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """A buggy one-line function, an issue report, its fix and three tests from the correct version."""
    require_sandbox()
    names, kind, good, wrong, draw = FAMILIES[rng.choice(list(kw.get("families", range(len(FAMILIES)))))]
    name, params = rng.choice(names), rng.choice(PARAMS[kind])
    keys = {"ab": ("a", "b"), "n": ("n",), "xs": ("xs",)}[kind]
    fill = dict(zip(keys, params))
    bug, wrong_fix = rng.sample(wrong, 2)
    good, bug, wrong_fix = (e.format(**fill) for e in (good, bug, wrong_fix))
    fn, *bad = (eval(f"lambda {', '.join(params)}: {e}") for e in (good, bug, wrong_fix))  # noqa: S307 - templates
    cases: list[str] = []
    while len(cases) < 3:
        args = draw(rng)
        want = fn(*args)
        catches = [f(*args) != want for f in bad]
        if any(f"{_call(name, args)} ==" in c for c in cases) or (not cases and not all(catches)):
            continue  # distinct inputs; the first test catches the bug and the wrong fix
        cases.append(f"{_call(name, args)} == {want!r}")
    code = f"def {name}({', '.join(params)}):\n    return {{}}\n"
    tests = f"from solution import {name}\n" + "".join(f"\n\ndef test_{k}():\n    assert {c}\n"
                                                      for k, c in enumerate(cases))
    issue = cases[0].replace(" == ", " should be ")
    known = {code.format(e): _grade_on_host(f, name, cases) for e, f in zip((good, bug, wrong_fix), (fn, *bad))}
    return {"id": f"codefix-{i}", "prompt": f"Issue: {issue}\nsolution.py:\n{code.format(bug)}",
            "code": code.format(bug), "tests": tests, "cases": cases, "bug": bug, "fix": good, "wrong_fix": wrong_fix,
            "known": known if kw.get("host_grading", True) else {}, "answer": good}


def _grade_on_host(fn: Callable, name: str, cases: Sequence[str]) -> list:
    """[passed, total, first failure] of one of the generator's own programs (never model code)."""
    results = [eval(c.split(" == ")[0], {name: fn}) == eval(c.split(" == ")[1]) for c in cases]  # noqa: S307
    return [sum(results), len(cases), next((c for c, ok in zip(cases, results) if not ok), "")]


def run_tests_cached(code: str, tests: str, known: Mapping[str, Sequence] | None = None) -> tuple[int, int, str]:
    """(passed, total, failure summary) for `code` under `tests`; SandboxInfraError on sandbox failure.

    `known`: outcomes of the task generator's own programs (the buggy original, the fix, the
    wrong fix), graded on the host from their templates; any other program runs in the sandbox."""
    if known and code in known:
        passed, total, failed = known[code]
        return int(passed), int(total), str(failed)
    key = hashlib.sha1(json.dumps([code, tests]).encode()).hexdigest()
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    passed, total, res = run_python_tests(code, tests, LIMITS)
    if res.infra_error:
        raise SandboxInfraError(f"sandbox infrastructure failure: {res.infra_error}")
    failed = re.findall(r"^FAILED (test_\d+)", res.stderr, flags=re.M)
    asserts = dict(re.findall(r"def (test_\d+)\(\):\n    assert (.*)\n", tests))
    if not failed and passed < total:  # import error, time-out: nothing ran to completion
        failed = [t for t in asserts][passed:]
    out = (passed, total, "; ".join(asserts.get(t, t) for t in failed[:1]))
    with _CACHE_LOCK:
        _CACHE[key] = out
        while len(_CACHE) > 4096:
            _CACHE.popitem(last=False)
    return out


def _report(passed: int, total: int, failed: str) -> str:
    return f"{passed}/{total} passed." + (f" failed: {failed}" if failed else "")


def run_tests() -> str:
    """Run the unit tests."""
    raise NotImplementedError("executed by CodeFixEnv.step")


def edit(old: str, new: str) -> str:
    """Replace text in solution.py, then run the tests.

    Args:
        old: text to replace
        new: replacement
    """
    raise NotImplementedError("executed by CodeFixEnv.step")


TOOLS: tuple[Tool, ...] = (make_tool(run_tests), make_tool(edit))


class CodeFixEnv:
    """One bug-fixing episode (single use); owns the working copy of solution.py."""

    tools = TOOLS

    def __init__(self, task: Mapping[str, Any]) -> None:
        require_sandbox()  # tasks loaded from a file never went through make_codefix_task
        self.task = task
        self.code = task["code"]

    def reset(self) -> Observation:
        return Observation((Message("system", SYSTEM), Message("user", self.task["prompt"])))

    def _done(self, passed: int, total: int, text: str) -> StepResult:
        ok = passed == total
        return StepResult(Observation((Message("tool", text),)), float(ok), True, {"correct": ok})

    def step(self, action: Action) -> StepResult:
        parsed = action.parsed
        if not parsed.calls and not parsed.errors:  # a plain reply submits the current code
            return self._done(*run_tests_cached(self.code, self.task["tests"], self.task.get("known"))[:2], "submitted.")
        out: list[Message] = [Message("tool", f"error: {e}") for e in parsed.errors]
        info = {"tool_calls": len(parsed.calls), "tool_errors": 0, "tool_timeouts": 0,
                "parse_errors": len(parsed.errors), "correct": False}
        for call in parsed.calls:
            args = dict(call.arguments)
            if call.name == "edit" and set(args) == {"old", "new"} and all(isinstance(v, str) for v in args.values()):
                if not args["old"] or args["old"] not in self.code:
                    out.append(Message("tool", "error: old text not found"))
                    info["tool_errors"] += 1
                    continue
                self.code = self.code.replace(args["old"], args["new"], 1)
            elif not (call.name == "run_tests" and not args):
                out.append(Message("tool", f"error: bad call {call.name}({', '.join(args)}); "
                                           "use run_tests() or edit(old, new)"))
                info["tool_errors"] += 1
                continue
            passed, total, failed = run_tests_cached(self.code, self.task["tests"], self.task.get("known"))
            if call.name == "edit" and passed == total:
                return StepResult(Observation((*out, Message("tool", _report(passed, total, failed))), ), 1.0, True,
                                  {**info, "correct": True})
            out.append(Message("tool", _report(passed, total, failed)))
        return StepResult(Observation(tuple(out)), 0.0, False, info)


def _call_text(name: str, args: Mapping[str, str]) -> str:
    return "<tool_call>%s</tool_call>" % json.dumps({"name": name, "arguments": dict(args)})


def codefix_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    """run_tests, then edit(bug -> fix); after an edit that left tests failing, submit."""
    actions = [m.content for m in history if m.role == "assistant"]
    if not actions:
        return _call_text("run_tests", {})
    if len(actions) == 1:
        return _call_text("edit", {"old": task["bug"], "new": task["fix"]})
    return "submit"


def codefix_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str,
                    rng: random.Random) -> str | None:
    """A wrong fix: the bug replaced by another wrong expression."""
    if '"edit"' not in action:
        return None
    return _call_text("edit", {"old": task["bug"], "new": task["wrong_fix"]})


@register_env("codefix")
def codefix_env() -> EnvSpec:
    return EnvSpec("codefix", make_codefix_task, CodeFixEnv, codefix_expert,
                   "SWE-like bug fixing graded by unit tests in the sandbox", codefix_mistake)
