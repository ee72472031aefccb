"""CLI: `tether serve-tinker` — a Tinker-compatible service (`tether.serve.tinker`, docs/tinker.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("serve-tinker")
    def serve_tinker(
        model: List[str] = typer.Option(..., "--model", help="NAME=PATH (or PATH): a local Hugging Face model served as "
                                                            "base model NAME; repeat for several"),
        host: str = typer.Option("127.0.0.1", help="bind address; any non-loopback address needs --token"),
        port: int = typer.Option(8900, help="port (0: a free one)"),
        token: Optional[str] = typer.Option(None, help="API key every client must send (TINKER_API_KEY; starts with tml-)"),
        state_dir: Path = typer.Option(Path("runs/tinker"), "--state-dir", help="where checkpoints are written"),
        device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto (cuda when available)"),
        dtype: str = typer.Option("float32", help="float32 or bfloat16 weights"),
        full_weight: bool = typer.Option(False, "--full-weight", help="train full weights whatever LoRA rank a client asks"),
        max_samplers: int = typer.Option(4, help="sampler snapshots kept loaded (least recently used out)"),
        seed: int = typer.Option(0, help="seed of the sampler's generator (requests may carry their own)"),
    ) -> None:
        """Serve the Tinker API (the `tinker` SDK's ServiceClient / TrainingClient / SamplingClient) on tether's policy,
        sampler, losses and update: run a Tinker script unchanged but for TINKER_BASE_URL."""
        from tether.commands.common import offline_env
        from tether.serve.tinker import TinkerService, TinkerSettings, parse_models

        offline_env()
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype not in ("float32", "bfloat16"):
            raise typer.BadParameter(f"{dtype!r}: use float32 or bfloat16", param_hint="--dtype")
        settings = TinkerSettings(host=host, port=port, token=token, device=device, dtype=dtype, full_weight=full_weight,
                                  seed=seed, max_samplers=max_samplers)
        svc = TinkerService(parse_models(model), state_dir, settings)
        typer.echo(f"tether: serving the Tinker API at {svc.base_url} on {device} (models: {', '.join(svc.store.bases)})")
        typer.echo(f"  export TINKER_BASE_URL={svc.base_url} TINKER_API_KEY={svc.api_key}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            typer.echo("tether: stopping")
        finally:
            svc.close()
