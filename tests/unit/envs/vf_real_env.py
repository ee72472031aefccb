"""Real `verifiers` environments for the adapter tests (tests/unit/envs/test_verifiers_real.py),
built from a local datasets.Dataset with the package's own classes (verifiers 0.2-0.3): a
SingleTurnEnv, a two-turn MultiTurnEnv and a ToolEnv with a calculator, each with a vf.Rubric."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

WORDS = ["apple", "banana", "cherry", "dates", "elder", "figs", "grape", "honey"]


def has_letter(completion, answer, **kwargs) -> float:
    """1 when the answer's first letter appears in the last reply (an easy, learnable target)."""
    return 1.0 if answer[0] in completion[-1]["content"] else 0.0


def short_reply(completion, **kwargs) -> float:
    return 1.0 if len(completion[-1]["content"]) < 40 else 0.0


class AreYouSure(vf.MultiTurnEnv):
    """Asks, then asks once more; the rubric scores the second reply."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Are you sure?"}]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: digits and + - * ( )
    """
    return str(eval(expression, {"__builtins__": {}}))  # the test's own inputs only


def says_answer(completion, answer, **kwargs) -> float:
    return 1.0 if completion[-1].get("content") == f"Answer: {answer}" else 0.0


def load_environment(kind: str = "single", n: int = 16):
    if kind == "tool":
        rows = [{"question": f"What is {a}+{a + 1}?", "answer": str(2 * a + 1)} for a in range(n)]
        return vf.ToolEnv(tools=[calculator], max_turns=3, dataset=Dataset.from_list(rows),
                          rubric=vf.Rubric(funcs=[says_answer], weights=[1.0]))
    rows = [{"question": f"Name a fruit like {w} ({i})", "answer": w} for i, w in enumerate(WORDS * (n // 8 + 1))][:n]
    rubric = vf.Rubric(funcs=[has_letter, short_reply], weights=[1.0, 0.5])
    common = dict(dataset=Dataset.from_list(rows), system_prompt="Answer with one word.", rubric=rubric)
    if kind == "multi":
        return AreYouSure(max_turns=2, **common)
    return vf.SingleTurnEnv(**common)
