"""Fixtures for the multi-turn environment tests: a tiny tokenizer/model and a scripted sampler."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # env_stubs: importable by the tests of this folder
    sys.path.insert(0, _HERE)

import env_stubs  # noqa: E402,F401  (registers the _test_tools environment)

from tether.config import TinyModelConfig  # noqa: E402
from tether.tasks import demonstration, make_problems  # noqa: E402
from tether.types import Sample, StopReason  # noqa: E402


@pytest.fixture(scope="session")
def env_tokenizer():
    from tether.policy.tiny import build_tokenizer

    corpus = [p["prompt"] + demonstration("calc", p) for p in make_problems("calc", 30, 0)]
    return build_tokenizer(corpus, 400)


@pytest.fixture(scope="session")
def env_policy(env_tokenizer):
    import torch

    from tether.policy.hf import make_policy
    from tether.policy.tiny import build_tiny_model

    torch.manual_seed(0)
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=400,
                          max_position_embeddings=1024)
    return make_policy(build_tiny_model(cfg, env_tokenizer, seed=0), env_tokenizer)


class ScriptedGenerate:
    """Stands in for `run_generate`: `script(call, row, prompt_ids) -> action ids`. Records every
    call's prompts so tests can check batching and the exact contexts the model saw."""

    def __init__(self, script: Callable[[int, int, tuple[int, ...]], Sequence[int]], stop_ids: Sequence[int]):
        self.script = script
        self.stop_ids = set(stop_ids)
        self.calls: list[list[tuple[int, ...]]] = []

    def __call__(self, policy, prompts, sampling, generator=None, batch_size=256, greedy=False) -> list[Sample]:
        k = len(self.calls)
        self.calls.append([tuple(p) for p in prompts])
        out = []
        for row, p in enumerate(prompts):
            ids = tuple(self.script(k, row, tuple(p)))
            finish = StopReason.EOS if ids and ids[-1] in self.stop_ids else StopReason.LENGTH
            out.append(Sample(tuple(p), ids, tuple(-0.5 for _ in ids), finish))
        return out


@pytest.fixture
def scripted():
    return ScriptedGenerate
