"""What a data row's gold answer and prompt mean, in the layouts real datasets use (docs/errors.md).

Gold answers (`data.answer_key`, verl's `reward_model.ground_truth`, a JSONL `answer`):

| stored as | read as |
|---|---|
| a string | that answer (a GSM8K solution is reduced to its final answer by the verifiers) |
| an int, or a float | its text: 42 -> "42", 3.0 -> "3", 0.5 -> "0.5" |
| a list of strings/numbers | acceptable answers, any one counts (verl's search_r1_like_qa_em `em_check`) |
| a dict with "target" | its target, read as above (Search-R1's `{"target": [...]}`, verl's qa_em reward) |
| a string holding a JSON object, or a JSON list of strings | the decoded value, read as above (verl stores ground truths as JSON strings) |

Refused, with the file, row and field: null, an empty string, a boolean, NaN/infinity, an empty
list, a list holding lists or dicts, a dict without "target" (e.g. prime_code's test cases
`{"inputs", "outputs"}`: a text verifier can never match them), any other type. A string that
only looks like JSON ("[1, 2]", an interval; "{1, 2}", a set) stays the literal answer.

Prompts (`data.prompt_key`): a non-empty string; a list of chat messages `{"role", "content"}`
(verl) or ShareGPT's `{"from": human|gpt|system, "value"}`; content given as a list of text parts
(`[{"type": "text", "text": ...}]`) is joined; a string holding a JSON list of such messages is
decoded. Refused: an empty string or list, a message without a known role or without text
content, non-text parts (images), any other type.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from tether.tasks import DataError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
                  "tool": "tool"}


class FieldError(DataError):
    """A data field whose value cannot mean what the field needs; the message names file, row and field."""


def _json_value(text: str) -> Any:
    """The decoded value of a string that holds a JSON object, or a JSON list of strings; else the string."""
    s = text.strip()
    if not (s.startswith("{") and s.endswith("}")) and not (s.startswith("[") and s.endswith("]")):
        return text
    try:
        value = json.loads(s)
    except ValueError:
        return text
    if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        return value
    return text


def _scalar_text(value: Any, where: str) -> str:
    """One gold answer as text (a string or a finite number); FieldError otherwise."""
    if value is None:
        raise FieldError(f"{where} is null; every row needs its gold answer")
    if isinstance(value, bool):
        raise FieldError(f"{where} is a boolean ({value}); store the answer as text (e.g. \"yes\" / \"true\")")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FieldError(f"{where} is {value}; a gold answer must be a finite number or text")
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, str):
        if not value.strip():
            raise FieldError(f"{where} is an empty string; every row needs its gold answer "
                             "(an empty one would reward an empty completion)")
        return value
    raise FieldError(f"{where} is a {type(value).__name__}; expected text, a number, a list of acceptable answers "
                     "or {\"target\": [...]}")


def read_gold_answers(value: Any, where: str) -> list[str]:
    """The acceptable gold answers stored in one field (module docstring); `where` names file, row and field."""
    if value is None:
        raise FieldError(f"{where} is null; every row needs its gold answer")
    if isinstance(value, str):
        value = _json_value(value)
    if isinstance(value, Mapping):
        if "target" not in value:
            raise FieldError(f"{where} is a mapping with keys {sorted(map(str, value))[:8]} and no \"target\"; tether's "
                             "verifiers compare text answers: store the answer as text, a list of answers or "
                             "{\"target\": [...]}, or point data.answer_key at a text column")
        if isinstance(value["target"], Mapping):
            _refuse_nested(f"{where}.target")
        return read_gold_answers(value["target"], f"{where}.target")
    if isinstance(value, (list, tuple)):
        if not value:
            raise FieldError(f"{where} is an empty list; give at least one acceptable answer")
        out = []
        for i, v in enumerate(value):
            if isinstance(v, (list, tuple, Mapping)):
                _refuse_nested(f"{where}[{i}]")
            out.append(_scalar_text(v, f"{where}[{i}]"))
        return out
    return [_scalar_text(value, where)]


def _refuse_nested(where: str) -> None:
    raise FieldError(f"{where} is nested (a list or mapping inside the answers); give each acceptable answer as "
                     "text or a number")


def _content_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)) and content:
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise FieldError(f"{where} part {j} is {kind!r}, not text; tether trains text-only models")
        return "".join(texts)
    raise FieldError(f"{where} has no text content (got {type(content).__name__}); give \"content\" as a string")


def read_messages(value: Any, where: str) -> list[dict[str, str]]:
    """Chat messages ({role, content}, or ShareGPT's {from, value}) as [{"role", "content"}]."""
    if not isinstance(value, (list, tuple)):
        raise FieldError(f"{where} must be a list of chat messages, got {type(value).__name__}")
    if not value:
        raise FieldError(f"{where} is an empty list of messages")
    msgs = []
    for i, m in enumerate(value):
        at = f"{where} message {i}"
        if not isinstance(m, Mapping):
            raise FieldError(f"{at} must be {{\"role\": ..., \"content\": ...}}, got {type(m).__name__}")
        if "role" in m or "from" not in m:
            role = m.get("role")
            if role not in ROLES:
                raise FieldError(f"{at} has role {role!r}; a message needs \"role\": one of {', '.join(ROLES)}")
            content = _content_text(m.get("content"), at)
        else:  # ShareGPT
            role = SHAREGPT_ROLES.get(str(m.get("from")).lower())
            if role is None:
                raise FieldError(f"{at} has \"from\": {m.get('from')!r}; ShareGPT messages need one of "
                                 f"{', '.join(SHAREGPT_ROLES)}")
            content = _content_text(m.get("value"), at)
        msgs.append({"role": role, "content": content})
    return msgs


def read_prompt(value: Any, where: str) -> tuple[str, list[dict[str, str]] | None]:
    """(prompt text, chat messages or None) of a prompt field (module docstring)."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") and s.endswith("]"):
            try:
                decoded = json.loads(s)
            except ValueError:
                decoded = None
            if isinstance(decoded, list) and decoded and all(isinstance(m, Mapping) for m in decoded):
                value = decoded  # a JSON string of messages
    if isinstance(value, str):
        if not value.strip():
            raise FieldError(f"{where} is an empty string")
        return value, None
    if isinstance(value, (list, tuple)):
        msgs = read_messages(value, where)
        return "\n".join(m["content"] for m in msgs), msgs
    raise FieldError(f"{where} must be a string or a list of chat messages, got {type(value).__name__}")
