"""Ctrl-C finishes the step, writes a checkpoint and exits cleanly; --resume continues."""

import json
import os
import signal
import subprocess
import sys
import time

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "run.threads=1", "checkpoint.every=0", "eval.samples=1", "eval.problems=4", "data.task=reverse",
        "data.train_size=32", "data.eval_size=4", "rollout.problems_per_step=2", "rollout.n=2",
        "rollout.sampling.max_new_tokens=4", "eval.sampling.max_new_tokens=4", "reward.isolation=inline"]


def step_rows(run):
    p = run / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip() and "reward/mean" in line]


def test_sigint_checkpoints_and_resume_continues(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  steps: 500\n")
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "tether.cli", "train", str(cfg), "--run-dir", str(run), *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 900  # left as soon as two steps are logged; generous for a loaded machine
    while len(step_rows(run)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "stop requested" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True
    done = summary["steps"]
    assert done == len(step_rows(run)) >= 2
    assert (run / "checkpoints" / f"step_{done:06d}").is_dir()
    # resume to exactly one more step
    r = subprocess.run([sys.executable, "-m", "tether.cli", "train", str(cfg), "--run-dir", str(run), "--resume",
                        *TINY, f"train.steps={done + 1}"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [row["step"] for row in step_rows(run)] == list(range(1, done + 2))
