"""End to end: the ported tinker-cookbook RL loop (benchmarks/tinker_rl_loop.py, SDK only) trains a
tiny model through tether's Tinker-compatible service on a CPU (the measurement with more steps is
benchmarks/tinker_lift.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load_loop():
    spec = importlib.util.spec_from_file_location("tinker_rl_loop", ROOT / "benchmarks" / "tinker_rl_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_cookbook_rl_loop_trains_through_the_service(tmp_path, monkeypatch):
    pytest.importorskip("tinker", reason="pip install -e '.[tinker]' (make test installs it)")
    from tether.config import load_config
    from tether.recipes.sft import run_sft
    from tether.serve.tinker import TinkerService, TinkerSettings
    from tether.train.setup import setup_problems

    cfg = load_config(ROOT / "configs/reverse.yaml", [
        "sft.steps=150", "data.train_size=400", "data.eval_size=8", "checkpoint.every=0",
        "run.threads=1", "logging.progress=false", "logging.tensorboard=false"])
    policy, _ = run_sft(cfg, tmp_path / "sft")  # a cold start whose samples are sometimes right
    policy.model.save_pretrained(str(tmp_path / "model"))
    policy.tokenizer.save_pretrained(str(tmp_path / "model"))
    train, _ = setup_problems(cfg.data)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": p["prompt"], "answer": p["answer"]}) + "\n"
                                                  for p in train))
    loop = _load_loop()
    with TinkerService({"reverse-sft": tmp_path / "model"}, tmp_path / "state", TinkerSettings()) as svc:
        monkeypatch.setenv("TINKER_API_KEY", svc.api_key)
        final = loop.main(loop.Config(base_url=svc.base_url, log_path=str(tmp_path / "loop"), model_name="reverse-sft",
                                      train_path=str(tmp_path / "train.jsonl"), batch_size=8, group_size=4,
                                      learning_rate=1e-3, lora_rank=8, max_steps=3))
    rows = [json.loads(line) for line in (tmp_path / "loop" / "metrics.jsonl").read_text().splitlines()]
    assert [r["progress/batch"] for r in rows] == [0, 1, 2]
    assert 0 < sum(r["reward/total"] for r in rows) / 3 < 1  # right and wrong samples: advantages to learn from
    stepped = [r for r in rows if r["datums"] > 0]
    assert stepped and all(r["grad_norm"] > 0 for r in stepped)  # forward_backward + optim_step ran
    assert final["state_path"].endswith("/weights/final") and final["sampler_path"].endswith("/sampler_weights/final")
