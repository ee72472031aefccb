"""A tiny local model and a Tinker-compatible service on it, shared by the tests of this folder.

The service is the real one (`tether.serve.tinker.TinkerService`) on 127.0.0.1; the client is the
real `tinker` SDK from PyPI (the `tinker` extra), pointed at it through its base-URL setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")  # the SDK's telemetry would be posted to the service: keep tests quiet


def build_tiny(out: Path, seed: int = 0) -> Path:
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer

    corpus = ["abc cba", "hello olleh", "the cat sat on the mat", "reverse esrever", "12+34=46"]
    tok = build_tokenizer(corpus, 64)
    build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                     max_position_embeddings=128), tok, out, seed=seed)
    return out


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tinker-model") / "tiny")


@pytest.fixture(scope="module")
def service(tiny_dir, tmp_path_factory):
    from tether.serve.tinker import TinkerService

    with TinkerService({"tiny": tiny_dir, "Org/Tiny-Alias": tiny_dir}, tmp_path_factory.mktemp("tinker-state")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service):
    import tinker

    sc = tinker.ServiceClient(base_url=service.base_url, api_key=service.api_key)
    yield sc
    sc.close("success").result()
