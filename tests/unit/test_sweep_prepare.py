"""`prepare:` steps of tether sweep: run once before the arms, their path substituted into the arms'
overrides, not redone on resume once finished (redone when a kill left them unfinished), per-seed
steps, validation, and the first/last-K metric windows used by the findings configs."""

import json
from pathlib import Path

import pytest

from tether.sweep import COMMANDS, SweepError, SweepSpec, load_sweep_config, metric_of, run_sweep
from tether.sweep_prepare import resolve_prepare

STEP = {"command": "sft", "config": {"run": {"name": "p"}, "sft": {"steps": 2}}, "overrides": ["sft.steps=3"],
        "per_seed": False}


class Runs:
    """A fake run_fn: records argv; a prepare (sft) run writes final_model, an arm run a summary. `die_on`:
    the call at which the sweep process is killed (the run is left half done)."""

    def __init__(self, die_on=None):
        self.calls, self.die_on = [], die_on

    def __call__(self, argv, run_dir, log_path):
        self.calls.append(list(argv))
        run_dir.mkdir(parents=True)
        if self.die_on is not None and len(self.calls) == self.die_on:
            raise KeyboardInterrupt
        if argv[0] == "sft":
            (run_dir / "final_model").mkdir()
            (run_dir / "summary.json").write_text(json.dumps({"kind": "sft", "final_loss": 0.25, "interrupted": False}))
        else:
            path = next(a.split("=", 1)[1] for a in argv if a.startswith("model.path="))
            assert Path(path).is_dir(), f"the arm started before its prepare step finished: {path}"
            seed = int(next(a for a in argv if a.startswith("run.seed=")).split("=")[1])
            (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.1 * seed}))
        return 0


def _spec(**kw):
    return SweepSpec(grid={}, seeds=[0, 1], arm_list=[["a=1"], ["a=2"]], overrides=["model.path={prepare.sft}/final_model"],
                     prepare={"sft": dict(STEP, **kw)})


def test_prepare_runs_once_and_every_arm_gets_its_path(tmp_path):
    runs = Runs()
    payload = run_sweep(_spec(), {"run": {"name": "t"}}, tmp_path, run_fn=runs, log=lambda m: None)
    assert [c[0] for c in runs.calls] == ["sft", "train", "train", "train", "train"]
    assert runs.calls[0] == ["sft", str(tmp_path / "prepare" / "sft.yaml"), "sft.steps=3"]
    assert all(f"model.path={tmp_path / 'prepare' / 'sft'}/final_model" in c for c in runs.calls[1:])
    assert (tmp_path / "prepare" / "sft.yaml").read_text().startswith("run:")
    rec = payload["prepare"]
    assert len(rec) == 1 and rec[0]["ran"] and rec[0]["summary"]["final_loss"] == 0.25
    assert "prepare `sft`" in (tmp_path / "sweep.md").read_text()
    assert json.loads((tmp_path / "sweep.json").read_text())["prepare"][0]["run_dir"] == "prepare/sft"  # relative to the sweep
    again = Runs()
    payload = run_sweep(_spec(), {"run": {"name": "t"}}, tmp_path, run_fn=again, log=lambda m: None)
    assert again.calls == [] and payload["prepare"][0]["ran"] is False  # found finished: not run again


def test_a_kill_after_prepare_does_not_redo_it_and_a_kill_during_it_does(tmp_path):
    killed = Runs(die_on=3)  # prepare done, the first arm run done, the sweep killed during the second
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_spec(), {}, tmp_path, run_fn=killed, log=lambda m: None)
    # (a queued run may still be picked up by the worker thread while the kill propagates)
    done = len([p for p in tmp_path.glob("a=*/seed-*/summary.json")])
    assert 1 <= done <= 3
    resumed = Runs()
    payload = run_sweep(_spec(), {}, tmp_path, run_fn=resumed, log=lambda m: None)
    assert [c[0] for c in resumed.calls] == ["train"] * (4 - done)  # the complete prepare step is reused
    assert [r["n"] for r in payload["table"]] == [2, 2]
    out2 = tmp_path / "k2"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_spec(), {}, out2, run_fn=Runs(die_on=1), log=lambda m: None)  # killed inside the prepare step
    redo = Runs()
    run_sweep(_spec(), {}, out2, run_fn=redo, log=lambda m: None)
    assert [c[0] for c in redo.calls] == ["sft"] + ["train"] * 4
    assert (out2 / "prepare" / "sft.incomplete-1").is_dir()  # the unfinished one was moved aside, not deleted


