"""The `tether` command: help everywhere, exit code 2 with a one-line error on invalid use."""

import json

from typer.testing import CliRunner

from tether.cli import app

runner = CliRunner()


def test_help_everywhere():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("train", "sft", "eval", "show", "demo"):
        assert cmd in r.output
        sub = runner.invoke(app, [cmd, "--help"])
        assert sub.exit_code == 0, (cmd, sub.output)


def test_typo_key_is_exit_2_with_suggestion(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  stepz: 3\n")
    r = runner.invoke(app, ["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2
    assert "did you mean 'train.steps'" in r.output
    assert len([line for line in r.output.splitlines() if line.startswith("tether: error")]) == 1


def test_wrong_type_and_missing_file_exit_2(tmp_path):
    r = runner.invoke(app, ["sft", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "not found" in r.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sft:\n  lr: fast\n")
    r = runner.invoke(app, ["sft", str(cfg)])
    assert r.exit_code == 2 and "sft.lr" in r.output


def test_resume_needs_run_dir(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  steps: 1\n")
    r = runner.invoke(app, ["train", str(cfg), "--resume"])
    assert r.exit_code == 2 and "--run-dir" in r.output


def test_missing_model_path_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model:\n  path: {tmp_path / 'no-model'}\ntrain:\n  steps: 1\n")
    r = runner.invoke(app, ["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2
    assert "model.path" in r.output and "no such directory" in r.output
    assert not (tmp_path / "run").exists()  # the run directory it created held nothing: removed
    kept = tmp_path / "kept"
    (kept / "checkpoints" / "step-1").mkdir(parents=True)
    (kept / "checkpoints" / "step-1" / "state.pt").write_bytes(b"x")  # a directory with work in it is never removed
    r = runner.invoke(app, ["train", str(cfg), "--run-dir", str(kept)])
    assert r.exit_code == 2 and (kept / "checkpoints" / "step-1" / "state.pt").exists()
    r = runner.invoke(app, ["pipeline", str(cfg), "--run-dir", str(tmp_path / "pipe")])
    assert r.exit_code == 2 and "no such directory" in r.output and not (tmp_path / "pipe").exists()
    r = runner.invoke(app, ["compare-context", str(cfg), "--builders", "append", "--run-dir", str(tmp_path / "cc")])
    assert r.exit_code == 2 and "no such directory" in r.output and not (tmp_path / "cc").exists()


def test_malformed_dataset_line_names_file_and_line(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=" "answer": "4"}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data:\n  task: jsonl\n  path: {data}\ntrain:\n  steps: 1\n")
    r = runner.invoke(app, ["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2
    assert f"{data}:2:" in r.output


def test_show_summarises_a_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data:\n  task: reverse\nalgo:\n  advantage:\n    name: grpo\n")
    rows = [{"step": 0, "eval/pass@1": 0.2}, {"step": 1, "reward/mean": 0.25, "accuracy": 0.25},
            {"step": 2, "reward/mean": 0.5, "accuracy": 0.5}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "summary.json").write_text(json.dumps({"final_accuracy": 0.6}))
    r = runner.invoke(app, ["show", str(run)])
    assert r.exit_code == 0, r.output
    assert "steps logged: 2" in r.output and "final_accuracy" in r.output and "0.6" in r.output
    assert runner.invoke(app, ["show", str(tmp_path / "nope")]).exit_code == 2
