"""A verifiers-style environment for the adapter tests: `load_environment()` returns an object
with verifiers' documented interface (dataset, system_prompt, max_turns, async env_response,
a rubric of weighted async/sync reward functions), defined here rather than from a hub."""

from __future__ import annotations

from datasets import Dataset


class Rubric:
    def __init__(self, funcs, weights):
        self.funcs, self.weights = funcs, weights


async def mentions_answer(completion, answer) -> float:
    """1 when the answer's first letter appears in the final reply (an easy, learnable target)."""
    return 1.0 if answer[0] in completion[-1]["content"] else 0.0


def short_reply(completion, **kwargs) -> float:
    return 1.0 if len(completion[-1]["content"]) < 40 else 0.0


class TwoTurnEnv:
    """Asks, then asks again once ("Are you sure?"); the rubric scores the second reply."""

    def __init__(self, n: int) -> None:
        words = ["apple", "banana", "cherry", "dates", "elder", "figs", "grape", "honey"]
        self.dataset = Dataset.from_list([{"question": f"Name a fruit like {w} ({i})", "answer": w}
                                          for i, w in enumerate(words * (n // len(words) + 1))][:n])
        self.system_prompt = "Answer with one word."
        self.max_turns = 2
        self.rubric = Rubric([mentions_answer, short_reply], [1.0, 0.5])
        self.calls = 0

    async def env_response(self, messages, state):
        self.calls += 1
        return [{"role": "user", "content": "Are you sure?"}], state


def load_environment(n: int = 40) -> TwoTurnEnv:
    return TwoTurnEnv(n)
