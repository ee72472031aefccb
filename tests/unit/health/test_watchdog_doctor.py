"""The watchdog names a hung phase and exits non-zero; `tether doctor` reads a run directory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from typer.testing import CliRunner

from tether.cli import app
from tether.health.diagnosis import diagnose
from tether.health.detectors import Finding
from health_helpers import series


def test_watchdog_names_the_stuck_phase_and_exits_3(tmp_path):
    code = textwrap.dedent(f"""
        import time
        from tether.health.monitor import Watchdog
        from tether.io.run_dir import make_run_dir
        from tether.phase import marks_phase, phase
        rd = make_run_dir({str(tmp_path)!r})
        @marks_phase("reward")
        def run_rewards():          # a reward that never returns
            time.sleep(60)
        with phase("loop"):         # the recipe marks its phases; the watchdog reads the markers
            Watchdog(1.5, rd, interval=0.2)
            run_rewards()
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)  # loaded CI: slow imports
    assert p.returncode == 3
    assert "stuck in phase 'reward'" in p.stderr and "run_rewards" in p.stderr
    rec = json.loads((tmp_path / "health.jsonl").read_text().splitlines()[-1])
    assert rec["kind"] == "hang" and rec["phase"] == "reward"
    assert (tmp_path / "health_stacks.txt").read_text()


def test_watchdog_stops_when_training_is_over():
    from tether.health.monitor import Watchdog

    fired = []
    w = Watchdog(0.3, None, interval=0.05, exit_fn=fired.append)  # no training function on this stack
    w._thread.join(timeout=60)  # returns as soon as the thread stops (~0.05 s idle)
    assert not w._thread.is_alive() and fired == []


def _finding(det, step, severity="critical", **ev):
    return Finding(det, "m", severity, step, step, "msg", ev)


def test_diagnosis_ranks_the_cause_whose_fingerprint_fits():
    assert diagnose([_finding("grad_spike", 16), _finding("kl_explosion", 16), _finding("regression", 18)])[0].cause == "lr_too_high"
    assert diagnose([_finding("advantage_misalignment", 15), _finding("regression", 17)])[0].cause == "advantage_bug"
    hack = [_finding("reward_hacking", 17, rule="paid_wrong"), _finding("reward_noise", 17, rule="auc")]
    assert diagnose(hack)[0].cause == "exploitable_reward"
    noise = [_finding("reward_hacking", 15, rule="paid_wrong"), _finding("reward_noise", 15, rule="correct_unpaid")]
    assert diagnose(noise)[0].cause == "noisy_reward"
    top = diagnose([_finding("stale_weights", 15), _finding("logp_gap", 16)])[0]
    assert top.cause == "stale_weights" and top.family == "system" and top.since == 15
    assert diagnose([]) == []


def test_reward_findings_under_a_proxy_reward_point_at_the_learned_reward():
    """The same findings as a noisy verifier (correct samples unpaid, wrong ones paid) when the
    verifier is unpaid (weight 0) and a judge carries the reward: the judge disagrees with the
    verifier - learned_reward_exploited (faultbench exploitable_judge), not noisy_reward."""
    from tether.health.detectors import RunContext

    noise = [_finding("reward_noise", 13, rule="correct_unpaid"), _finding("reward_hacking", 14, rule="paid_wrong")]
    judge = RunContext("exact_match", {"exact_match": 0.0, "my:judge": 1.0})
    assert diagnose(noise, judge)[0].cause == "learned_reward_exploited"
    verifier_paid = RunContext("exact_match", {"exact_match": 1.0, "my:judge": 1.0})
    assert diagnose(noise, verifier_paid)[0].cause == "noisy_reward"
    assert diagnose(noise)[0].cause == "noisy_reward"
    lr = [_finding("grad_spike", 16), _finding("kl_explosion", 16)]  # not a reward finding: unchanged
    assert diagnose(lr, judge)[0].cause == "lr_too_high"


def _write_run(path, rows, events=()):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, **r}) + "\n" for i, r in enumerate(rows, 1)))
    (path / "health.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_doctor_healthy_and_faulty_runs(tmp_path):
    runner = CliRunner()
    _write_run(tmp_path / "ok", series(40, 0))
    res = runner.invoke(app, ["doctor", str(tmp_path / "ok")])
    assert res.exit_code == 0 and "HEALTHY" in res.output

    def flip(row, step):
        row["advantage/score_corr"] = -0.95
        row["accuracy"] = row["reward/mean"] = max(0.0, 0.35 - 0.03 * (step - 20))

    _write_run(tmp_path / "bad", series(40, 0, {"f": flip}, start=20),
               [{"kind": "action", "event": "apply", "step": 22, "action": "lower_lr", "changes": []}])
    res = runner.invoke(app, ["doctor", str(tmp_path / "bad")])
    assert res.exit_code == 0, res.output
    assert "UNHEALTHY since step 20" in res.output and "credit_assignment" in res.output
    assert "apply lower_lr" in res.output
    res = runner.invoke(app, ["doctor", "--json", str(tmp_path / "bad")])
    rep = json.loads(res.output)
    assert rep["family"] == "credit_assignment" and rep["since"] == 20 and rep["cause"] == "advantage_bug"
    res = runner.invoke(app, ["doctor", str(tmp_path / "missing")])
    assert res.exit_code == 2
