"""Chat templating and token-in/token-out context assembly (docs/design.md, correctness rules 1, 2 and 11).

Token ids are the only truth (docs/design.md, correctness rule 1). A multi-turn context is assembled from
*segments*: the ids an assistant sampled are spliced in verbatim, and only the text the chat
template puts *between* them (system/user/tool messages, role headers, the generation prompt)
is tokenised. A sampled id sequence therefore never goes through decode -> encode, so a string
that does not re-tokenise to its own ids (rllm PR#272: `' Pantom'` from [53122, 316] or
[393, 30002]) reaches the trainer unchanged.

How the segments are found: the conversation is rendered once with a unique sentinel string in
place of each assistant content; the rendered text is split at the sentinels. Each piece is
tokenised on its own (cached by text, so an unchanged piece has unchanged ids on every turn).
When a sampled action ends with a stop token whose text starts the following piece (ChatML's
`<|im_end|>`), that text is dropped from the piece: it is already in the sampled ids.

Prefix checks: with an append-only context, turn t+1's ids must extend turn t's context plus
its action. That holds when the template is prefix-preserving (rendering more messages never
changes the text of the earlier ones). `is_prefix_preserving` probes a tokenizer's template once
at start-up; the rollout counts per-turn violations as `tokenization_drift_count`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tether.errors import UserError
from tether.types import Message  # re-exported: defined with the other values that flow through a step

SENTINEL = "\u27e6tether-action-{}\u27e7"  # ⟦tether-action-k⟧: never produced by a template
_SENTINEL_RE = re.compile("\u27e6tether-action-(\\d+)\u27e7")


class TemplateError(UserError, ValueError):
    """The chat template cannot be used for token-in/token-out assembly; the message says why."""


try:  # transformers renders templates with jinja2; a template's raise_exception() is its TemplateError
    from jinja2.exceptions import TemplateError as _JinjaError
except ImportError:  # pragma: no cover - no jinja2: transformers cannot render templates at all
    _JinjaError = ValueError  # type: ignore[misc,assignment]
_TEMPLATE_FAILURES = (ValueError, TypeError, KeyError, _JinjaError)


class TokenizationDrift(RuntimeError):
    """A new context does not extend the previous context + action (rollout.on_drift=fail)."""


def encode_prompt(tokenizer, problem: Mapping[str, Any], chat: bool = False) -> list[int]:
    """Prompt token ids of a single-turn problem: raw text, or the chat template with a generation
    prompt (always for a problem whose prompt is a list of chat messages, e.g. verl's parquet layout).
    A template that is missing or refuses the messages is a TemplateError naming the setting."""
    if chat or problem.get("messages"):
        msgs = problem.get("messages") or [{"role": "user", "content": problem["prompt"]}]
        try:
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        except _TEMPLATE_FAILURES as err:
            raise template_failure(tokenizer, problem, chat, err) from None
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    return list(tokenizer.encode(problem["prompt"], add_special_tokens=True))


def template_failure(tokenizer, problem: Mapping[str, Any], chat: bool, err: BaseException) -> TemplateError:
    """transformers' "no chat_template" ValueError, or the template's own `raise_exception` (jinja2),
    as one line: why the template is used (data.chat, or chat-message rows) and what to do."""
    why = "data.chat=true" if chat else f"data.prompt_key (problem {problem.get('id')!r} is chat messages)"
    detail = " ".join(str(err).split())[:200] or type(err).__name__
    if getattr(tokenizer, "chat_template", None) is None:
        other = "set data.chat=false" if chat else "store the prompts as plain text"
        return TemplateError(f"{why} needs a chat template, but the model's tokenizer has none: use a chat model "
                             f"(or add chat_template to its tokenizer_config.json), or {other}")
    return TemplateError(f"{why}: the model's chat template refuses the messages ({detail}); fix the messages "
                         "(e.g. roles this template accepts) or the template")


def decode_completion(tokenizer, token_ids: Sequence[int], stop_ids: Sequence[int]) -> str:
    """Completion text of sampled ids, cut at (and without) the stop token."""
    ids = list(token_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


@dataclass(frozen=True)
class Segment:
    """A run of context ids; `is_action` marks sampled (or demonstrated) assistant ids."""

    ids: tuple[int, ...]
    is_action: bool


def render_chat(tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                add_generation_prompt: bool = True) -> str:
    """The chat template's text for `messages` (dicts with role/content), tools rendered by
    the template's own `tools` block (transformers `apply_chat_template(tools=...)`)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError(f"{type(tokenizer).__name__} has no chat_template; multi-turn environments need one")
    try:
        return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                             add_generation_prompt=add_generation_prompt, tokenize=False)
    except _TEMPLATE_FAILURES as err:  # the template's own raise_exception (roles it refuses, tools it lacks)
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise TemplateError(f"the model's chat template refuses this conversation ({detail}): a multi-turn "
                            "environment needs a template that renders its roles (and tools); use a chat model whose "
                            "template does, or fix the template") from None


