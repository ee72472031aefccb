"""A Tinker-compatible service on tether's own policy, sampler, losses and update.

    tether serve-tinker --model Qwen/Qwen3-8B=/models/tiny-qwen3      # prints TINKER_BASE_URL
    TINKER_BASE_URL=http://127.0.0.1:8900 TINKER_API_KEY=tml-local python my_tinker_script.py

    with TinkerService({"tiny": "models/tiny"}, "runs/tinker") as svc:   # from Python (tests)
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

from pathlib import Path
from typing import Mapping

from tether.errors import InputError
from tether.serve.endpoint import is_loopback
from tether.serve.http import HTTPThread
from tether.serve.tinker_engine import TinkerEngine
from tether.serve.tinker_models import ModelStore
from tether.serve.tinker_routes import Routes, build_app


class TinkerService:
    """The service (module docstring); `close()` (or the context manager) stops it."""

    def __init__(self, models: Mapping[str, str | Path], state_dir: str | Path, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, device: str = "cpu", *, dtype: str = "float32",
                 full_weight: bool = False, seed: int = 0, max_samplers: int = 4, micro_batch_tokens: int = 8192,
                 batch_wait_s: float = 0.02, poll_s: float = 20.0) -> None:
        if not is_loopback(host) and not token:
            raise InputError(f"--host {host!r} is not a loopback address: set --token (a 'tml-...' string); every "
                             "client then sends it as its API key (TINKER_API_KEY)")
        if token is not None and not token.startswith("tml-"):
            raise InputError("--token must start with 'tml-' (the tinker SDK refuses other API keys)")
        if not models:
            raise InputError("no base model: pass --model NAME=PATH (a local Hugging Face model directory)")
        self.token = token
        self.store = ModelStore(Path(state_dir), device=device, dtype=dtype, full_weight=full_weight,
                                max_samplers=max_samplers)
        for name, path in models.items():
            self.store.add_base(name, path)
        engine = TinkerEngine(self.store, seed=seed, micro_batch_tokens=micro_batch_tokens)
        self.routes = Routes(self.store, engine, token, poll_s=poll_s, batch_wait_s=batch_wait_s)
        try:
            self._http = HTTPThread(build_app(self.routes), host, port, name="tether-tinker")
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
