"""End to end on a real (tiny) RL run: eval curves, a real pilot for `tether plan`, the report,
and — when Debian's chromium is installed (the Makefile's test setup tries) — the report
rendered in headless Chromium: the DOM holds every section, the charts and the trajectories,
and the screenshot is not blank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tether.cli import app
from tether.config import load_config
from tether.recipes.rl import run_rl

CHROMIUM = "/usr/bin/chromium"
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
        "run.threads=1", "checkpoint.every=0", "data.task=reverse", "data.train_size=32", "data.eval_size=6",
        "train.steps=4", "eval.every=2", "eval.samples=4", "rollout.problems_per_step=4", "rollout.n=4",
        "rollout.sampling.max_new_tokens=6", "eval.sampling.max_new_tokens=6", "reward.isolation=inline"]
runner = CliRunner()
pytestmark = pytest.mark.xdist_group("report_chromium")  # one worker builds the run once (module fixture)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    rd = tmp_path_factory.mktemp("demo") / "rl"
    run_rl(load_config(None, TINY), rd)
    with open(rd / "health.jsonl", "a") as f:  # whatever the health layer writes is rendered generically
        f.write(json.dumps({"kind": "finding", "step": 2, "detector": "test_detector", "message": "synthetic"}) + "\n")
    return rd


def test_eval_writes_curves_and_plot(run_dir, tmp_path):
    r = runner.invoke(app, ["eval", str(run_dir), "eval.samples=4", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert set(ev["curves"]) == {"pass@k", "maj@k", "best@k", "mean@k"} and list(ev["curves"]["pass@k"]) == ["1", "2", "3", "4"]
    assert ev["best_of"] == "logprob" and len(ev["pass_rates"]) == 6
    assert (tmp_path / "plots" / "eval_tts.png").read_bytes()[:4] == b"\x89PNG"
    # a checkpoint directory evaluates with its run's config
    ckpt = next((run_dir / "checkpoints").glob("step_*"))
    r = runner.invoke(app, ["eval", str(ckpt), "--out", str(tmp_path / "c"), "--no-plot"])
    assert r.exit_code == 0, r.output
    assert ckpt.name in json.loads((tmp_path / "c" / "eval.json").read_text())["model"]


def test_metrics_carry_maj_and_best(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/pass@1" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(k in evals[-1] for k in ("eval/maj@4", "eval/best@4", "eval/pass@4"))


def test_plan_runs_a_real_pilot(run_dir):
    r = runner.invoke(app, ["plan", str(run_dir), "--budget", "2048", "--pilot-problems", "8", "--pilot-samples", "4", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output[r.output.index("{"):])
    assert plan["pilot"]["problems"] == 8 and plan["used_rollouts"] <= 2048


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it when it can)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    r = runner.invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "report.html")])
    assert r.exit_code == 0, r.output
    url = (tmp_path / "report.html").resolve().as_uri()
    dom = _chromium(["--dump-dom", url], tmp_path).stdout
    for section in ("summary", "curves", "evaluation", "health", "trajectories", "config"):
        assert f'id="{section}"' in dom, section
    charts = re.findall(r'<svg class="chart[^"]*"[^>]*data-metric="([^"]+)"[^>]*data-points="(\d+)"', dom)
    drawn = {m for m, pts in charts if int(pts) > 0}
    assert {"reward", "accuracy", "entropy", "response length", "grad norm", "tts-pass@k", "health"} <= drawn, drawn
    assert dom.count('class="trajectory"') >= 3 and "test_detector" in dom
    shot = tmp_path / "shot.png"
    _chromium(["--window-size=1280,2400", f"--screenshot={shot}", url], tmp_path)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.shape[0] >= 2000 and pixels.std() > 10  # not blank
    dark = (pixels < 128).mean()
    assert 0.01 < dark < 0.5, dark  # text and lines drawn, not a black page
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
