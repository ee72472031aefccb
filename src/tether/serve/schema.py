"""The request schema of the rollout endpoint: the subset of OpenAI's API that tether serves.

Every request body is validated here before anything else runs (pydantic, strict types: a
string is not a number, a number is not a bool, NaN and infinities are refused). A body that
does not fit gets HTTP 400 with OpenAI's error shape and `param` naming the field, e.g.
`messages[0].role: field required` - never a 500 and never a traceback in the training log.
Fields OpenAI defines that change nothing here are ignored (`user`, `seed`, `tool_choice`, ...);
fields whose effect tether does not implement (`stop`, `echo`, `n` > 1, ...) are refused
rather than silently dropped. The full table: docs/errors.md, "The rollout endpoint".
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class RequestError(ValueError):
    """A request the endpoint refuses; `param` names the field (OpenAI's error `param`)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str = "{}"


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content"
                             + (" or tool_calls" if self.role == "assistant" else ""))
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionSpec(_Strict):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _Sampling(_Strict):
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, gt=0)
    n: int | None = Field(None, ge=1, le=1, description="one sample per request: send several requests (they are batched)")
    stream: bool | None = None  # true: the finished completion as server-sent events (tether.serve.sse)
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    episode_id: str | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _unsupported(self) -> "_Sampling":
        if self.stop:
            raise RequestError("stop", "custom stop sequences are not supported: the model stops at its own "
                               "end-of-turn token; drop the field")
        return self


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    max_completion_tokens: int | None = Field(None, gt=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)

    @model_validator(mode="after")
    def _prompt(self) -> "CompletionRequest":
        if not self.prompt:
            raise RequestError("prompt", "empty: give a string or a list of token ids (one prompt per request)")
        if isinstance(self.prompt, list) and any(t < 0 for t in self.prompt):
            raise RequestError("prompt", "token ids must be >= 0")
        if self.echo:
            raise RequestError("echo", "echo is not supported: drop the field")
        if self.suffix:
            raise RequestError("suffix", "suffix is not supported: drop the field")
        return self

    @property
    def new_tokens(self) -> int | None:
        return self.max_tokens


_HINTS = {"missing": "field required", "n": "n must be 1: send one request per sample (they are batched)",
          "best_of": "best_of must be 1: send one request per sample (they are batched)",
          "prompt": "prompt must be a string or a list of token ids (one prompt per request)"}


def format_param(loc: tuple) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _first_error(err: ValidationError) -> RequestError:
    """The first problem of a pydantic error as one RequestError naming the field."""
    e = err.errors()[0]
    ctx_err = (e.get("ctx") or {}).get("error")
    if isinstance(ctx_err, RequestError):
        return ctx_err
    # pydantic names the member of a union it tried ('str', 'list[TextPart]'): not a field
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "none"))))
    if "content" in loc:
        return RequestError(format_param(loc[:loc.index("content") + 1]), "must be a string, a list of "
                            "{\"type\": \"text\", \"text\": ...} parts, or null")
    param = format_param(loc)
    if e["type"] == "json_invalid":
        return RequestError(None, f"the request body is not valid JSON ({e['msg'].removeprefix('Invalid JSON: ')})")
    if e["type"] == "model_type" and not loc:
        return RequestError(None, "the request body must be a JSON object")
    top = str(loc[0]) if loc else ""
    if top in ("n", "best_of", "prompt") and len(loc) == 1:
        return RequestError(param, _HINTS[top])
    msg = _HINTS["missing"] if e["type"] == "missing" else str(e["msg"]).removeprefix("Value error, ")
    return RequestError(param or None, msg[0].lower() + msg[1:] if msg else msg)


def parse_request(body: bytes | str, kind: type[_Sampling]) -> Any:
    """The validated request of `kind` (ChatRequest or CompletionRequest); RequestError otherwise."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RequestError(None, f"the request body is not UTF-8 (byte {body[err.start]:#04x} at offset "
                                     f"{err.start}): send UTF-8 JSON") from None
    try:
        return kind.model_validate_json(body)
    except ValidationError as err:
        raise _first_error(err) from None
