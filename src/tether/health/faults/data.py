"""Data faults: wrong gold answers, a loader stuck on one batch, truncated prompts."""

from __future__ import annotations

from tether.health.faults import Fault, register_fault


def _shift_answer(answer: str, k: int) -> str:
    try:
        return str(int(answer) + k)
    except ValueError:
        return answer[::-1] + "x" * k


@register_fault
class LabelCorruption(Fault):
    """A fixed fraction of problems carries a wrong gold answer (a bad join in data prep):
    those problems can never be solved and push the policy away from right answers."""

    name, family, cause, seam = "label_corruption", "data", "data_corruption", "data"
    severities = {"subtle": {"p": 0.35}, "obvious": {"p": 0.8}}

    def on_problems(self, problems, step):
        out = []
        for p in problems:
            if self.coin("label", p.get("id")) < self.p["p"]:
                p = dict(p, answer=_shift_answer(str(p["answer"]), 1 + int(self.coin("k", p.get("id")) * 5)))
            out.append(p)
        return out


@register_fault
class DataRepetition(Fault):
    """The loader hands out the same problems step after step (an epoch counter that never
    advances): the policy memorises a handful of prompts."""

    name, family, cause, seam = "data_repetition", "data", "data_repetition", "data"
    severities = {"subtle": {"p": 0.6}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        if not hasattr(self, "_frozen"):
            self._frozen = list(problems)
        keep = [q for i, q in enumerate(self._frozen) if self.coin("rep", i) < self.p["p"]]
        return (keep + problems[len(keep):])[: len(problems)]


@register_fault
class PromptTruncation(Fault):
    """A fraction of prompts lose their second half (a max-length cut in preprocessing): the
    question can no longer be answered from the prompt."""

    name, family, cause, seam = "prompt_truncation", "data", "data_corruption", "data"
    severities = {"subtle": {"p": 0.35}, "obvious": {"p": 0.9}}

    def on_problems(self, problems, step):
        out = []
        for p in problems:
            if self.coin("trunc", p.get("id")) < self.p["p"] and len(p["prompt"]) > 1:
                p = dict(p, prompt=p["prompt"][: max(1, len(p["prompt"]) // 2)])
            out.append(p)
        return out
