"""Misbehaving test environments and helpers for the multi-turn tests (registered once as
`_test_tools`)."""

from __future__ import annotations

import time
from typing import Any, Mapping

from tether.envs import ENVS, Action, EnvSpec, Observation, StepResult, make_tool, register_env
from tether.envs.tools import compute_tool_info, compute_tool_messages, run_tool_calls
from tether.policy.chat import Message

SENTINEL_TEXT = "<|endoftext|>"  # a special token that appears nowhere but in the sentinel tool's output


def encode_action(tok, text: str, stop: bool = True) -> list[int]:
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] if stop else ids




def sentinel_tool(word: str) -> str:
    """Echo a word followed by the sentinel.

    Args:
        word: any word
    """
    return f"{word} {SENTINEL_TEXT}"


def raising_tool(x: str) -> str:
    """Always raises.

    Args:
        x: ignored
    """
    raise ValueError("tool exploded")


def slow_tool(x: str) -> str:
    """Sleeps past its timeout.

    Args:
        x: ignored
    """
    time.sleep(30.0)  # far past any deadline a test sets, so a loaded machine cannot blur the two
    return "late"


GARBAGE = {  # what a buggy env.step might return
    "dict": {"reward": 1.0},
    "nan": StepResult(Observation(()), float("nan")),
    "obs": StepResult(Observation(("plain text",))),  # type: ignore[arg-type]
    "info": StepResult(Observation(()), info=None),  # type: ignore[arg-type]
    "counter": StepResult(Observation(()), info={"tool_calls": "many"}),
}


class ToolEnv:
    """Calls tools while the action has tool calls; a plain reply ends the episode with reward 1
    when it says 'done'. `task["fail"]` selects a failure: reset | step | garbage | hang."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.tools = (make_tool(sentinel_tool), make_tool(raising_tool), make_tool(slow_tool, timeout_s=0.2))

    def reset(self) -> Observation:
        if self.task.get("fail") == "reset":
            raise RuntimeError("reset exploded")
        return Observation((Message("system", "test env"), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        fail = self.task.get("fail")
        if fail == "step":
            raise RuntimeError("step exploded")
        if fail == "garbage":
            return GARBAGE[self.task["kind"]]  # type: ignore[return-value]
        if fail == "hang":
            time.sleep(30.0)  # abandoned on a daemon thread
        p = action.parsed
        if p.calls or p.errors:
            results = run_tool_calls({t.name: t for t in self.tools}, p.calls, timeout_s=5.0)
            return StepResult(Observation(tuple(compute_tool_messages(results, p.errors))), 0.0, False,
                              compute_tool_info(results, p.errors))
        ok = "done" in action.text
        return StepResult(Observation(()), 1.0 if ok else 0.0, True, {"correct": ok})


def _tool_task(rng, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"t{i}", "prompt": f"task {i}", "answer": "done", **kw}


if "_test_tools" not in ENVS:
    register_env("_test_tools")(lambda: EnvSpec("_test_tools", _tool_task, ToolEnv, None, "test env"))


def tool_task(i: int = 0, **kw: Any) -> dict[str, Any]:
    return {"env": "_test_tools", **_tool_task(None, i, kw)}
