"""The HTTP routes of the Tinker-compatible service: the `/api/v1/...` calls the `tinker` SDK (0.38)
makes, in its own request and response shapes (`tether.serve.tinker` starts it).

Routes that change or read weights answer with a future (`{"request_id": ...}`) and run on the
worker (`tether.serve.tinker_futures`); the rest answer directly. A request tether cannot serve
fails with a one-line reason: as a failed future (the SDK raises `RequestFailedError` with category
"user"), or as HTTP 400/404 for the direct calls.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any, Callable

from tether.serve.tinker_engine import SampleJob, TinkerEngine
from tether.serve.tinker_futures import FutureTable, Job, Worker
from tether.serve.tinker_models import LoraSpec, ModelStore, TinkerUserError
from tether.serve.tinker_wire import WireError, decode_forward_backward, model_input_tokens

try:  # the optional `serve` extra; module level, so FastAPI can resolve the handlers' annotations
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
except ImportError:  # pragma: no cover - reported when the service is built
    FastAPI = None  # type: ignore[assignment,misc]

PROTO = "application/x-protobuf"
# What the SDK asks at start-up (/client/config): API keys without the JWT exchange; plain httpx;
# forward_backward chunks sent one after the other (the worker keeps arrival order); custom losses
# run client-side (forward + a weighted cross_entropy); samples polled one future at a time.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
                 "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False, "custom_loss_server_side": False,
                 "sample_use_retrieve_futures": False, "sample_join_sampling_session": False}
UNSERVED_SAMPLE_OPTIONS = ("topk_prompt_logprobs", "topk_sample_logprobs", "target_prompt_logprobs", "prompt_alt_tokens_k",
                           "record_stability_info")


def need(body: Any, key: str) -> Any:
    """A required field of a JSON request body (a missing one is the client's error, named)."""
    if not isinstance(body, dict) or key not in body:
        raise TinkerUserError(f"the request has no field {key!r}")
    return body[key]


class Routes:
    """The service's state behind the routes: sessions, counters, the model store and the worker."""

    def __init__(self, store: ModelStore, engine: TinkerEngine, token: str | None, poll_s: float = 20.0,
                 batch_wait_s: float = 0.02) -> None:
        self.store, self.engine, self.token, self.poll_s = store, engine, token, poll_s
        self.table = FutureTable()
        self.worker = Worker(engine, self.table, batch_wait_s)
        self.sessions: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ helpers

    def submit(self, run: Callable[[], Any], kind: str = "json") -> dict[str, Any]:
        rid = self.table.new(kind)
        self.worker.submit(Job(rid, run=run))
        return {"request_id": rid}

    def failed(self, err: BaseException) -> dict[str, Any]:
        rid = self.table.new()
        self.table.finish(rid, error=err)
        return {"request_id": rid}

    async def on_worker(self, run: Callable[[], Any]) -> Any:
        """Run `run` on the worker and wait for it (direct calls that touch weights)."""
        rid = self.submit(run)["request_id"]
        while (entry := await self.table.wait(rid, 3600.0)) is None:
            pass
        if entry.error:
            raise TinkerUserError(entry.error) if entry.category == "user" else RuntimeError(entry.error)
        return entry.payload

    def session(self, session_id: str) -> dict[str, Any]:
        s = self.sessions.get(session_id)
        if s is None:
            raise TinkerUserError(f"unknown session {session_id!r} (sessions do not survive a restart of the service)")
        return s

    # ------------------------------------------------------------------ training models

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        self.session(need(body, "session_id"))
        model_id = f"{body['session_id']}:train:{int(body['model_seq_id'])}"
        opt = (body.get("optimizer_config") or {}).get("type", "adamw")
        if opt != "adamw":
            return self.failed(TinkerUserError(f"optimizer {opt!r} is not served (AdamW only)"))
        lc = body.get("lora_config") or {}
        spec = LoraSpec(int(lc.get("rank", 0)), lc.get("seed"), bool(lc.get("train_attn", True)),
                        bool(lc.get("train_mlp", True)), bool(lc.get("train_unembed", True)))
        self.store.base(need(body, "base_model"))  # an unknown base fails now, with the served names

        def run() -> dict[str, Any]:
            self.store.create(model_id, need(body, "base_model"), spec)
            return {"model_id": model_id, "type": "create_model"}
        return self.submit(run)

    def unload(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = need(body, "model_id")
        self.store.trained(model_id)

        def run() -> dict[str, Any]:
            self.store.unload(model_id)
            return {"model_id": model_id, "type": "unload_model"}
        return self.submit(run)

    def optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = need(body, "model_id")
        params = body.get("adam_params") or body.get("optimizer_params") or {}
        return self.submit(lambda: self.engine.optim_step(model_id, params))

    def info(self, model_id: str) -> dict[str, Any]:
        tm = self.store.trained(model_id)
        lora = tm.lora
        return {"type": "get_info", "model_id": model_id, "is_lora": lora is not None,
                "lora_rank": None if lora is None else lora.rank, "model_name": tm.base.name,
                "model_data": {"arch": type(tm.base.policy.model).__name__, "model_name": tm.base.name,
                               "tokenizer_id": str(tm.base.path)}}

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        path, with_opt = need(body, "path"), bool(body.get("optimizer"))
        if body.get("session_id") is not None:  # create-via-load: the model is born from the checkpoint
            self.session(need(body, "session_id"))
            model_id = f"{body['session_id']}:train:{int(body['model_seq_id'])}"
            base_name, spec = self.store.lora_spec_of(path)

            def run() -> dict[str, Any]:
                tm = self.store.create(model_id, body.get("base_model") or base_name, spec)
                self.store.load(tm, path, with_opt)
                return {"path": path, "model_id": model_id, "type": "load_weights"}
            return self.submit(run)
        tm = self.store.trained(need(body, "model_id"))

        def load() -> dict[str, Any]:
            self.store.load(tm, path, with_opt)
            return {"path": path, "model_id": tm.model_id, "type": "load_weights"}
        return self.submit(load)

    def save_weights(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        tm = self.store.trained(need(body, "model_id"))
        name = body.get("path")
        if kind == "sampler_weights" and name is None:  # save_weights_and_get_sampling_client: in memory only
            sampler_id = f"{tm.model_id.split(':')[0]}:sample:{int(body.get('sampling_session_seq_id') or 0)}:{uuid.uuid4().hex[:6]}"

            def snapshot() -> dict[str, Any]:
                self.store.snapshot(sampler_id, tm)
                return {"path": None, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
            return self.submit(snapshot)

        def save() -> dict[str, Any]:
            path = self.store.save(tm, kind, str(name), with_optimizer=kind == "weights",
                                   overwrite=bool(body.get("overwrite", True)) or kind != "weights")
            return {"path": path, "type": "save_weights" if kind == "weights" else "save_weights_for_sampler"}
        return self.submit(save)

    # ------------------------------------------------------------------ sampling

    async def create_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        self.session(need(body, "session_id"))
        sampler_id = f"{body['session_id']}:sample:{int(body['sampling_session_seq_id'])}"
        if body.get("model_path"):
            path = need(body, "model_path")
            self.store.checkpoint_dir(path)  # an unknown path fails now
            await self.on_worker(lambda: self.store.sampler_from_path(sampler_id, path))
        elif body.get("base_model"):
            self.store.sampler_for_base(sampler_id, need(body, "base_model"))
        else:
            raise TinkerUserError("create_sampling_session needs base_model or model_path")
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def sampler_info(self, sampler_id: str) -> dict[str, Any]:
        info = self.store.sampler_info.get(sampler_id)
        if info is None:
            raise TinkerUserError(f"no sampler {sampler_id!r} in this service")
        return {"sampler_id": sampler_id, "base_model": info[0], "model_path": info[1]}

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        n = int(body.get("num_samples", 1))
        rid = self.table.new("proto")
        out = {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(n)]}
        try:
            unserved = [k for k in UNSERVED_SAMPLE_OPTIONS if body.get(k) not in (None, 0, False)]
            if unserved:
                raise TinkerUserError(f"sample: {unserved} are not served by tether (docs/tinker.md)")
            sampler_id = body.get("sampling_session_id")
            if sampler_id is None:
                raise TinkerUserError("sample: no sampling_session_id (create the sampling client through the ServiceClient)")
            job = SampleJob(sampler_id, tuple(model_input_tokens(need(body, "prompt"))), n, body.get("sampling_params") or {},
                            bool(body.get("prompt_logprobs")), body.get("prompt_logprobs_last_n"))
        except (TinkerUserError, WireError) as err:
            self.table.finish(rid, error=err)
            return out
        self.worker.submit(Job(rid, sample=job))
        return out


def build_app(routes: Routes):
    """The FastAPI app of `routes` (module docstring)."""
    if FastAPI is None:
        raise ImportError("the Tinker-compatible service needs fastapi and uvicorn: pip install 'tether[tinker]'")
    app = FastAPI(title="tether Tinker-compatible service")

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if routes.token and not secrets.compare_digest(request.headers.get("x-api-key", ""), routes.token):
            return JSONResponse({"detail": "missing or wrong API key (X-API-Key: the service's --token)"}, 401)
        return await call_next(request)

    async def user_error(request: Request, err: Exception):
        return JSONResponse({"detail": " ".join(str(err).split())}, 400)

    app.add_exception_handler(TinkerUserError, user_error)
    app.add_exception_handler(WireError, user_error)
    _add_service_routes(app, routes)
    # calls whose JSON body goes to one method of `routes` (the SDK's request type in comments)
    for name, fn in {"create_model": routes.create_model,  # CreateModelRequest
                     "get_info": lambda b: routes.info(need(b, "model_id")),  # GetInfoRequest
                     "unload_model": routes.unload,  # UnloadModelRequest
                     "optim_step": routes.optim_step,  # OptimStepRequest
                     "save_weights": lambda b: routes.save_weights(b, "weights"),  # SaveWeightsRequest
                     "save_weights_for_sampler": lambda b: routes.save_weights(b, "sampler_weights"),
                     "load_weights": routes.load_weights,  # LoadWeightsRequest
                     "asample": routes.asample}.items():  # SampleRequest
        _post_json(app, f"/api/v1/{name}", fn)
    _add_future_routes(app, routes)
    _add_rest_routes(app, routes)
    return app


def _post_json(app, path: str, fn: Callable[[dict[str, Any]], Any]) -> None:
    async def handler(request: Request):
        return fn(await request.json())
    app.post(path)(handler)


def _add_service_routes(app, routes: Routes) -> None:
    """Start-up, sessions and capabilities."""

    @app.post("/api/v1/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": b.name, "trainable": True, "sampleable": True,
                                      "max_context_length": b.policy.max_positions} for b in routes.store.bases.values()]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        sid = f"s{uuid.uuid4().hex[:12]}"
        routes.sessions[sid] = {"created": time.time(), "body": await request.json(), "finished": None}
        return {"type": "create_session", "session_id": sid}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        routes.session(need(await request.json(), "session_id"))["last_heartbeat"] = time.time()
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request):
        routes.session(session_id)["finished"] = (await request.json()).get("reason")
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}


