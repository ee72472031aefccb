"""An OpenAI-compatible rollout endpoint served by tether's own sampler (exact token capture).

    with RolloutServer(policy, SamplingConfig()) as server:      # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=server.episode_url("ep-1"), api_key=server.api_key)
        r = client.chat.completions.create(model="tether", messages=[...], tools=[...], logprobs=True)
        r.choices[0].token_ids, r.policy_version                 # the sampled ids, the weight version
        turns = server.pop_episode("ep-1")                      # tether Turns: trained on as sampled

`POST /v1/chat/completions` and `POST /v1/completions` answer in OpenAI's format and add, per
choice, `token_ids` (the sampled ids, stop token included) and per response `prompt_token_ids`,
`policy_version` and `episode_id`; `logprobs=true` gives one log-prob per sampled token (of the
distribution sampled from; `top_logprobs` are not computed and come back empty).

Exact token capture (the AReaL / Agent Lightning proxy idea, arXiv 2508.03680): calls that
share an episode id — the `/episodes/<id>/v1` base URL, an `episode_id` body field, or an
`X-Tether-Episode` header — are one trajectory. A later call's context is assembled token-in /
token-out (`tether.policy.chat`): the k-th assistant message that the agent sends back is
replaced by the ids tether sampled for the episode's k-th completion when its content and tool
calls are what tether returned, so re-tokenising the conversation never changes the trained
tokens; an assistant message the agent rewrote is rendered as text and counted
(`template_mismatches`).

Requests are validated against the schema of the OpenAI subset served (`tether.serve.schema`):
a malformed one gets HTTP 400 naming the field (`messages[0].role: field required`), never a 500
or a traceback in the training log. A chat request against a model trained on raw prompts (or a
raw completion request against a chat-trained one, `prompt_format`) is counted and warned about
at its first occurrence (`tether.rollout.prompt_format`).

Generation runs on one thread that batches concurrent requests with equal sampling settings
(many agent processes, one batched `run_generate` call). The server binds 127.0.0.1 by default;
bound to any other address it requires `token`, and every request must carry
`Authorization: Bearer <token>`.
"""

from __future__ import annotations

import ipaddress
import json
import queue
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from tether.policy.config import SamplingConfig
from tether.envs.tools import parse_tool_calls
from tether.errors import UserError
from tether.policy.chat import Message, compute_context_ids
from tether.policy.hf import HFPolicy, run_generate
from tether.policy.prompt_format import CHAT, RAW, mismatch_message, warn_once
from tether.serve.schema import ChatMessage, ChatRequest, CompletionRequest, RequestError, parse_request
from tether.serve.sse import completion_events
from tether.types import Sample, StopReason, Turn

try:  # the optional `serve` extra; module level, so FastAPI can resolve the handlers' annotations
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse, StreamingResponse
except ImportError:  # pragma: no cover - reported when a server is built
    FastAPI = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Completion:
    """One served completion: the context the model saw, what it sampled, and what was returned."""

    context_ids: tuple[int, ...]
    sample: Sample
    message: Mapping[str, Any]  # the assistant message as returned (content, tool_calls)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Batcher:
    """The one thread that samples: requests with equal settings that arrive within `wait_s`
    of each other are generated in one `run_generate` call."""

    def __init__(self, policy: HFPolicy, generator: torch.Generator, wait_s: float, max_batch: int) -> None:
        self.policy, self.generator, self.wait_s, self.max_batch = policy, generator, wait_s, max_batch
        self.requests: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="tether-serve-sampler")
        self.thread.start()

    def submit(self, prompt_ids: Sequence[int], sampling: SamplingConfig, greedy: bool = False) -> Sample:
        fut: Future = Future()
        key = (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, greedy)
        self.requests.put((tuple(prompt_ids), key, (sampling, greedy), fut))
        return fut.result()

    def close(self) -> None:
        self.requests.put(None)
        self.thread.join(10.0)

    def _loop(self) -> None:
        while (first := self.requests.get()) is not None:
            batch, deadline = [first], time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                try:
                    item = self.requests.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self.requests.put(None)
                    break
                batch.append(item)
            for key in dict.fromkeys(b[1] for b in batch):  # one call per distinct setting
                group = [b for b in batch if b[1] == key]
                sampling, greedy = group[0][2]
                try:
                    with torch.no_grad():
                        out = run_generate(self.policy, [b[0] for b in group], sampling, self.generator, greedy=greedy)
                    for b, sample in zip(group, out):
                        b[3].set_result(sample)
                except Exception as err:  # reported to each waiting request, the server lives on
                    for b in group:
                        b[3].set_exception(err)


