"""A Tinker-compatible service on tether's own policy, sampler, losses and update.

    tether serve-tinker --model Qwen/Qwen3-8B=/models/tiny-qwen3      # prints TINKER_BASE_URL
    TINKER_BASE_URL=http://127.0.0.1:8900 TINKER_API_KEY=tml-local python my_tinker_script.py

    with TinkerService({"tiny": "models/tiny"}, "runs/tinker", TinkerSettings()) as svc:   # from Python
        client = tinker.ServiceClient(base_url=svc.base_url, api_key=svc.api_key)

A script written against the `tinker` SDK runs unchanged but for the base URL (and an API key the
SDK insists on: any `tml-...` string on loopback). What is served and what is not: docs/tinker.md.
The pieces: the wire formats (`tinker_wire`), the losses (`tinker_losses`, on tether's policy-loss
registry), the models (`tinker_models`: LoRA adapters on shared bases, full-weight copies,
samplers, checkpoints), the operations (`tinker_engine`: the update's scorer and guarded AdamW step,
tether's sampler), the futures and the worker thread (`tinker_futures`) and the routes
(`tinker_routes`). The same code runs on a CPU and on a GPU (`device`).

Binds 127.0.0.1 by default; bound to any other address it requires `token`, which every request
must then carry as its API key (`X-API-Key`, the SDK's TINKER_API_KEY; so the token must start with
`tml-`, as the SDK checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tether.errors import InputError
from tether.serve.endpoint import is_loopback
from tether.serve.http import HTTPThread
from tether.serve.tinker_engine import TinkerEngine
from tether.serve.tinker_models import ModelStore
from tether.serve.tinker_routes import Routes, build_app


@dataclass(frozen=True)
class TinkerSettings:
    """How a service runs. host/port/token: where it listens and the API key it requires (needed off
    loopback); device/dtype: where and in what precision the weights live; full_weight: every training
    model trains full weights, whatever LoRA rank it asks (rank 0 asks for them anyway); max_samplers:
    sampler snapshots kept loaded; merge_max_params: LoRA snapshots of bases up to this size are
    sampled from a merged copy (tether's fast decoder); micro_batch_tokens: forward_backward's token
    budget per micro-batch; batch_wait_s: how long the worker waits for more sampling requests to
    batch; poll_s: how long a retrieve_future poll waits before answering try_again."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    full_weight: bool = False
    seed: int = 0
    max_samplers: int = 4
    merge_max_params: int = 200_000_000
    micro_batch_tokens: int = 8192
    batch_wait_s: float = 0.02
    poll_s: float = 20.0


class TinkerService:
    """The service (module docstring); `close()` (or the context manager) stops it."""

    def __init__(self, models: Mapping[str, str | Path], state_dir: str | Path,
                 settings: TinkerSettings = TinkerSettings()) -> None:
        s = settings
        if not is_loopback(s.host) and not s.token:
            raise InputError(f"--host {s.host!r} is not a loopback address: set --token (a 'tml-...' string); every "
                             "client then sends it as its API key (TINKER_API_KEY)")
        if s.token is not None and not s.token.startswith("tml-"):
            raise InputError("--token must start with 'tml-' (the tinker SDK refuses other API keys)")
        if not models:
            raise InputError("no base model: pass --model NAME=PATH (a local Hugging Face model directory)")
        self.token = s.token
        self.store = ModelStore(Path(state_dir), device=s.device, dtype=s.dtype, full_weight=s.full_weight,
                                max_samplers=s.max_samplers, merge_max_params=s.merge_max_params)
        for name, path in models.items():
            self.store.add_base(name, path)
        engine = TinkerEngine(self.store, seed=s.seed, micro_batch_tokens=s.micro_batch_tokens)
        self.routes = Routes(self.store, engine, s.token, poll_s=s.poll_s, batch_wait_s=s.batch_wait_s)
        try:
            self._http = HTTPThread(build_app(self.routes), s.host, s.port, name="tether-tinker")
        except BaseException:
            self.routes.worker.close()
            raise

    @property
    def base_url(self) -> str:
        return self._http.url

    @property
    def api_key(self) -> str:
        return self.token or "tml-tether-local"

    def close(self) -> None:
        self._http.close()
        self.routes.worker.close()

    def __enter__(self) -> "TinkerService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_models(specs: list[str]) -> dict[str, str]:
    """--model values: NAME=PATH, or PATH (served under its directory name)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).name, spec
        if not name or not path:
            raise InputError(f"--model {spec!r}: expected NAME=PATH or PATH")
        p = Path(path)
        if not (p / "config.json").is_file():
            what = "no such directory" if not p.exists() else "no config.json inside"
            raise InputError(f"--model {spec!r}: {what} (a local Hugging Face model directory is expected)")
        out[name] = path
    return out
