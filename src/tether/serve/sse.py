"""OpenAI streaming (`stream: true`) for the rollout endpoint: a finished completion sent as server-sent
events. tether samples a completion whole, so the stream is that completion in one delta, then the
finish reason, then the usage when `stream_options.include_usage` asks for it, then `[DONE]` — what an
OpenAI client reassembles into the same message. verifiers 0.4's agent programs always stream."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping


def completion_events(result: Mapping[str, Any], include_usage: bool) -> Iterator[str]:
    """The SSE lines of a chat.completion or text_completion `result` (tether's response body)."""
    chat = result["object"] == "chat.completion"
    head = {k: result[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    extra = {k: result[k] for k in ("prompt_token_ids", "policy_version", "episode_id") if k in result}
    for choice in result["choices"]:
        if chat:
            msg = choice["message"]
            delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
            body = {"index": choice["index"], "delta": delta, "finish_reason": None, "logprobs": choice.get("logprobs"),
                    "token_ids": choice.get("token_ids")}
        else:
            body = {"index": choice["index"], "text": choice["text"], "finish_reason": None,
                    "logprobs": choice.get("logprobs"), "token_ids": choice.get("token_ids")}
        yield _event({**head, **extra, "choices": [body]})
        end = {"index": choice["index"], "finish_reason": choice["finish_reason"]}
        yield _event({**head, "choices": [{**end, "delta": {}} if chat else {**end, "text": ""}]})
    if include_usage:
        yield _event({**head, "choices": [], "usage": result["usage"]})
    yield "data: [DONE]\n\n"


def _event(obj: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"
