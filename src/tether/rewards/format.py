"""Shape rewards: `format` (one well-formed answer block) and `length` (a length penalty).

The format reward is DeepSeek-R1's (arXiv:2501.12948, §2.2.2: reasoning in `<think>`, the answer
in `<answer>`); the length penalty is a plain linear one on the text, not Kimi k1.5's
group-relative length reward (arXiv:2501.12599, §2.3.3; see `algos/shaping.py`).

Format rewards are the easiest rewards to hack (docs/design.md, correctness rule 16): `<think></think>a` scored 1.0
in Soup#814, several answer blocks passed open-r1's check (PR#418), and a regex without DOTALL
scored every multi-line completion 0 (unsloth#1761). `check_format` therefore counts the tags
instead of trusting one permissive regex, and its probes are pinned in the tests. Score these
on text cut at the stop token (the caller does) so nothing after EOS can satisfy them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from tether.rewards.base import REWARD_FUNCTIONS

# DOTALL everywhere: reasoning and answers span lines (unsloth#1761).
_WITH_THINK = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(r"(?P<pre>.*?)<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)


def check_format(text: str, *, require_think: bool = False) -> str:
    """Why `text` is not well-formed, or "" when it is.

    Well-formed means:
    - exactly one `<answer>` and one `</answer>`, in that order, with non-blank content;
    - nothing but whitespace after `</answer>`;
    - `<think>...</think>` is optional (required with `require_think`); when present there is
      exactly one, it opens the text, has non-blank content and is followed only by whitespace
      before `<answer>`. Without a think block, free text before `<answer>` is allowed.
    """
    n_open, n_close = text.count("<answer>"), text.count("</answer>")
    if n_open != 1 or n_close != 1:
        return f"expected exactly one <answer>...</answer> block, found {n_open} open / {n_close} close tags"
    t_open, t_close = text.count("<think>"), text.count("</think>")
    if t_open == 0 and t_close == 0:
        if require_think:
            return "missing <think>...</think> block"
        match = _ANSWER_ONLY.fullmatch(text)
    elif t_open == 1 and t_close == 1:
        match = _WITH_THINK.fullmatch(text)
        if match is not None and not match.group("think").strip():
            return "empty <think> block"
    else:
        return f"expected at most one <think>...</think> block, found {t_open} open / {t_close} close tags"
    if match is None:
        return "blocks out of order, text outside the blocks, or text after </answer>"
    if not match.group("answer").strip():
        return "empty <answer> block"
    return ""


@REWARD_FUNCTIONS.register("format")
def format_reward(
    text: str, task: Mapping[str, Any], *, require_think: bool = False, pattern: str | None = None
) -> float:
    """1.0 if `text` is well-formed (see `check_format`), else 0.0.

    `pattern` replaces the built-in check with a user regex that must match the whole text
    (`re.fullmatch`, DOTALL); if it has a named group `answer`, that group must be non-blank.
    """
    if pattern is None:
        return 0.0 if check_format(text, require_think=require_think) else 1.0
    match = re.fullmatch(pattern, text, re.DOTALL)
    if match is None:
        return 0.0
    if "answer" in match.re.groupindex and not (match.group("answer") or "").strip():
        return 0.0
    return 1.0


_LENGTH_UNITS = {"chars": len, "words": lambda t: len(t.split())}


@REWARD_FUNCTIONS.register("length")
def length_reward(
    text: str, task: Mapping[str, Any], *, max_len: int = 1024, free_len: int = 0, unit: str = "chars"
) -> float:
    """A penalty in [-1, 0]: 0 up to `free_len`, falling linearly to -1 at `max_len` and beyond.

    Length is counted in `unit` ("chars" or "words") of the text; the component's weight sets
    the strength. (Token-level length shaping lives in `algos/shaping.py`; this one is for
    reward-side penalties that must be logged as their own component.)
    """
    if unit not in _LENGTH_UNITS:
        raise ValueError(f"length: unit must be one of {sorted(_LENGTH_UNITS)}, got {unit!r}")
    if max_len <= free_len:
        raise ValueError(f"length: max_len ({max_len}) must exceed free_len ({free_len})")
    n = _LENGTH_UNITS[unit](text)
    return -min(1.0, max(0, n - free_len) / (max_len - free_len))
