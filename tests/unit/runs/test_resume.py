"""Run directories are never clobbered and resume checks the config (issue 14, tether.runs.resume).

Every case fails before a model is built, so these run in well under a second each."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from typer.testing import CliRunner

from tether.cli import app
from tether.config import dump_config, load_config
from tether.runs.resume import RunDirError, compute_config_changes, do_apply_lr, do_open_run, do_truncate_outputs
from tether.io.run_dir import make_run_dir, read_metrics

runner = CliRunner()


def fake_run(path, cfg, kind="rl", checkpoint_step=None, steps=(0, 1, 2, 3)):
    """A run directory as a killed/finished run leaves it (a checkpoint with a trainer state only)."""
    rd = make_run_dir(path)
    rd.config_path.write_text(dump_config(cfg))
    (rd.root / "run.json").write_text(json.dumps({"kind": kind}))
    for s in steps:
        rd.append_metrics(s, {"reward/mean": float(s)})
        rd.write_samples(s, [{"s": s}])
    if checkpoint_step is not None:
        ckpt = rd.checkpoints_dir / f"step_{checkpoint_step:06d}"
        ckpt.mkdir()
        torch.save({"step": checkpoint_step}, ckpt / "trainer_state.pt")
    return rd


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 4\n")
    return path


@pytest.mark.parametrize("command", [["train"], ["sft"], ["pipeline"]])
def test_an_existing_run_is_refused_without_resume_or_overwrite(tmp_path, config, command):
    rd = fake_run(tmp_path / "run", load_config(config))
    before = rd.metrics_path.read_text()
    r = runner.invoke(app, [*command, str(config), "--run-dir", str(rd.root)])
    assert r.exit_code == 2, r.output
    msg = r.output.strip().splitlines()[-1]
    assert "already holds a run" in msg and "--resume" in msg and "--overwrite" in msg
    assert rd.metrics_path.read_text() == before  # untouched


def test_demo_refuses_an_existing_run_dir(tmp_path):
    rd = fake_run(tmp_path / "demo", load_config(None), kind="demo")
    r = runner.invoke(app, ["demo", "--run-dir", str(rd.root)])
    assert r.exit_code == 2 and "--overwrite" in r.output


def test_overwrite_deletes_the_old_run_first(tmp_path):
    cfg = load_config(None)
    rd = fake_run(tmp_path / "run", cfg, checkpoint_step=2)
    start = do_open_run(rd.root, cfg, "rl", overwrite=True, log=lambda m: None)
    assert start.checkpoint is None
    assert not rd.metrics_path.exists() and not list(rd.samples_dir.iterdir()) and not list(rd.checkpoints_dir.iterdir())
    with pytest.raises(RunDirError, match="exclude each other"):
        do_open_run(rd.root, cfg, "rl", resume=True, overwrite=True)


def test_a_file_is_not_a_run_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        do_open_run(tmp_path / "f", load_config(None), "rl")


def test_resume_without_a_checkpoint_starts_from_zero_and_says_so(tmp_path):
    cfg = load_config(None)
    rd = fake_run(tmp_path / "run", cfg)  # killed before its first checkpoint
    logged = []
    start = do_open_run(rd.root, cfg, "rl", resume=True, log=logged.append)
    assert start.checkpoint is None and "no usable checkpoint" in logged[0] and "step 0" in logged[0]
    assert rd.read_metrics() == [] and not list(rd.samples_dir.iterdir())  # no step will be logged twice
    events = read_metrics(rd.root / "events.jsonl")
    assert events[-1]["kind"] == "resume_fresh"
    empty = do_open_run(tmp_path / "new", cfg, "rl", resume=True, log=logged.append)  # nothing there yet
    assert empty.checkpoint is None and "no run yet" in logged[-1]


def test_resume_drops_what_came_after_the_checkpoint(tmp_path):
    cfg = load_config(None)
    rd = fake_run(tmp_path / "run", cfg, checkpoint_step=2)
    start = do_open_run(rd.root, cfg, "rl", resume=True, log=lambda m: None)
    assert start.checkpoint.name == "step_000002" and start.changes == {}
    assert [r["step"] for r in rd.read_metrics()] == [0, 1, 2]
    assert sorted(f.name for f in rd.samples_dir.iterdir()) == [f"step_{s:06d}.jsonl.gz" for s in (0, 1, 2)]


def test_resume_refuses_a_change_the_checkpoint_cannot_follow(tmp_path, config):
    rd = fake_run(tmp_path / "run", load_config(config), checkpoint_step=2)
    for change, key in [("model.tiny.hidden_size=64", "model.tiny.hidden_size"), ("algo.advantage.name=rloo", "algo.advantage.name"),
                        ("algo.advantage.name=gae", "algo.advantage.name"), ("data.task=reverse", "data.task"),
                        ("run.seed=3", "run.seed")]:
        r = runner.invoke(app, ["train", str(config), "--run-dir", str(rd.root), "--resume", change])
        assert r.exit_code == 2, r.output
        assert key in r.output and "cannot resume" in r.output
    assert [r["step"] for r in rd.read_metrics()] == [0, 1, 2, 3]  # a refused resume changes nothing


def test_resume_lists_and_logs_allowed_changes(tmp_path):
    rd = fake_run(tmp_path / "run", load_config(None), checkpoint_step=2)
    new = load_config(None, ["train.steps=200", "train.lr=2e-5", "rollout.n=4", "eval.every=5"])
    logged = []
    start = do_open_run(rd.root, new, "rl", resume=True, log=logged.append)
    assert set(start.changes) == {"train.steps", "train.lr", "rollout.n", "eval.every"}
    assert "train.lr: 1e-05 -> 2e-05" in logged[-1]
    event = read_metrics(rd.root / "events.jsonl")[-1]
    assert event["kind"] == "resume" and event["resume_changes"]["train.steps"] == [100, 200]
    assert load_config(rd.config_path).train.steps == 200  # config.yaml now says what runs


def test_an_sft_run_is_not_resumed_by_train(tmp_path, config):
    rd = fake_run(tmp_path / "run", load_config(config), kind="sft", checkpoint_step=2)
    r = runner.invoke(app, ["train", str(config), "--run-dir", str(rd.root), "--resume"])
    assert r.exit_code == 2 and "holds a sft run" in r.output and "tether sft" in r.output
    rd2 = fake_run(tmp_path / "run2", load_config(config), kind="rl", checkpoint_step=2)
    r = runner.invoke(app, ["sft", str(config), "--run-dir", str(rd2.root), "--resume"])
    assert r.exit_code == 2 and "tether train" in r.output


def test_config_changes_are_leaf_keys():
    assert compute_config_changes({"a": {"b": 1, "c": [1]}}, {"a": {"b": 2, "c": [1]}, "d": 0}) == {
        "a.b": (1, 2), "d": (None, 0)}


def test_apply_lr_keeps_the_schedule_factor():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    do_apply_lr(opt, sched, 4.0)
    assert sched.base_lrs == [4.0] and opt.param_groups[0]["lr"] == 2.0
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 2.0


def test_truncate_outputs_keeps_eval_samples_up_to_the_step(tmp_path):
    rd = make_run_dir(tmp_path / "run")
    for s in (0, 2, 4):
        rd.write_samples(s, [{"s": s}], kind="eval")
    rd.write_samples(4, [{"again": 1}], kind="eval")  # eval_000004-1
    do_truncate_outputs(rd, 2)
    names = sorted(f.name for f in rd.samples_dir.iterdir())
    assert names == ["eval_000000.jsonl.gz", "eval_000002.jsonl.gz"]
    assert json.loads(gzip.decompress((rd.samples_dir / names[1]).read_bytes())) == {"s": 2}
