"""A verifiers 0.4 taskset for tether's tests (imported by verifiers in `.venv-verifiers`, never by
tether): reverse a short word, reward 1 for the exact reversal."""

import verifiers.v1 as vf

WORDS = ["abc", "hello", "cat", "dog", "sun", "tree", "bird", "fish"]


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        content = trace.last_message.content if trace.messages else ""
        return 1.0 if isinstance(content, str) and content.strip() == self.data.answer else 0.0


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 8


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        return [ReverseTask(ReverseData(prompt=f"reverse {w}:", answer=w[::-1]), self.config.task)
                for w in WORDS[: self.config.num_tasks]]


__all__ = ["ReverseTaskset"]