def test_a_per_seed_prepare_step_runs_once_per_seed(tmp_path):
    runs = Runs()
    run_sweep(_spec(per_seed=True), {}, tmp_path, run_fn=runs, log=lambda m: None)
    sft = [c for c in runs.calls if c[0] == "sft"]
    assert [c[-1] for c in sft] == ["run.seed=0", "run.seed=1"]
    for call in runs.calls[2:]:
        seed = call[-1].split("=")[1]
        assert f"model.path={tmp_path / 'prepare' / 'sft' / f'seed-{seed}'}/final_model" in call


def test_the_seeds_of_a_per_seed_prepare_step_run_on_the_sweep_workers(tmp_path):
    """With --workers 2, both seeds' prepare runs are started before either finishes (a barrier that
    only two concurrent runs can pass; no timing), each with the arms' per-worker thread count."""
    import threading

    barrier, runs = threading.Barrier(2, timeout=60), Runs()
    lock = threading.Lock()

    def run_fn(argv, run_dir, log_path):
        if argv[0] == "sft":
            barrier.wait()  # raises BrokenBarrierError if the two seeds ran one after the other
        with lock:
            return runs(argv, run_dir, log_path)

    run_sweep(_spec(per_seed=True), {}, tmp_path, workers=2, run_fn=run_fn, log=lambda m: None)
    sft = [c for c in runs.calls if c[0] == "sft"]
    assert sorted(c[-1] for c in sft) == ["run.seed=0", "run.seed=1"]
    assert all(any(a.startswith("run.threads=") for a in c) for c in sft)


def test_a_failed_prepare_step_stops_the_sweep(tmp_path):
    def fails(argv, run_dir, log_path):
        return 3

    with pytest.raises(SweepError, match="prepare step sft failed .exit 3"):
        run_sweep(_spec(), {}, tmp_path, run_fn=fails, log=lambda m: None)


def test_an_undefined_prepare_reference_is_refused():
    with pytest.raises(SweepError, match=r"\{prepare.base\} is used but"):
        SweepSpec(grid={}, seeds=[0], arm_list=[["model.path={prepare.base}/final_model"]]).validate()


def test_resolve_prepare_reads_a_config_beside_the_sweep_and_refuses_bad_steps(tmp_path):
    (tmp_path / "s.yaml").write_text("run: {name: s}\nsft: {steps: 5}\nsweep: {seeds: [0]}\n")
    steps = resolve_prepare({"sft": {"config": "s.yaml"}}, tmp_path, COMMANDS, SweepError)
    assert steps["sft"] == {"command": "sft", "config": {"run": {"name": "s"}, "sft": {"steps": 5}}, "overrides": [],
                            "per_seed": False}  # its own sweep block is dropped
    for bad, msg in [({"x": {"config": "s.yaml", "comand": "sft"}}, "unknown key"),
                     ({"x": {"config": "s.yaml", "command": "dpo"}}, "not one of"),
                     ({"x": {"config": "missing.yaml"}}, "cannot read"),
                     ({"x": {"command": "sft"}}, "config"),
                     ({"x": {"config": "s.yaml", "overrides": ["noeq"]}}, "key.path=value"),
                     ({"a b": {"config": "s.yaml"}}, "step name")]:
        with pytest.raises(SweepError, match=msg):
            resolve_prepare(bad, tmp_path, COMMANDS, SweepError)


def test_yaml_block_accepts_prepare_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run: {name: x}\nsweep:\n  prepare: {sft: {config: s.yaml}}\n  overrides: [\"model.path={prepare.sft}/m\"]\n")
    _, block = load_sweep_config(p)
    assert block["overrides"] == ["model.path={prepare.sft}/m"] and "sft" in block["prepare"]