@dataclass(frozen=True)
class Batching:
    """How the generation thread batches concurrent requests: it waits `wait_s` for more, up to
    `max_batch` contexts in one `run_generate` call; `model_name` is the name the endpoint answers to."""

    wait_s: float = 0.01
    max_batch: int = 64
    model_name: str = "tether"


class RolloutServer:
    """The endpoint (see module docstring). `close()` (or the context manager) stops it."""

    def __init__(self, policy: HFPolicy, sampling: SamplingConfig, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, seed: int = 0, batching: Batching = Batching(),
                 prompt_format: str | None = None) -> None:
        batch_wait_s, max_batch, model_name = batching.wait_s, batching.max_batch, batching.model_name
        if not is_loopback(host) and not token:
            raise ValueError(f"serve host {host!r} is not a loopback address: set a token; every request must "
                             "then carry 'Authorization: Bearer <token>'")
        if FastAPI is None:
            raise ImportError("the rollout endpoint needs fastapi and uvicorn: pip install 'tether[serve]'")
        import uvicorn

        self.policy, self.sampling, self.token, self.model_name = policy, sampling, token, model_name
        self.api_key = token or "tether-local"
        self._episodes: dict[str, list[Completion]] = {}
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, ...]] = {}
        self.template_mismatches = 0
        # the format the model was trained on ("chat" | "raw" | None: unknown); requests in the other are counted
        self.prompt_format, self.format_mismatches = prompt_format, 0
        self.format_requests = {CHAT: 0, RAW: 0}  # requests by the format they render the prompt in
        self.format_warning: str | None = None
        self._batcher = _Batcher(policy, torch.Generator().manual_seed(seed), batch_wait_s, max_batch)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self._build_app(), log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="tether-serve")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            self.close()
            raise RuntimeError(f"the rollout endpoint did not start on {host}:{self.port}")

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def episode_url(self, episode_id: str) -> str:
        """A base URL whose calls all belong to `episode_id` (hand it to an unmodified agent)."""
        return self.base_url.removesuffix("/v1") + f"/episodes/{episode_id}/v1"

    def pop_episode(self, episode_id: str) -> list[Turn]:
        """The episode's completions as tether Turns (context ids, sampled ids, log-probs), in order."""
        with self._lock:
            done = self._episodes.pop(episode_id, [])
        return [Turn(context_ids=c.context_ids, action_ids=c.sample.token_ids, action_logprobs=c.sample.logprobs,
                     finish=c.sample.finish, policy_version=c.sample.policy_version, action_kept=c.sample.kept)
                for c in done]  # action_kept: the truncation a top-k/top-p request sampled under (rollout.sampling.keep_mask)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)
        self._batcher.close()

    def __enter__(self) -> "RolloutServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- requests

    def _sampling(self, req: ChatRequest | CompletionRequest) -> tuple[SamplingConfig, bool]:
        """The request's sampling settings over the run's; temperature 0 is greedy."""
        update: dict[str, Any] = {}
        if req.temperature is not None and req.temperature > 0:
            update["temperature"] = float(req.temperature)
        if req.top_p is not None:
            update["top_p"] = float(req.top_p)
        if req.new_tokens:
            update["max_new_tokens"] = int(req.new_tokens)
        greedy = req.temperature is not None and req.temperature == 0
        return (self.sampling.model_copy(update=update) if update else self.sampling), greedy

    def _check_prompt(self, context: Sequence[int], param: str, used: str | None) -> None:
        """The prompt must leave room to sample; a request in the other prompt format is counted."""
        room = self.policy.max_positions - len(context)
        if room < 1:
            raise RequestError(param, f"the prompt is {len(context)} tokens: no room to sample in the model's "
                                      f"{self.policy.max_positions} positions; shorten it")
        if used is None:
            return
        with self._lock:
            self.format_requests[used] += 1
            if self.prompt_format is None or used == self.prompt_format:
                return
            self.format_mismatches += 1
            first, self.format_warning = self.format_warning is None, self.format_warning or mismatch_message(
                self.prompt_format, used, "the agent (POST /v1/" + ("chat/completions)" if used == CHAT else "completions)"))
        if first:  # at the first episode that shows it (once per process)
            warn_once(self.format_warning)

    def _record(self, episode: str | None, context: Sequence[int], sample: Sample, message: Mapping[str, Any]) -> None:
        if episode:
            with self._lock:
                self._episodes.setdefault(episode, []).append(Completion(tuple(context), sample, message))

    def _chat_messages(self, episode: str | None, messages: Sequence[ChatMessage]) -> list[Message]:
        """Request messages -> tether Messages; assistant turns tether sampled keep their ids."""
        with self._lock:
            done = list(self._episodes.get(episode or "", []))
        out, k = [], 0
        for m in messages:
            content = m.text()
            if m.role != "assistant":
                out.append(Message(m.role, content))
                continue
            mine = done[k] if k < len(done) else None
            k += 1
            theirs = m.model_dump(exclude_none=True)
            if mine is not None and _same_message(mine.message, theirs):
                out.append(Message("assistant", content, mine.sample.token_ids))
            else:
                self.template_mismatches += mine is not None
                calls = "".join(f"<tool_call>{json.dumps(c.function.model_dump())}</tool_call>" for c in m.tool_calls or [])
                out.append(Message("assistant", content + calls))
        return out

    def chat(self, req: ChatRequest, episode: str | None) -> dict[str, Any]:
        episode = req.episode_id or episode
        msgs = self._chat_messages(episode, req.messages)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        try:
            context = compute_context_ids(self.policy.tokenizer, msgs, tools, self.policy.stop_ids, self._cache)
        except Exception as err:  # jinja2 errors of the model's own template: the request's messages, not a crash
            raise RequestError("messages", f"the model's chat template cannot render these messages "
                                           f"({type(err).__name__}: {str(err)[:200]})") from None
        self._check_prompt(context, "messages", CHAT)
        sample = self._batcher.submit(context, *self._sampling(req))
        text = _decode(self.policy, sample)
        parsed = parse_tool_calls(text) if tools else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "length" if sample.finish is StopReason.LENGTH else "stop"
        if parsed is not None and parsed.calls:
            message = {"role": "assistant", "content": parsed.text or None, "tool_calls": [
                {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}} for c in parsed.calls]}
            finish = "tool_calls"
        self._record(episode, context, sample, message)
        choice = {"index": 0, "message": message, "finish_reason": finish, "token_ids": list(sample.token_ids),
                  "logprobs": {"content": self._token_logprobs(sample)} if req.logprobs else None}
        return self._envelope("chat.completion", choice, context, sample, episode)

    def completion(self, req: CompletionRequest, episode: str | None) -> dict[str, Any]:
        episode = req.episode_id or episode
        if isinstance(req.prompt, list):  # token ids: the format is the caller's business
            vocab = int(self.policy.model.get_input_embeddings().num_embeddings)
            bad = next((i for i, t in enumerate(req.prompt) if t >= vocab), None)
            if bad is not None:
                raise RequestError(f"prompt[{bad}]", f"token id {req.prompt[bad]} is not in the vocabulary (size {vocab})")
            context, used = list(req.prompt), None
        else:
            context, used = list(self.policy.tokenizer.encode(req.prompt, add_special_tokens=True)), RAW
        self._check_prompt(context, "prompt", used)
        sample = self._batcher.submit(context, *self._sampling(req))
        text = _decode(self.policy, sample)
        self._record(episode, context, sample, {"role": "assistant", "content": text})
        logprobs = None
        if req.logprobs is not None:
            pieces = [self.policy.tokenizer.decode([t]) for t in sample.token_ids]
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
            logprobs = {"tokens": pieces, "token_logprobs": list(sample.logprobs), "top_logprobs": None,
                        "text_offset": offsets}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "token_ids": list(sample.token_ids),
                  "finish_reason": "length" if sample.finish is StopReason.LENGTH else "stop"}
        return self._envelope("text_completion", choice, context, sample, episode)

    def _token_logprobs(self, sample: Sample) -> list[dict[str, Any]]:
        tok = self.policy.tokenizer
        out = []
        for t, lp in zip(sample.token_ids, sample.logprobs):
            piece = tok.decode([t])
            out.append({"token": piece, "logprob": float(lp), "bytes": list(piece.encode()), "top_logprobs": []})
        return out

    def _envelope(self, kind: str, choice: dict[str, Any], context: Sequence[int], sample: Sample,
                  episode: str | None) -> dict[str, Any]:
        return {"id": f"tether-{uuid.uuid4().hex[:16]}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "prompt_token_ids": list(context),
                "policy_version": int(sample.policy_version), "episode_id": episode,
                "usage": {"prompt_tokens": len(context), "completion_tokens": len(sample.token_ids),
                          "total_tokens": len(context) + len(sample.token_ids)}}

    def _build_app(self):
        app = FastAPI(title="tether rollout endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        @app.middleware("http")
        async def check_token(request: Request, call_next):
            if self.token and not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {self.token}"):
                return JSONResponse({"error": {"message": "missing or wrong bearer token", "type": "auth"}}, 401)
            return await call_next(request)

        async def handle(request: Request, fn, kind, episode: str | None):
            try:
                req = parse_request(await request.body(), kind)
                episode = episode or request.headers.get("x-tether-episode")
                result = await run_in_threadpool(fn, req, episode)
                if req.stream:  # the finished completion as OpenAI's server-sent events (tether.serve.sse)
                    usage = bool(req.stream_options and req.stream_options.include_usage)
                    return StreamingResponse(completion_events(result, usage), media_type="text/event-stream")
                return JSONResponse(result)
            except (RequestError, UserError) as err:  # the request's fault: 400, the field named, one line
                return JSONResponse({"error": {"message": str(err), "type": "invalid_request_error",
                                               "param": getattr(err, "param", None), "code": None}}, 400)
            except Exception as err:  # tether's fault: 500 and one log line; the server and the run go on
                print(f"[tether serve] error: {type(err).__name__}: {str(err)[:300]}", flush=True)
                return JSONResponse({"error": {"message": f"internal error: {type(err).__name__}: {str(err)[:300]}",
                                               "type": "server_error", "param": None, "code": None}}, 500)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await handle(request, self.chat, ChatRequest, None)

        @app.post("/episodes/{episode}/v1/chat/completions")
        async def episode_chat(request: Request, episode: str):
            return await handle(request, self.chat, ChatRequest, episode)

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await handle(request, self.completion, CompletionRequest, None)

        @app.post("/episodes/{episode}/v1/completions")
        async def episode_completions(request: Request, episode: str):
            return await handle(request, self.completion, CompletionRequest, episode)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "tether"}]}

        return app


def _text(content: Any) -> str:
    """OpenAI message content: a string, None, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))


def _same_message(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> bool:
    """Whether the agent sent back the assistant message tether returned (tool-call ids aside)."""
    if _text(mine.get("content")) != _text(theirs.get("content")):
        return False
    calls = lambda m: [(c["function"]["name"], json.loads(c["function"].get("arguments") or "{}"))  # noqa: E731
                       for c in m.get("tool_calls") or []]
    try:
        return calls(mine) == calls(theirs)
    except (KeyError, TypeError, ValueError):
        return False


def _decode(policy: HFPolicy, sample: Sample) -> str:
    ids = list(sample.token_ids)
    if ids and ids[-1] in policy.stop_ids:
        ids = ids[:-1]
    return policy.tokenizer.decode(ids, skip_special_tokens=False)