def encode_text(tokenizer, text: str) -> tuple[int, ...]:
    """Ids of a template piece. Special-token strings (`<|im_start|>`) map to their ids."""
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()


def compute_segments(
    tokenizer,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    stop_ids: Sequence[int],
    cache: dict[str, tuple[int, ...]] | None = None,
    add_generation_prompt: bool = True,
) -> list[Segment]:
    """Context segments of a conversation: template pieces (tokenised) and actions (verbatim).

    Assistant messages with `action_ids` become action segments; every other message is
    rendered as text. `cache` maps piece text -> ids (pass one dict per episode or rollout).
    """
    cache = {} if cache is None else cache
    actions: list[tuple[int, ...]] = []
    dicts = []
    for m in messages:
        if m.role == "assistant" and m.action_ids is not None:
            dicts.append({"role": "assistant", "content": SENTINEL.format(len(actions))})
            actions.append(tuple(m.action_ids))
        else:
            dicts.append(m.to_dict())
    text = render_chat(tokenizer, dicts, tools, add_generation_prompt)
    pieces = _SENTINEL_RE.split(text)  # [piece, k, piece, k, piece, ...]
    found = [int(k) for k in pieces[1::2]]
    if found != list(range(len(actions))):
        raise TemplateError(
            f"the chat template rendered assistant contents {found}, expected {list(range(len(actions)))} in order: "
            "it must render each assistant message's content verbatim for token-in/token-out assembly"
        )
    stop_texts = {s: tokenizer.decode([s], skip_special_tokens=False) for s in stop_ids}
    segments: list[Segment] = []
    for i, piece in enumerate(pieces[0::2]):
        if i > 0:
            action = actions[i - 1]
            segments.append(Segment(action, True))
            if action and action[-1] in stop_texts and piece.startswith(stop_texts[action[-1]]):
                piece = piece[len(stop_texts[action[-1]]):]  # the sampled stop token closed the turn
        if piece not in cache:
            cache[piece] = encode_text(tokenizer, piece)
        if cache[piece]:
            segments.append(Segment(cache[piece], False))
    return segments


def compute_context_ids(tokenizer, messages: Sequence[Message], tools, stop_ids: Sequence[int],
                        cache: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The ids the model sees for `messages` plus the generation prompt (see module docstring)."""
    return tuple(t for s in compute_segments(tokenizer, messages, tools, stop_ids, cache) for t in s.ids)


def compute_end_of_turn_id(tokenizer, stop_ids: Sequence[int]) -> int:
    """The stop id that the template writes right after an assistant's content (ChatML:
    `<|im_end|>`): what a demonstration must end with so that SFT teaches the model to stop."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": SENTINEL.format(0)}]
    probe = render_chat(tokenizer, msgs, add_generation_prompt=False)
    after = probe.split(SENTINEL.format(0), 1)[-1]
    for s in stop_ids:
        text = tokenizer.decode([s], skip_special_tokens=False)
        if text and after.startswith(text):
            return int(s)
    return int(stop_ids[0])


def is_prefix_preserving(tokenizer, tools: Sequence[Mapping[str, Any]] | None = None) -> tuple[bool, str]:
    """Whether rendering a longer conversation keeps the text of every shorter one as a prefix.

    Probes system / user / assistant / tool / assistant / user turns: for each assistant turn k,
    render(messages[:k], generation prompt) + content_k must be a prefix of the render of the
    whole conversation. A template that rewrites history (e.g. strips earlier reasoning,
    trl#6361) fails, and append-only contexts would then drift. Returns (ok, reason).
    """
    msgs = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "Let me compute."},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "Thanks."},
    ]
    try:
        full = render_chat(tokenizer, msgs, tools, add_generation_prompt=True)
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            head = render_chat(tokenizer, msgs[:k], tools, add_generation_prompt=True) + m["content"]
            if not full.startswith(head):
                at = next((i for i, (a, b) in enumerate(zip(full, head)) if a != b), min(len(full), len(head)))
                where = f"char {at}: {full[at:at + 40]!r}"
                return False, f"rendering message {k} ({m['role']}) changes earlier text at {where}"
    except Exception as err:  # a template that cannot render the probe is not usable either
        return False, f"{type(err).__name__}: {err}"
    return True, "ok"