def _add_future_routes(app, routes: Routes) -> None:
    """forward_backward (protobuf in), sampling sessions, and the futures' polls (protobuf or JSON out)."""

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        try:
            call = decode_forward_backward(await request.body())
        except WireError as err:
            return routes.failed(err)
        return routes.submit(lambda: routes.engine.forward_backward(call), "proto")

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        return await routes.create_sampler(await request.json())

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        return routes.sampler_info(sampler_id)

    @app.post("/api/v1/cancel_future")
    async def cancel_future():
        return {}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        rid = need(await request.json(), "request_id")
        if routes.table.get(rid) is None:
            return JSONResponse({"detail": f"unknown request id {rid!r}"}, 404)
        entry = await routes.table.wait(rid, routes.poll_s)
        if entry is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        if entry.error is not None:
            return {"error": entry.error, "category": entry.category}
        if entry.kind == "proto":
            return Response(content=entry.payload, media_type=PROTO)
        return entry.payload


def _add_rest_routes(app, routes: Routes) -> None:
    """Training runs and checkpoints (the SDK's RestClient), from the model store."""

    def run_info(model_id: str) -> dict[str, Any]:
        tm = routes.store.trained(model_id)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(tm.created))
        return {"training_run_id": model_id, "base_model": tm.base.name, "model_owner": "local",
                "is_lora": tm.lora is not None, "lora_rank": None if tm.lora is None else tm.lora.rank,
                "last_request_time": when}

    def checkpoints(model_id: str) -> list[dict[str, Any]]:
        return [{"checkpoint_id": f"{c['kind']}/{c['name']}", "checkpoint_type": "training" if c["kind"] == "weights"
                 else "sampler", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c["time"])),
                 "tinker_path": c["path"], "size_bytes": c["size_bytes"]} for c in routes.store.list_checkpoints(model_id)]

    @app.get("/api/v1/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0):
        ids = sorted(routes.store.training)
        return {"training_runs": [run_info(i) for i in ids[offset:offset + limit]],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)}}

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str):
        return run_info(model_id)

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def list_checkpoints(model_id: str):
        return {"checkpoints": checkpoints(model_id)}

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request):
        base, spec = routes.store.lora_spec_of(need(await request.json(), "tinker_path"))
        return {"base_model": base, "is_lora": spec is not None, "lora_rank": None if spec is None else spec.rank,
                "train_unembed": None if spec is None else spec.train_unembed,
                "train_mlp": None if spec is None else spec.train_mlp,
                "train_attn": None if spec is None else spec.train_attn}
