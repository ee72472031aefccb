"""Findings of the issue that the run model fixes, one test each (each fails on the code before it):
doctor over zero steps, a sweep's prepare step and the command line's overrides, the export of a
LoRA pipeline."""

from __future__ import annotations

import json

import torch

from tests.unit.runs.runs_helpers import tether, write_config


def test_doctor_over_zero_rl_steps_has_nothing_to_judge(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    write_config(run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"kind": "rl", "status": "running"}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/pass@1": 0.25}) + "\n")  # stopped before step 1
    r = tether("doctor", run)
    assert r.exit_code == 0, r.output
    assert "status: NOTHING TO JUDGE - no RL step is logged yet" in r.output and "HEALTHY" not in r.output.replace(
        "NOTHING TO JUDGE", "")


def test_a_sweep_prepare_step_gets_the_command_line_overrides_and_prints_progress(tmp_path):
    from tether.sweep import SweepSpec, run_sweep

    calls, lines = [], []

    def fake(argv, run_dir, log_path):
        calls.append(argv)
        run_dir.mkdir(parents=True)
        (run_dir / "final_model").mkdir()
        (run_dir / "summary.json").write_text(json.dumps({"final_loss": 0.1, "final_accuracy": 0.5}))
        return 0

    spec = SweepSpec(grid={}, seeds=[0], arm_list=[["a=1"]], overrides=["model.path={prepare.sft}/final_model"],
                     prepare={"sft": {"command": "sft", "config": {"run": {"name": "p"}}, "overrides": [], "per_seed": False}},
                     prepare_overrides=["model.tiny.hidden_size=48"])
    run_sweep(spec, {}, tmp_path, run_fn=fake, log=lines.append)
    assert "model.tiny.hidden_size=48" in calls[0] and calls[0][0] == "sft"
    assert any(x.startswith("[tether sweep prepare] start sft") for x in lines)
    assert any(x.startswith("[tether sweep prepare] 1/1 sft: done") for x in lines)


def test_export_of_a_lora_pipeline_is_its_last_stage_merged(tmp_path):
    from transformers import AutoModelForCausalLM

    from tether.policy.hf import load_policy

    cfg = write_config(tmp_path / "c.yaml", model={"lora": {"r": 4, "alpha": 8}})
    assert tether("pipeline", cfg, "--run-dir", tmp_path / "p").exit_code == 0
    r = tether("export", tmp_path / "p", "--out", tmp_path / "m")
    assert r.exit_code == 0, r.output
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    rl = json.loads((tmp_path / "p" / "summary.json").read_text())["stages"][-1]["model"]
    assert rl.endswith("rl/checkpoints/step_000003")
    merged = load_policy(rl).model
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-6)
    assert (tmp_path / "p" / "rl" / "base_model" / "config.json").is_file()  # the base docs/lora.md promises