def test_an_older_sweep_without_prepare_still_resumes(tmp_path):
    spec = SweepSpec(grid={}, seeds=[0], arm_list=[["a=1"]])
    run_sweep(spec, {}, tmp_path, run_fn=lambda a, r, l: (r.mkdir(parents=True), (r / "summary.json").write_text("{}"), 0)[2],
              log=lambda m: None)
    old = json.loads((tmp_path / "sweep_spec.json").read_text())
    del old["prepare"]  # written before prepare steps existed
    (tmp_path / "sweep_spec.json").write_text(json.dumps(old))
    run_sweep(spec, {}, tmp_path, run_fn=lambda *a: pytest.fail("nothing to run"), log=lambda m: None)


def test_first_and_last_k_step_windows(tmp_path):
    rows = [{"step": 0, "x": 100.0}] + [{"step": s, "x": float(s)} for s in range(1, 11)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert metric_of({}, "first5:x", tmp_path) == pytest.approx(3.0)   # steps 1..5 (step 0 is the starting eval)
    assert metric_of({}, "last5:x", tmp_path) == pytest.approx(8.0)    # steps 6..10
    assert metric_of({}, "last5:x - first5:x", tmp_path) == pytest.approx(5.0)
    assert metric_of({}, "last:x", tmp_path) == 10.0 and metric_of({}, "first0:x", tmp_path) is None


@pytest.mark.slow
def test_cli_sweep_with_a_real_sft_prepare_step(tmp_path):
    import os
    import subprocess
    import sys

    tiny = ("{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}")
    common = ("data: {task: reverse, train_size: 16, eval_size: 2}\ncheckpoint: {every: 0}\n"
              "logging: {progress: false, tensorboard: false, samples_per_step: 0}\n"
              "eval: {samples: 1, problems: 2, sampling: {max_new_tokens: 4}}\n")
    (tmp_path / "sft.yaml").write_text(f"run: {{name: s, seed: 0}}\nmodel: {{tiny: {tiny}}}\n{common}"
                                       "sft: {steps: 2, batch_size: 4}\n")
    (tmp_path / "c.yaml").write_text(
        f"run: {{name: c}}\n{common}reward: {{components: [{{name: exact_match}}], isolation: inline}}\n"
        "train: {steps: 1}\nrollout: {n: 2, problems_per_step: 2, sampling: {max_new_tokens: 4}}\n"
        "sweep:\n  seeds: [0]\n  prepare: {sft: {config: sft.yaml}}\n"
        "  overrides: [\"model.path={prepare.sft}/final_model\"]\n  arms: [[rollout.n=2]]\n"
        "  metric: baseline_accuracy\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "tether.cli", "sweep", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "o" / "prepare" / "sft" / "final_model").is_dir() and "[tether sweep prepare] 1/1 sft: done" in r.stdout
    payload = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert payload["prepare"][0]["summary"]["kind"] == "sft" and payload["table"][0]["n"] == 1
    run_cfg = (tmp_path / "o" / "rollout.n=2" / "seed-0" / "config.yaml")
    assert str(tmp_path / "o" / "prepare" / "sft" / "final_model") in run_cfg.read_text()  # the arm started from it
    r2 = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert r2.returncode == 0 and "1/1 sft: done (reused)" in r2.stdout and "1 done, 0 to run" in r2.stdout


def test_a_metric_the_reference_arm_lacks_shows_no_difference():
    from tether.sweep import compute_sweep_table, expand_arms, format_table

    arms = expand_arms({"kl": ["0", "0.05"]})
    rows = compute_sweep_table([{"arm": "kl=0.05", "seed": s, "value": 0.1 + s} for s in (0, 1)], arms, "mean:kl_loss")
    assert format_table(rows).splitlines()[-1] == "| `kl=0.05` | 0.6000 ± 0.5000 | 2 | — |"  # not "+nan ± nan"
