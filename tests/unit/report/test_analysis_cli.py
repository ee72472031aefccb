"""`tether plan | fit | report | compare`: outputs, files, and exit code 2 on invalid use."""

from __future__ import annotations

import json

from report_helpers import make_fake_run
from typer.testing import CliRunner

from tether.cli import app
from tether.plan.pilot import PilotResult

runner = CliRunner()


def _pilot(tmp_path):
    counts = tuple((16, c) for c in [0, 0, 1, 1, 2, 3, 4, 6, 8, 10, 12, 16] * 4)
    p = PilotResult(tuple(f"p{i}" for i in range(len(counts))), counts, 4.0, 6.0, model="m")
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps(p.to_json()))
    return path


def test_help_lists_the_analysis_commands():
    out = runner.invoke(app, ["--help"]).output
    for cmd in ("plan", "fit", "report", "compare"):
        assert cmd in out
        assert runner.invoke(app, [cmd, "--help"]).exit_code == 0


def test_plan_from_saved_pilot(tmp_path):
    pilot = _pilot(tmp_path)
    r = runner.invoke(app, ["plan", "unused", "--pilot", str(pilot), "--budget", "4096"])
    assert r.exit_code == 0, r.output
    assert "recommended: n=" in r.output and "rollout.problems_per_step=" in r.output
    r = runner.invoke(app, ["plan", "unused", "--pilot", str(pilot), "--budget", "40000", "--unit", "tokens", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["budget_rollouts"] == 10000 and plan["budget_tokens"] == 40000.0  # 4 tokens per rollout
    assert plan["n"] * plan["problems_per_step"] * plan["steps"] <= 10000
    assert set(plan["classes"]) == {"unsolved", "hard", "medium", "easy"} and plan["pilot"]["problems"] == 48


def test_plan_invalid_use(tmp_path):
    pilot = _pilot(tmp_path)
    assert runner.invoke(app, ["plan", "x", "--pilot", str(pilot), "--budget", "10", "--unit", "flops"]).exit_code == 2
    assert runner.invoke(app, ["plan", "x", "--pilot", str(pilot), "--budget", "0"]).exit_code == 2
    r = runner.invoke(app, ["plan", str(tmp_path / "nope"), "--budget", "100"])
    assert r.exit_code == 2 and "tether: error" in r.output  # a missing path is bad input


def test_report_and_compare_and_fit(tmp_path):
    a = make_fake_run(tmp_path / "a")
    b = make_fake_run(tmp_path / "b", n=8, steps=6)
    r = runner.invoke(app, ["report", str(a), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    r = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "c.html")])
    assert r.exit_code == 0, r.output
    assert "final pass@1" in r.output and (tmp_path / "c.html").is_file()
    r = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "c.html"), "--json"])
    assert json.loads(r.output)[1]["n"] == 8
    r = runner.invoke(app, ["fit", str(a), "--metric", "reward/mean", "--compute", "steps", "--bootstrap", "5",
                            "--law", "power", "--out", str(tmp_path / "fit")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "fit" / "scaling_fit.json").read_text())
    assert rep["fits"]["a"]["power"]["n_points"] == 12 and (tmp_path / "fit" / "plots" / "scaling_fit.png").is_file()


def test_invalid_directories_and_options(tmp_path):
    assert runner.invoke(app, ["report", str(tmp_path / "missing")]).exit_code == 2
    assert runner.invoke(app, ["compare", str(tmp_path / "missing")]).exit_code == 2
    a = make_fake_run(tmp_path / "a")
    assert runner.invoke(app, ["fit", str(a), "--compute", "flops"]).exit_code == 2
    assert runner.invoke(app, ["compare", str(a), "--x", "time"]).exit_code == 2
    r = runner.invoke(app, ["fit", str(a), "--metric", "nope", "--out", str(tmp_path / "f")])
    assert r.exit_code == 1 and "no points" in r.output
