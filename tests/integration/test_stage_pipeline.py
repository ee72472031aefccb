"""Multi-stage pipelines end to end with a tiny model: every stage kind in one pipeline, and the
R1 pipeline killed (SIGKILL) during its stage 3 then resumed to the same final metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 256}
SMALL = {
    "model": {"tiny": TINY},
    "data": {"task": "arith", "train_size": 60, "eval_size": 8, "task_kwargs": {"digits": 1}},
    "sft": {"steps": 15, "lr": 5.0e-3, "batch_size": 16, "warmup_steps": 2, "demo_noise": 0.3},
    "rollout": {"n": 4, "problems_per_step": 4, "sampling": {"max_new_tokens": 4}},
    "train": {"steps": 4, "lr": 1.0e-4},
    "eval": {"samples": 2, "sampling": {"max_new_tokens": 4}, "problems": 4},
    "checkpoint": {"every": 2},
    "logging": {"tensorboard": False, "progress": False, "samples_per_step": 0},
    "health": {"mode": "off"},
}


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def _tether(*args, driver: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(driver or ["-m", "tether.cli"]), *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~2 minutes on 2 idle cores; far more on a loaded CI machine
def test_every_stage_kind_in_one_pipeline(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}) + "\n"
                             for a in range(4) for b in range(4)))
    stages = [
        {"kind": "sft", "name": "base"},
        {"kind": "rl", "name": "rl", "overrides": {"train": {"steps": 2}}},
        {"kind": "rs_sft", "name": "rs", "overrides": {"sft": {"steps": 3, "warmup_steps": 0},
                                                       "rs_sft": {"problems": 8, "k": 2, "mix_demos": 8}}},
        {"kind": "dpo", "name": "dpo", "overrides": {"dpo": {"pairs": "file", "pairs_path": str(pairs), "steps": 6,
                                                             "lr": 1.0e-3, "batch_size": 16}}},
        {"kind": "dpo", "name": "delta", "overrides": {"dpo": {"pairs": "delta", "strong_model": "rl", "weak_model": "base",
                                                               "loss": "simpo", "problems": 8, "steps": 2}}},
        {"kind": "distill", "name": "distill", "overrides": {"train": {"steps": 2}, "distill": {"teacher": "rl", "reward_weight": 0.5}}},
        {"kind": "merge", "name": "soup", "overrides": {"merge": {"models": ["base", "rl"]}}},
        {"kind": "merge", "name": "ta", "overrides": {"merge": {"method": "task_arithmetic", "base": "base", "models": ["rl"],
                                                                "weights": [2.0]}}},
        {"kind": "eval", "name": "final"},
    ]
    cfg = _write(tmp_path / "all.yaml", {**SMALL, "run": {"name": "all"}, "pipeline": {"stages": stages}})
    r = _tether("pipeline", str(cfg), "--run-dir", str(tmp_path / "p"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == [s["name"] for s in stages]
    assert all("eval/pass@1" in s["heldout"] and "eval/answer_tokens" in s["heldout"] for s in summary["stages"])
    # DPO learned its pairs: the chosen-minus-rejected margin grew over the steps
    rows = [json.loads(x) for x in (tmp_path / "p" / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["dpo/reward_margin"] > rows[0]["dpo/reward_margin"]
    assert json.loads((tmp_path / "p" / "distill" / "summary.json").read_text())["kind"] == "distill"
    # merging: the soup is the mean of base and rl, task arithmetic base + 2 (rl - base)
    models = {s["name"]: s["model"] for s in summary["stages"]}
    w = {n: load_file(str(Path(models[n]) / "model.safetensors"))["model.norm.weight"] for n in ("base", "rl", "soup", "ta")}
    assert (w["soup"] - (w["base"] + w["rl"]) / 2).abs().max() < 1e-6
    assert (w["ta"] - (w["base"] + 2 * (w["rl"] - w["base"]))).abs().max() < 1e-5
    assert models["final"] == models["ta"]  # the eval stage hands its incoming model on
    r = _tether("report", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "p" / "report.html").read_text()
    assert "<h2>Stages</h2>" in html and "distill" in html


def _small_r1(tmp_path: Path) -> Path:
    """configs/r1.yaml with its stages kept and every size shrunk."""
    data = yaml.safe_load((ROOT / "configs" / "r1.yaml").read_text())
    data.update(SMALL)
    data["data"] = {"task": "reverse", "train_size": 200, "eval_size": 8,
                    "task_kwargs": {"min_len": 2, "max_len": 4, "alphabet": "abcd"}}
    data["rs_sft"] = {"problems": 8, "k": 2, "mix_demos": 8}
    for st in data["pipeline"]["stages"]:
        if "sft" in st.get("overrides", {}):
            st["overrides"]["sft"]["steps"] = 3
    return _write(tmp_path / "r1_small.yaml", data)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # three small pipelines
def test_r1_killed_in_stage_3_resumes_to_the_same_final_metrics(tmp_path):
    cfg = _small_r1(tmp_path)
    steps = SMALL["train"]["steps"]
    killed = _tether(str(steps + 3), "pipeline", str(cfg), "--run-dir", str(tmp_path / "k"),
                     driver=[str(Path(__file__).parent / "stage_kill_driver.py")])
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    stage3 = tmp_path / "k" / "rl"
    assert (stage3 / "checkpoints" / "step_000002").is_dir() and not (stage3 / "stage.json").exists()
    assert not (tmp_path / "k" / "rs_sft").exists()
    resumed = _tether("pipeline", str(cfg), "--run-dir", str(tmp_path / "k"), "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert re.search(r"\[tether pipeline\] 6 runs: [1-5] done", resumed.stdout)  # the multi-run engine's resume rule
    assert re.search(r"\] 2/6 rl_zero: pass@1 [0-9.]+ \(reused\)", resumed.stdout), resumed.stdout[-3000:]
    straight = _tether("pipeline", str(cfg), "--run-dir", str(tmp_path / "s"))
    assert straight.returncode == 0, straight.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "summary.json").read_text())["stages"] for d in ("k", "s"))
    assert [s["name"] for s in a] == ["base", "rl_zero", "cold_start", "rl", "rs_sft", "rl_final"]
    assert [s["heldout"] for s in a] == [s["heldout"] for s in b]
    wa, wb = (load_file(str(Path(s[-1]["model"]) / "model.safetensors")) for s in (a, b))
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)  # bit-identical final weights
    for stage in ("rl", "rl_final"):  # the resumed stage 3 and the one after it trained identically
        ra, rb = (_metrics(tmp_path / d / stage) for d in ("k", "s"))
        assert len(ra) == len(rb) == SMALL["train"]["steps"] + 1 and ra == rb


def _metrics(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock fields."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time") and "per_s" not in k and "seconds" not in k
             and not k.startswith("health/")} for r in rows]
