"""Bad input on the multi-run surfaces (issue 40 item 1): pipelines and sweeps follow `tether train
--resume`'s rules (allowed changes applied and recorded; anything else refused naming each key; the
run's record never rewritten by a refused resume); a sweep's --metric typo is refused before any run;
--out never lands in another kind of run; `tether report` writes only into a run it recognises. Every
refusal goes through the suite's `bad_input` helper (one line naming the field, exit 2, no traceback)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.unit.runs.runs_helpers import tether, write_config


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """A finished two-stage pipeline (SFT -> RL) on the tiny model."""
    root = tmp_path_factory.mktemp("bad-runs")
    cfg = write_config(root / "p.yaml")
    r = tether("pipeline", cfg, "--run-dir", root / "pipe")
    assert r.exit_code == 0, r.output
    return root


def test_pipeline_resume_refuses_a_changed_algorithm_and_applies_an_allowed_change(bad_input, pipeline, tmp_path):
    run = tmp_path / "pipe"
    shutil.copytree(pipeline / "pipe", run)
    before = _snapshot(run)
    line = bad_input.cli(["pipeline", pipeline / "p.yaml", "algo.advantage.name=rloo", "train.lr=0.01", "--resume",
                          "--run-dir", run], "algo.advantage.name", "'grpo' -> 'rloo'")
    assert "train.lr" not in line  # lr may change; the algorithm not
    assert _snapshot(run) == before  # config.yaml, run.json, summary: nothing rewritten
    r = tether("pipeline", pipeline / "p.yaml", "eval.samples=2", "--resume", "--run-dir", run)
    assert r.exit_code == 0, r.output
    assert "2 runs: 2 done, 0 to run" in r.output  # the finished stages keep their results
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "resume" and events[-1]["resume_changes"] == {"eval.samples": [1, 2]}
    assert "samples: 2" in (run / "config.yaml").read_text()


def test_train_resume_of_a_pipeline_names_the_command_that_resumes_it(bad_input, pipeline):
    bad_input.cli(["train", pipeline / "p.yaml", "--resume", "--run-dir", pipeline / "pipe"], "--resume",
                  "holds a pipeline run: resume it with `tether pipeline ... --resume`")


def test_sweep_metric_typo_is_refused_before_any_run(bad_input, tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    out = tmp_path / "sw"
    bad_input.cli(["sweep", cfg, "--grid", "train.lr=0.1,0.2", "--seeds", "0", "--metric", "final_acurracy", "--out", out],
                  "--metric", "did you mean 'final_accuracy'", "valid: ", "baseline_accuracy")
    assert not out.exists()  # nothing run, nothing written
    bad_input.cli(["sweep", cfg, "--grid", "train.lr=0.1", "--seeds", "0", "--command", "pipeline",
                   "--metric", "stages.rll.heldout.eval/pass@1", "--out", out], "--metric",
                  "'rll' is not a stage (stages: sft, rl)")


def test_sweep_out_at_a_finished_training_run_is_refused(bad_input, pipeline, tmp_path):
    run = tmp_path / "rl"
    shutil.copytree(pipeline / "pipe" / "rl", run)
    before = _snapshot(run)
    bad_input.cli(["sweep", pipeline / "p.yaml", "--grid", "train.lr=0.1", "--seeds", "0", "--out", run], "--out",
                  "holds a rl run (tether train)")
    assert _snapshot(run) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    bad_input.cli(["sweep", pipeline / "p.yaml", "--grid", "train.lr=0.1", "--seeds", "0", "--out", tmp_path / "other"],
                  "--out", "not a tether sweep")


def test_sweep_resume_refuses_another_grid_and_records_a_new_metric(bad_input, tmp_path):
    from tether.sweep import SweepError, SweepSpec, run_sweep

    def fake(argv, run_dir, log_path):
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.5, "baseline_accuracy": 0.25}))
        return 0

    run_sweep(SweepSpec(grid={"rollout.n": ["2"]}, seeds=[0]), {}, tmp_path, run_fn=fake, log=lambda m: None)
    before = _snapshot(tmp_path)
    bad_input.call(run_sweep, SweepSpec(grid={"rollout.n": ["4"]}, seeds=[0]), {}, tmp_path, run_fn=fake,
                   log=lambda m: None, field="grid", fragments=["{'rollout.n': ['2']} -> {'rollout.n': ['4']}"],
                   exc=SweepError)
    assert _snapshot(tmp_path) == before
    payload = run_sweep(SweepSpec(grid={"rollout.n": ["2"]}, seeds=[0], metric="baseline_accuracy"), {}, tmp_path,
                        run_fn=lambda *a: pytest.fail("nothing to run"), log=lambda m: None)
    assert payload["table"][0]["mean"] == 0.25  # read from the finished run again
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["resume_changes"] == {"metric": ["final_accuracy", "baseline_accuracy"]}


def test_a_metrics_key_typo_stops_the_sweep_after_its_first_run(bad_input, tmp_path):
    from tether.sweep import SweepError, SweepSpec, run_sweep

    ran = []

    def fake(argv, run_dir, log_path):
        ran.append(run_dir)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
        (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
        return 0

    bad_input.call(run_sweep, SweepSpec(grid={"rollout.n": ["2", "4"]}, seeds=[0, 1], metric="mean:reward/maen"), {},
                   tmp_path, run_fn=fake, log=lambda m: None, field="--metric",
                   fragments=["logged no 'reward/maen' - did you mean 'reward/mean'"], exc=SweepError)
    assert len(ran) == 1


def test_report_writes_only_into_a_run_it_recognises(bad_input, tmp_path, pipeline):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "config.yaml").write_text("train: {steps: 1}\n")
    bad_input.cli(["report", folder], str(folder), "a config.yaml alone is not a run")
    assert list(folder.iterdir()) == [folder / "config.yaml"]
    (tmp_path / "notes.html").write_text("<p>my notes</p>")
    bad_input.cli(["report", pipeline / "pipe", "--out", tmp_path / "notes.html"], "--out", "is not a tether report")
    assert (tmp_path / "notes.html").read_text() == "<p>my notes</p>"
    r = tether("report", pipeline / "pipe", "--out", tmp_path / "new" / "r.html")  # a new folder is fine
    assert r.exit_code == 0 and (tmp_path / "new" / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_a_prepare_step_refuses_a_command_line_override_its_config_does_not_take(bad_input, tmp_path):
    """A guard beside the finding (prepare steps now take the command line's overrides): a key no config
    takes is refused before the prepare step or any arm runs (as it was before the steps took them)."""
    (tmp_path / "s.yaml").write_text("run: {name: s}\nsft: {steps: 1}\n")
    (tmp_path / "c.yaml").write_text("run: {name: c}\nsweep:\n  seeds: [0]\n  prepare: {sft: {config: s.yaml}}\n"
                                     "  overrides: [\"model.path={prepare.sft}/final_model\"]\n  arms: [[train.steps=1]]\n")
    bad_input.cli(["sweep", tmp_path / "c.yaml", "sft.stepz=2", "--out", tmp_path / "o"], "sft.stepz")
    assert not (tmp_path / "o").exists()
