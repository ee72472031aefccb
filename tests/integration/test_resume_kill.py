"""kill -9 at any point, then --resume: the run's metrics, health events, samples and weights equal
an uninterrupted run's (issue 14). The kills are exact: `TETHER_KILL_AT=<point>@<n>` makes the run
SIGKILL itself the n-th time it reaches a named point (tether.io.killpoints), including between
the files of a checkpoint write and in the middle of a metrics row."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tether.io.killpoints import KILL_POINTS

HERE = Path(__file__).parent
ARGS = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "run.threads=1", "eval.samples=1", "eval.problems=2", "data.task=reverse", "data.train_size=32",
        "data.eval_size=4", "rollout.problems_per_step=2", "rollout.n=2", "rollout.sampling.max_new_tokens=4",
        "eval.sampling.max_new_tokens=4", "reward.isolation=inline", "train.steps=4", "checkpoint.every=2",
        "checkpoint.keep=2", "logging.samples_per_step=2"]
# 4 steps, checkpoints at steps 2 and 4 (the 3rd save re-writes step 4 at the end); metrics rows: the
# step-0 evaluation, then steps 1..4. `point@n`: the n-th time the run reaches the point.
KILLS = [
    "step/computed@1",   # before the first checkpoint: --resume starts from step 0
    "metrics/torn@3",    # half of step 2's row written
    "ckpt/model@1",      # inside the first checkpoint write ...
    "ckpt/optimizer@1",
    "ckpt/state@1",
    "ckpt/manifest@1",   # ... complete but not yet renamed into place
    "ckpt/renamed@1",    # in place, `latest` not moved
    "ckpt/done@1",
    "step/samples@3",    # step 3 fully logged, resumed from step 2
    "ckpt/optimizer@2",  # inside the second checkpoint (step 4) write
    "eval/done@1",       # the final evaluation done, not logged
    "ckpt/state@3",      # inside the final re-save of step 4
]
TIMING = ("time/", "train/tokens_per_s", "rollout/tokens_per_s", "reward/seconds")


def _jobs_for(tmp: Path, name: str, kill: str | None) -> list[dict]:
    cfg = tmp / "c.yaml"
    base = ["train", str(cfg), "--run-dir", str(tmp / name), *ARGS]
    log = str(tmp / f"{name}.log")
    if kill is None:
        return [{"args": base, "log": log}]
    return [{"args": base, "env": {"TETHER_KILL_AT": kill}, "log": log},
            {"args": [*base, "--resume"], "env": {"TETHER_KILL_AT": ""}, "log": log}]


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if not k.startswith(TIMING)})
    return out


def _samples(run: Path) -> dict[str, str]:
    return {f.name: gzip.decompress(f.read_bytes()).decode() for f in sorted((run / "samples").iterdir())}


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "step_000004" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 25 short runs; ~2 min on 2 free cores, far more on a loaded machine
def test_kill9_at_every_point_then_resume_equals_an_uninterrupted_run(tmp_path):
    assert {k.split("@")[0] for k in KILLS} <= set(KILL_POINTS)
    (tmp_path / "c.yaml").write_text("run:\n  name: kill\n")
    jobs = _jobs_for(tmp_path, "ref", None)
    for i, kill in enumerate(KILLS):
        jobs += _jobs_for(tmp_path, f"k{i}", kill)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(HERE / "kill_driver.py"), json.dumps(jobs)], capture_output=True, text=True,
                       env=env, timeout=1200, cwd=HERE.parents[1])
    assert r.returncode == 0, r.stderr[-3000:]
    codes = json.loads(r.stdout.strip().splitlines()[-1])
    assert codes[0] == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref = tmp_path / "ref"
    ref_rows, ref_health, ref_samples, ref_w = (_rows(ref / "metrics.jsonl"), _rows(ref / "health.jsonl"),
                                                _samples(ref), _weights(ref))
    assert [row["step"] for row in ref_rows] == [0, 1, 2, 3, 4]
    assert any(k.startswith("health/") for k in ref_rows[-1]) and ref_health  # health state is part of the comparison
    for i, kill in enumerate(KILLS):
        run, log = tmp_path / f"k{i}", (tmp_path / f"k{i}.log")
        killed, resumed = codes[1 + 2 * i], codes[2 + 2 * i]
        assert killed == -9, f"{kill}: the run was not killed (exit {killed}): {log.read_text()[-2000:]}"
        assert resumed == 0, f"{kill}: resume failed: {log.read_text()[-3000:]}"
        assert _rows(run / "metrics.jsonl") == ref_rows, kill
        assert _rows(run / "health.jsonl") == ref_health, kill
        assert _samples(run) == ref_samples, kill
        w = _weights(run)
        assert w.keys() == ref_w.keys() and all(torch.equal(w[k], ref_w[k]) for k in w), kill
