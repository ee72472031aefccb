"""tether sweep: grid expansion, the statistics by hand, resume after a kill, spec checks, the CLI."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.sweep import (
    Arm, SweepError, SweepSpec, compute_arm_stats, compute_difference, compute_sweep_table, expand_arms,
    format_table, load_sweep_config, metric_of, parse_grid, parse_seeds, run_sweep,
)


def test_grid_is_a_cartesian_product_in_the_order_given():
    grid = parse_grid(["algo.advantage.name=grpo,rloo", "rollout.n=4,8"])
    arms = expand_arms(grid)
    assert [a.overrides for a in arms] == [
        ("algo.advantage.name=grpo", "rollout.n=4"), ("algo.advantage.name=grpo", "rollout.n=8"),
        ("algo.advantage.name=rloo", "rollout.n=4"), ("algo.advantage.name=rloo", "rollout.n=8")]
    assert arms[0].slug == "algo.advantage.name=grpo__rollout.n=4"
    assert expand_arms({}) == [Arm(())]


@pytest.mark.parametrize("bad", [["noequals"], ["=1,2"], ["a=,"], ["a=1", "a=2"]])
def test_bad_grid_items_are_refused(bad):
    with pytest.raises(SweepError):
        parse_grid(bad)


def test_seeds_parse_and_refuse():
    assert parse_seeds("0,1, 2") == [0, 1, 2]
    with pytest.raises(SweepError, match="integers"):
        parse_seeds("0,x")
    with pytest.raises(SweepError, match="repeat"):
        SweepSpec(grid={}, seeds=[1, 1]).validate()


def test_arm_statistics_by_hand():
    # values 0.2, 0.4, 0.6: mean 0.4; deviations -0.2, 0, 0.2 -> s^2 = 0.08 / 2 = 0.04, s = 0.2, se = 0.2 / sqrt(3)
    s = compute_arm_stats([0.2, 0.4, 0.6])
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.4) and s["sd"] == pytest.approx(0.2)
    assert s["se"] == pytest.approx(0.2 / math.sqrt(3))
    one = compute_arm_stats([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["se"])
    assert compute_arm_stats([float("nan"), 1.0])["n"] == 1  # non-finite values are not counted


def test_paired_difference_by_hand():
    ref = {0: 0.2, 1: 0.4, 2: 0.6}
    other = {0: 0.3, 1: 0.6, 2: 0.6}
    # per-seed differences 0.1, 0.2, 0.0: mean 0.1, s = sqrt((0 + 0.01 + 0.01) / 2) = 0.1, se = 0.1 / sqrt(3) = 0.0577
    d = compute_difference(ref, other)
    assert d["kind"] == "paired"
    assert d["diff"] == pytest.approx(0.1) and d["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert d["within_noise"]  # 0.1 < 2 * 0.0577
    big = compute_difference(ref, {0: 0.5, 1: 0.71, 2: 0.89})  # differences 0.3, 0.31, 0.29: far beyond noise
    assert big["diff"] == pytest.approx(0.3) and not big["within_noise"]


def test_welch_difference_by_hand_when_seeds_differ():
    ref = {0: 0.2, 1: 0.4}          # mean 0.3, s = 0.1414, se = 0.1
    other = {0: 0.5, 1: 0.7, 2: 0.9}  # mean 0.7, s = 0.2, se = 0.2 / sqrt(3)
    d = compute_difference(ref, other)
    assert d["kind"] == "welch"
    assert d["diff"] == pytest.approx(0.4)
    assert d["se"] == pytest.approx(math.sqrt(0.1 ** 2 + (0.2 / math.sqrt(3)) ** 2))


def test_table_rows_and_markdown():
    arms = expand_arms({"x": ["a", "b"]})
    results = [{"arm": "x=a", "seed": s, "value": v} for s, v in [(0, 0.2), (1, 0.4), (2, 0.6)]]
    results += [{"arm": "x=b", "seed": s, "value": v} for s, v in [(0, 0.3), (1, 0.6), (2, 0.6)]]
    rows = compute_sweep_table(results, arms, "final_accuracy")
    assert rows[0]["mean"] == pytest.approx(0.4) and "vs_first" not in rows[0]
    assert rows[1]["vs_first"]["diff"] == pytest.approx(0.1)
    md = format_table(rows)
    assert "0.4000 ± 0.1155" in md and "+0.1000 ± 0.0577 (paired, within noise)" in md


def test_metric_lookup():
    s = {"final_accuracy": 0.5, "final_eval": {"eval/pass@1": 0.25}, "flag": True}
    assert metric_of(s, "final_accuracy") == 0.5
    assert metric_of(s, "final_eval.eval/pass@1") == 0.25
    assert metric_of(s, "missing") is None and metric_of(s, "flag") is None


def test_metric_of_a_pipeline_stage_by_name_and_a_difference():
    s = {"stages": [{"name": "sft", "heldout": {"eval/pass@1": 0.25}},
                    {"name": "rl_alone", "heldout": {"eval/pass@1": 0.5}},
                    {"name": "rl_after_dpo", "heldout": {"eval/pass@1": 0.625}}]}
    assert metric_of(s, "stages.rl_alone.heldout.eval/pass@1") == 0.5
    assert metric_of(s, "stages.nope.heldout.eval/pass@1") is None
    diff = "stages.rl_after_dpo.heldout.eval/pass@1 - stages.rl_alone.heldout.eval/pass@1"
    assert metric_of(s, diff) == 0.125
    assert metric_of(s, "stages.rl_alone.heldout.eval/pass@1 - stages.nope.x") is None


def test_metric_of_a_stage_metrics_file(tmp_path):
    (tmp_path / "distilled").mkdir()
    rows = [{"step": 0, "rollout/gen_tokens": 99.0}, {"step": 1, "rollout/gen_tokens": 10.0},
            {"step": 2, "rollout/gen_tokens": 30.0}]
    (tmp_path / "distilled" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert metric_of({}, "sum:rollout/gen_tokens@distilled", tmp_path) == 40.0  # step 0 is not a training step
    assert metric_of({}, "mean:rollout/gen_tokens@distilled", tmp_path) == 20.0
    assert metric_of({}, "sum:rollout/gen_tokens@rl_alone", tmp_path) is None


class FakeRuns:
    """A run_fn that writes summary.json with a value from the arm and seed; can die on the k-th call."""

    def __init__(self, die_on: int | None = None):
        self.calls: list[list[str]] = []
        self.die_on = die_on

    def __call__(self, argv, run_dir: Path, log_path: Path) -> int:
        if self.die_on is not None and len(self.calls) >= self.die_on:
            raise KeyboardInterrupt  # killed: nothing runs any more (a queued run may still be picked up)
        self.calls.append(list(argv))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("{}\n")
        if self.die_on is not None and len(self.calls) == self.die_on:
            raise KeyboardInterrupt  # the sweep process is killed while this run is half done
        n = int(next(a for a in argv if a.startswith("rollout.n=")).split("=")[1])
        seed = int(next(a for a in argv if a.startswith("run.seed=")).split("=")[1])
        (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": n / 10 + seed / 100}))
        return 0


def test_sweep_resumes_after_a_kill(tmp_path):
    spec = SweepSpec(grid={"rollout.n": ["4", "8"]}, seeds=[0, 1, 2], overrides=["train.steps=3"])
    base = {"run": {"name": "t"}, "data": {"task": "reverse"}}
    out = tmp_path / "sw"
    first = FakeRuns(die_on=4)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, base, out, workers=1, run_fn=first, log=lambda m: None)
    assert len(first.calls) == 4
    finished = 3
    assert first.calls[0][:2] == ["train", str(out / "base.yaml")] and "train.steps=3" in first.calls[0]
    second = FakeRuns()
    payload = run_sweep(spec, base, out, workers=2, run_fn=second, log=lambda m: None)
    assert len(second.calls) == 6 - finished  # finished runs are not run again; the killed one and the rest are
    assert (out / "rollout.n=8" / "seed-0.incomplete-1" / "metrics.jsonl").exists()  # moved aside, not deleted
    rows = payload["table"]
    assert [r["n"] for r in rows] == [3, 3]
    assert rows[0]["mean"] == pytest.approx(0.41) and rows[1]["mean"] == pytest.approx(0.81)
    assert rows[1]["vs_first"]["diff"] == pytest.approx(0.4) and rows[1]["vs_first"]["se"] == pytest.approx(0.0)
    assert (out / "sweep.md").read_text().startswith("| arm |") and (out / "plots" / "sweep.png").stat().st_size > 0
    third = FakeRuns()
    run_sweep(spec, base, out, run_fn=third, log=lambda m: None)
    assert third.calls == []  # all done


def test_resuming_with_another_spec_is_refused(tmp_path):
    base = {"run": {"name": "t"}}
    run_sweep(SweepSpec(grid={"rollout.n": ["4"]}, seeds=[0]), base, tmp_path, run_fn=FakeRuns(), log=lambda m: None)
    with pytest.raises(SweepError, match="differs in grid"):
        run_sweep(SweepSpec(grid={"rollout.n": ["8"]}, seeds=[0]), base, tmp_path, run_fn=FakeRuns(), log=lambda m: None)
    with pytest.raises(SweepError, match="base.yaml differs"):
        run_sweep(SweepSpec(grid={"rollout.n": ["4"]}, seeds=[0]), {"run": {"name": "u"}}, tmp_path, run_fn=FakeRuns(),
                  log=lambda m: None)


def test_failed_runs_are_listed_not_fatal(tmp_path):
    def failing(argv, run_dir, log_path):
        return 1

    payload = run_sweep(SweepSpec(grid={"rollout.n": ["4"]}, seeds=[0, 1]), {}, tmp_path, run_fn=failing, log=lambda m: None)
    assert len(payload["failures"]) == 2 and payload["table"][0]["n"] == 0


def test_yaml_sweep_block(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run: {name: x}\nsweep:\n  grid: {rollout.n: [4, 8]}\n  seeds: [0, 1]\n")
    base, block = load_sweep_config(p)
    assert "sweep" not in base and block["seeds"] == [0, 1]
    p.write_text("sweep: {grd: {}}\n")
    with pytest.raises(SweepError, match="unknown sweep key"):
        load_sweep_config(p)


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


def test_cli_refuses_a_bad_arm_before_running(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {task: reverse}\n")
    r = _cli("sweep", str(cfg), "--grid", "train.stepz=1,2", "--seeds", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and "train.stepz" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o" / "sweep.json").exists()


TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "logging.samples_per_step=0", "checkpoint.every=0", "eval.samples=1", "eval.problems=2",
        "data.train_size=16", "data.eval_size=2", "train.steps=1", "rollout.problems_per_step=2",
        "rollout.sampling.max_new_tokens=4", "eval.sampling.max_new_tokens=4", "reward.isolation=inline"]


@pytest.mark.slow
def test_cli_sweep_end_to_end(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {task: reverse}\nreward: {components: [{name: exact_match}]}\n")
    out = tmp_path / "o"
    r = _cli("sweep", str(cfg), *TINY, "--grid", "rollout.n=2,4", "--seeds", "0,1", "--workers", "2",
             "--metric", "baseline_accuracy", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    payload = json.loads((out / "sweep.json").read_text())
    assert [row["n"] for row in payload["table"]] == [2, 2]
    # the same seed starts from the same model: the baseline (step-0) accuracy is identical across arms
    assert payload["table"][1]["vs_first"]["diff"] == pytest.approx(0.0)
    assert "[tether sweep] 4/4 " in r.stdout and "ETA" in r.stdout  # the multi-run engine's progress lines
    r2 = _cli("sweep", str(cfg), *TINY, "--grid", "rollout.n=2,4", "--seeds", "0,1", "--metric", "baseline_accuracy",
              "--out", str(out), cwd=tmp_path)
    assert r2.returncode == 0 and "4 done, 0 to run" in r2.stdout


def test_report_renders_a_sweep(tmp_path):
    from tether.report.sweep import write_sweep_report

    spec = SweepSpec(grid={"rollout.n": ["4", "8"]}, seeds=[0, 1])
    run_sweep(spec, {}, tmp_path, run_fn=FakeRuns(), log=lambda m: None)
    page = write_sweep_report(tmp_path).read_text()
    assert "id='table'" in page and "rollout.n=8" in page and "data:image/png;base64," in page
    assert "+0.4000 ± 0.0000 (paired)" in page


def test_explicit_arms_and_metrics_from_the_log(tmp_path):
    def runs(argv, run_dir, log_path):
        run_dir.mkdir(parents=True)
        k = int(next(a for a in argv if a.startswith("top_k=")).split("=")[1])
        rows = [{"step": 0, "gap": 99.0}] + [{"step": s, "gap": k * 0.5 + s} for s in (1, 2, 3)]
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
        return 0

    spec = SweepSpec(grid={}, seeds=[0, 1], arm_list=[["top_k=0"], ["top_k=3", "keep=true"]], metric="mean:gap",
                     extra_metrics=["last:gap", "final_accuracy"])
    assert [a.label for a in spec.arms()] == ["top_k=0", "top_k=3, keep=true"]
    payload = run_sweep(spec, {}, tmp_path, run_fn=runs, log=lambda m: None)
    # mean over steps 1..3 (step 0 is the starting evaluation): k=0 -> 2.0, k=3 -> 3.5
    assert [r["mean"] for r in payload["table"]] == pytest.approx([2.0, 3.5])
    assert [r["mean"] for r in payload["extra_tables"]["last:gap"]] == pytest.approx([3.0, 4.5])
    assert "| `top_k=3, keep=true` |" in (tmp_path / "sweep.md").read_text()
    with pytest.raises(SweepError, match="expected key.path=value"):
        SweepSpec(grid={}, seeds=[0], arm_list=[["nokey"]]).validate()


def test_an_unfinished_pipeline_or_interrupted_run_is_not_collected_as_done(tmp_path):
    from tether.sweep import Arm, _collect

    arm = Arm(("a=1",))
    for summary, done in (({"kind": "pipeline", "complete": False, "final_accuracy": 0.3}, False),
                          ({"kind": "pipeline", "complete": True, "final_accuracy": 0.3}, True),
                          ({"kind": "pipeline", "interrupted_in": "rl", "final_accuracy": 0.3}, False),
                          ({"final_accuracy": 0.3, "interrupted": True}, False),
                          ({"final_accuracy": 0.3, "interrupted": False}, True)):
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        row = _collect(tmp_path, arm, 0, "final_accuracy")
        assert (row is not None) == done, summary
        assert row is None or row["value"] == 0.3


def test_no_difference_with_no_spread_is_within_noise():
    d = compute_difference({0: 0.5, 1: 0.5}, {0: 0.5, 1: 0.5})
    assert d["diff"] == 0 and d["within_noise"]


def test_sweep_json_names_run_directories_relative_to_the_sweep(tmp_path):
    """sweep.json stays valid when the sweep directory is moved: run and prepare paths are
    relative to it, and the curves command reads them from the new place."""
    import shutil

    from tether.report.sweep_curves import compute_sweep_curves
    from tether.sweep import _relative

    assert _relative(tmp_path, tmp_path / "a" / "seed-0") == "a/seed-0"
    assert _relative(tmp_path / "sweep", "/elsewhere/run") == "/elsewhere/run"  # outside: as given
    run = tmp_path / "sweep" / "arm" / "seed-0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "acc": 0.5}\n{"step": 2, "acc": 0.7}\n')
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "sweep"), moved)
    rows = [{"arm": "arm", "seed": 0, "run_dir": "arm/seed-0"}]
    curves = compute_sweep_curves(rows, "acc", root=moved)
    assert [p["mean"] for p in curves["arm"]] == [0.5, 0.7]
