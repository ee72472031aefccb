"""Faults present from the first RL step, injected through the fault seams into short real runs
(tiny random model): each is flagged within 5 steps although it is part of every step the
relative detectors would use as their baseline (issue 16)."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from tether.config import load_config
from tether.health.faults import Fault
from tether.recipes.rl import run_rl
from tether.types import Outcome

pytestmark = pytest.mark.slow

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=64", "model.tiny.max_position_embeddings=32", "data.task=arith",
        "data.task_kwargs={digits: 1, ops: ['+', '-', '*']}", "data.train_size=96", "data.eval_size=4",
        "rollout.n=8", "rollout.problems_per_step=16", "rollout.sampling.max_new_tokens=4", "eval.sampling.max_new_tokens=4", "train.steps=5",
        "reward.isolation=inline", "eval.problems=4", "eval.samples=1", "checkpoint.every=0", "logging.tensorboard=false",
        "logging.progress=false", "logging.samples_per_step=0", "run.threads=1"]


def _run(tmp_path, fault: str) -> list[dict]:
    cfg = load_config(None, TINY + [f"health.inject=[{{name: {json.dumps(fault)}, severity: obvious, start: 1}}]"])
    run_rl(cfg, tmp_path / "run")
    return [json.loads(x) for x in (tmp_path / "run" / "health.jsonl").read_text().splitlines()]


def _findings(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("kind") == "finding"]


def test_rollout_topk_filter_from_step_1(tmp_path):
    found = _findings(_run(tmp_path, "rollout_topk"))
    f = next(e for e in found if e["detector"] == "logp_floor")
    assert f["step"] <= 5 and f["since"] == 1 and f["evidence"]["logp_gap_mean"]["value"] > 0.5


def test_duplicate_prompts_from_step_1(tmp_path):
    found = _findings(_run(tmp_path, "duplicate_prompts"))
    f = next(e for e in found if e["detector"] == "group_structure")
    assert f["step"] <= 5 and f["evidence"]["rule"] == "duplicate"


class _NearZeroThenWorse(Fault):
    """Verified accuracy 15% at step 1, then 6%, 2%, 0: a run that starts near zero and degrades
    (the verdict and the reward agree, so no reward signal is off)."""

    name, family, cause = "near_zero_worse", "optimisation", "lr_too_high"
    severities = {"obvious": {}}
    ACC = {1: 0.15, 2: 0.06, 3: 0.02}

    def on_rollouts(self, groups, step):
        p, out = self.ACC.get(step, 0.0), []
        for g in groups:
            trajs = []
            for i, t in enumerate(g.trajectories):
                ok = self.coin(step, g.task_id, i) < p
                res = dataclasses.replace(t.reward, total=float(ok), correct=ok, outcome=Outcome.OK,
                                          components={k: float(ok) for k in t.reward.components})
                trajs.append(dataclasses.replace(t, reward=res))
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


def test_near_zero_start_that_degrades(tmp_path):
    mod = types.ModuleType("tether_test_near_zero")
    mod.NearZeroThenWorse = _NearZeroThenWorse
    sys.modules[mod.__name__] = mod
    try:
        events = _run(tmp_path, f"{mod.__name__}:NearZeroThenWorse")
    finally:
        sys.modules.pop(mod.__name__)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    acc = {r["step"]: r["accuracy"] for r in rows if "accuracy" in r}
    assert acc[1] <= 0.2 and acc[4] < acc[1] / 2  # near zero, then worse
    f = next(e for e in _findings(events) if e["detector"] in ("accuracy_drop", "regression"))
    assert f["step"] <= 5
