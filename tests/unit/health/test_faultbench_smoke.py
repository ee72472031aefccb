"""`tether faultbench --smoke`: two faults (obvious) and one healthy seed, end to end on CPU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tether.cli import app


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard only: ~1 min on an idle 2-core CPU, many on a loaded one
def test_faultbench_smoke(tmp_path):
    res = CliRunner().invoke(app, ["faultbench", "--smoke", "--workers", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "results.json").read_text())
    for key in ("recall_obvious", "recall_subtle", "false_alarm_rate", "steps_to_detect_median", "diagnosis_top1",
                "diagnosis_top3", "remediation_success", "harm_rate", "per_fault"):
        assert key in out
    assert out["errors"] == [] and out["runs"] == 6
    rows = {r["fault"]: r for r in out["per_fault"]}
    assert rows["group_mixing"]["detected"] == 1 and rows["group_mixing"]["top1"] == 1  # an invariant: exact
    assert rows["lr_spike"]["detected"] == 1
    cases = [json.loads(x) for x in (tmp_path / "cases.jsonl").read_text().splitlines()]
    auto = next(c for c in cases if c["id"] == "lr_spike-obvious-s0-auto")
    assert auto["actions"] and auto["actions"][0]["action"] == "lower_lr"  # rolled back and repaired (or tried to)
    assert "recall_obvious" in res.output  # the table is printed
