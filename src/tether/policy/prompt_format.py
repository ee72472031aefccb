"""The two prompt formats and the mismatch warning, below every package that meets prompts (the
rollout endpoint, the health findings): which format a run used is decided in
`tether.rollout.prompt_format`, which reads run records and the task's kind."""

from __future__ import annotations

CHAT, RAW = "chat", "raw"


def describe(fmt: str) -> str:
    return "the chat template (data.chat=true or chat-message prompts)" if fmt == CHAT else "raw text prompts (data.chat=false)"


def mismatch_message(trained: str, used: str, where: str) -> str:
    """One line: what differs and the fix."""
    if used == CHAT:
        fix = ("send raw prompts (the agent: client.completions.create(prompt=task['prompt']); a run: data.chat=false), "
               "or train the model with data.chat=true")
    else:
        fix = ("send chat messages (the agent: client.chat.completions.create(messages=[{'role': 'user', 'content': "
               "task['prompt']}]); a run: data.chat=true), or train the model with data.chat=false")
    return (f"prompt format mismatch: {where} uses {describe(used)}, but the model was trained on {describe(trained)}; "
            f"its reward will stay near zero. Fix: {fix}")


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Print a mismatch warning once per process (every step's endpoint would repeat it)."""
    if message not in _warned:
        _warned.add(message)
        print(f"[tether] WARNING: {message}", flush=True)


def check_prompt_format(trained: str | None, used: str, where: str) -> str | None:
    """The mismatch message (also printed as a warning) when `used` differs from `trained`; None
    when they agree or the trained format is unknown."""
    if trained is None or trained == used:
        return None
    msg = mismatch_message(trained, used, where)
    warn_once(msg)
    return msg
