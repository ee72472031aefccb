"""Fixtures for tether.dist unit tests: a tiny policy and config, built once per session."""

from __future__ import annotations

import pytest

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300", "logging.progress=false",
        "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "health.mode=off",
        "data.task=reverse", "data.train_size=32", "data.eval_size=4", "rollout.n=2", "rollout.problems_per_step=2",
        "rollout.sampling.max_new_tokens=6", "reward.isolation=inline"]


@pytest.fixture(scope="session")
def tiny_overrides():
    return list(TINY)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(cfg, train problems, policy) for the reverse task."""
    from tether.config import load_config
    from tether.train.setup import seed_everything, setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus

    cfg = load_config(None, TINY)
    seed_everything(0)
    train, _ = setup_problems(cfg.data)
    return cfg, train, setup_policy(cfg.model, cfg.run.seed, tmp_path_factory.mktemp("tiny"), lambda: compute_tokenizer_corpus(cfg.data.task, train))
