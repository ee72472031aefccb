"""Math word problems with a calculator tool (GSM8K-like; Cobbe et al., arXiv 2110.14168 §2).

Generated, offline and deterministic: each problem is a short story with two arithmetic steps,
e.g. "Ann has 12 pens. She buys 3 boxes with 4 pens each. How many pens does Ann have now?"
(12 + 3*4 = 24). The agent may call `calculator` any number of times
(`<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>`, or the
bare JSON call) and ends the episode with a reply without tool calls — `Answer: 24`. Reward 1
when the reply's number equals the answer, else 0 (terminal only); `info["correct"]` is the
success metric. The scripted expert calls the calculator once per step, then answers; its
mistakes (`sft.demo_noise`) are wrong final answers.

Task kwargs: `max_value` (largest operand, default 12), `templates` (indices into TEMPLATES).
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any, Mapping, Sequence

from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.envs.tools import Tool, compute_tool_info, compute_tool_messages, make_tool, run_tool_calls
from tether.types import Message

SYSTEM = "Use the calculator for arithmetic. End with: Answer: <number>"
NAMES = ("Ann", "Bob", "Cal", "Dee", "Eva", "Fin")
ITEMS = ("pens", "eggs", "cards", "coins", "books", "apples")

# (story, first step, second step) with placeholders a, b, c; {x} is the first step's result.
TEMPLATES: tuple[tuple[str, str, str], ...] = (
    ("{n} has {a} {i}. {n} buys {b} boxes with {c} {i} each. How many {i} does {n} have now?", "{b}*{c}", "{a}+{x}"),
    ("{n} had {a} {i} and gave away {b}. Then {n} found {c} more. How many {i} does {n} have?", "{a}-{b}", "{x}+{c}"),
    ("A box holds {a} {i}. {n} fills {b} boxes and then loses {c} {i}. How many {i} are left?", "{a}*{b}", "{x}-{c}"),
    ("{n} has {a} bags of {b} {i} and {c} loose {i}. How many {i} in total?", "{a}*{b}", "{x}+{c}"),
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax {type(node).__name__}: only numbers, + - * / // % and parentheses")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. 3*4+2
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    value = _eval(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6) if isinstance(value, float) else value)


def make_calc_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """One problem: story, answer and the expert's calculator expressions."""
    hi = int(kw.get("max_value", 12))
    story, first, second = TEMPLATES[rng.choice(list(kw.get("templates", range(len(TEMPLATES)))))]
    while True:
        a, b, c = (rng.randint(2, hi) for _ in range(3))
        x = int(calculator(first.format(a=a, b=b, c=c)))
        answer = int(calculator(second.format(a=a, b=b, c=c, x=x)))
        if x >= 0 and answer >= 0:
            break
    prompt = story.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b, c=c)
    steps = [first.format(a=a, b=b, c=c), second.format(a=a, b=b, c=c, x=x)]
    return {"id": f"calc-{i}", "prompt": prompt, "answer": str(answer), "steps": steps}


def parse_answer(text: str) -> str | None:
    """The number after the last `Answer:` (else the last number in the text)."""
    m = re.findall(r"Answer:\s*(-?\d+(?:\.\d+)?)", text) or re.findall(r"-?\d+(?:\.\d+)?", text)
    return m[-1] if m else None


class CalcEnv:
    """One episode of a calc problem (single use; owns its turn counter)."""

    def __init__(self, task: Mapping[str, Any], tool_timeout_s: float = 5.0) -> None:
        self.task = task
        self.tools: tuple[Tool, ...] = (make_tool(calculator, timeout_s=tool_timeout_s),)
        self.calls = 0

    def reset(self) -> Observation:
        return Observation((Message("system", SYSTEM), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        parsed = action.parsed
        if parsed.calls or parsed.errors:
            results = run_tool_calls({t.name: t for t in self.tools}, parsed.calls, timeout_s=None)
            self.calls += len(results)
            info = {**compute_tool_info(results, parsed.errors), "correct": False}
            return StepResult(Observation(tuple(compute_tool_messages(results, parsed.errors))), 0.0, False, info)
        got = parse_answer(action.text)
        correct = got is not None and float(got) == float(self.task["answer"])
        return StepResult(Observation(()), 1.0 if correct else 0.0, True, {"correct": correct, "answer": got})


def calc_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    """One calculator call per step, then the answer."""
    done = sum(m.role == "tool" for m in history)
    steps = task["steps"]
    if done < len(steps):
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % steps[done]
    return f"Answer: {task['answer']}"


def calc_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str, rng: random.Random) -> str | None:
    """A weak teacher's wrong answer (`sft.demo_noise`): off by one or two, or the first step's result."""
    if not action.startswith("Answer:"):
        return None
    first = calculator(task["steps"][0])
    wrong = [str(int(task["answer"]) + d) for d in (-2, -1, 1, 2)] + ([first] if first != task["answer"] else [])
    return f"Answer: {rng.choice(wrong)}"


@register_env("calc")
def calc_env() -> EnvSpec:
    return EnvSpec("calc", make_calc_task, CalcEnv, calc_expert, "GSM8K-like word problems with a calculator tool",
                   calc_mistake)
