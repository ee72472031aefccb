"""Rollout/trainer log-prob gap with and without sampling filters (docs/rollout.md).

    PYTHONPATH=src python benchmarks/sampling_gap.py    # -> benchmarks/results/sampling_gap.json

A tiny random Llama on the reverse task samples 24 completions per setting; the trainer scores
them as the update does (`compute_batch_logprobs`). The measurement is the one
tests/unit/policy/test_sampling_mask.py asserts (`measure_gap`, imported by file name).
"""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "policy"))

from test_sampling_mask import measure_gap  # noqa: E402

from tether.config import TinyModelConfig  # noqa: E402
from tether.policy.hf import make_policy  # noqa: E402
from tether.policy.tiny import build_tiny_model, build_tokenizer  # noqa: E402
from tether.tasks import make_problems  # noqa: E402

SETTINGS = [{}, {"top_k": 3}, {"top_p": 0.9}, {"min_p": 0.1},
            {"top_k": 3, "keep_mask": False}, {"top_p": 0.9, "keep_mask": False}]


def main() -> None:
    tok = build_tokenizer([p["prompt"] + p["answer"] for p in make_problems("reverse", 200, seed=1)], 256)
    torch.manual_seed(0)
    cfg = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=2, intermediate_size=96)
    policy = make_policy(build_tiny_model(cfg, tok, seed=0), tok)
    rows = [{"sampling": s, "mean_abs_logp_gap": measure_gap(policy, **s)} for s in SETTINGS]
    for r in rows:
        print(f"{json.dumps(r['sampling']):40s} {r['mean_abs_logp_gap']:.3g} nats")
    out = ROOT / "benchmarks" / "results" / "sampling_gap.json"
    out.write_text(json.dumps({"command": "PYTHONPATH=src python benchmarks/sampling_gap.py", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
