"""benchmarks/gpu_check.py (`make gpu-check`) on a machine without CUDA: the GPU parts are skipped with
a message saying so, the JSON records every part, and the run passes (nothing that ran failed)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_parts_skip_with_a_message_without_cuda(tmp_path, monkeypatch, capsys):
    mod = _load()
    monkeypatch.setattr(mod, "has_cuda", lambda: False)
    out = tmp_path / "gpu_check.json"
    assert mod.main(["--out", str(out), "--only", "extras,vllm,fsdp2,tinker"]) == 0
    report = json.loads(out.read_text())
    assert set(report["parts"]) == {"extras", "vllm", "fsdp2", "tinker"}
    for part in report["parts"].values():
        assert part["status"] == "skipped" and "no CUDA device" in part["message"]
    assert report["passed"] is True
    assert "skipped" in capsys.readouterr().out


def test_a_failing_part_fails_the_check(tmp_path, monkeypatch):
    mod = _load()
    monkeypatch.setattr(mod, "part_extras", lambda: (_ for _ in ()).throw(RuntimeError("pip broke")))
    out = tmp_path / "gpu_check.json"
    assert mod.main(["--out", str(out), "--only", "extras"]) == 1
    report = json.loads(out.read_text())
    assert report["parts"]["extras"]["status"] == "fail" and "pip broke" in report["parts"]["extras"]["error"]


@pytest.mark.slow
def test_cpu_safe_lora_part_runs(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    mod = _load()
    monkeypatch.setattr(mod, "has_cuda", lambda: False)
    monkeypatch.setattr("tether.recipes.rl.plot_metrics", lambda *a, **k: None)  # matplotlib: most of the time
    out = tmp_path / "gpu_check.json"
    assert mod.main(["--out", str(out), "--only", "lora"]) == 0
    lora = json.loads(out.read_text())["parts"]["lora"]
    assert lora["status"] == "pass" and lora["device"] == "cpu" and len(lora["per_step"]) == 3


def test_fsdp2_part_passes_on_cpu_with_gloo():
    """The fsdp2 part's own code (tether's FSDP2 path at world size 1) on gloo: equal to unsharded."""
    res = _load().run_fsdp2_step("cpu", "gloo")
    assert res["status"] == "pass", res
    assert res["max_weight_diff_after_update"] < 1e-5 < res["max_weight_change"]


def test_the_tinker_part_runs_its_checks_on_a_cpu(tmp_path, monkeypatch):
    """The GPU check's Tinker section, run unchanged but for the device: the SDK trains a LoRA and a
    full-weight client, samples, and compares sampled log-probs with the trainer's."""
    pytest.importorskip("tinker", reason="pip install -e '.[tinker]' (make test installs it)")
    mod = _load()
    monkeypatch.setattr(mod, "has_cuda", lambda: True)
    res = mod.part_tinker(tmp_path, device="cpu")
    assert res["status"] == "pass", res
    for kind in ("lora", "full"):
        assert res[kind]["losses"][-1] < res[kind]["losses"][0] and res[kind]["sample_vs_trainer_logprob_gap"] < 1e-2
