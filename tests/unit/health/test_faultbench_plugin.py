"""A user's fault in one file outside the source tree, run AND scored by
`tether faultbench --fault package.module:Class` (its cause, family, single severity and base
config come from the class), and the fault API pieces it relies on."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from tether.cli import app
from tether.health.faults import FaultView, ReadOnly, get_fault_class
from tether.recipes.faultbench import Case, _case_overrides, make_cases

USER_FAULT = textwrap.dedent('''
    from tether.health.faults import Fault

    class BlankAnswers(Fault):
        """Every gold answer is replaced by '?' (a bad join): nothing can be solved."""
        name, family, cause = "blank_answers_user", "data", "data_corruption"
        severities = {"obvious": {"answer": "?"}}
        base = ("rollout.sampling.max_new_tokens=5",)

        def on_problems(self, problems, step):
            assert len(self.view.dataset) > 0  # the read-only dataset view
            return [dict(p, answer=self.p["answer"]) for p in problems]
''')


def _write_package(root):
    pkg = root / "userfaults"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "blank.py").write_text(USER_FAULT)
    return "userfaults.blank:BlankAnswers"


def test_one_severity_base_and_start_come_from_the_class(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = _write_package(tmp_path)
    cls = get_fault_class(spec)  # imported from the working directory, as `python -m` would
    cases = make_cases([spec], ("subtle", "obvious"), [0, 1], [0])
    assert {c.severity for c in cases if c.fault} == {"obvious"} and len([c for c in cases if c.fault]) == 4
    ov = _case_overrides(Case(spec, "obvious", 0, "advise"), tmp_path, 10, 5, [])
    assert "rollout.sampling.max_new_tokens=5" in ov and any('"userfaults.blank:BlankAnswers"' in o for o in ov)
    assert get_fault_class(str(tmp_path / "userfaults" / "blank.py") + ":BlankAnswers").cause == cls.cause


def test_rollout_topk_starts_at_step_1_in_the_benchmark():
    ov = _case_overrides(Case("rollout_topk", "obvious", 0, "advise"), "m", 40, 15, [])
    assert any("start: 1}" in o for o in ov)


def test_read_only_views():
    class _St:
        policy = type("P", (), {"version": 3})()
        stream = type("S", (), {"problems": [{"id": "a", "answer": "1"}]})()

    view = FaultView(_St())
    assert view.policy.version == 3
    with pytest.raises(AttributeError, match="read-only"):
        view.policy.version = 4
    with pytest.raises(TypeError):
        view.dataset[0]["answer"] = "2"
    assert isinstance(view.policy, ReadOnly)


def test_bad_fault_spec_is_a_one_line_error(tmp_path):
    res = CliRunner().invoke(app, ["faultbench", "--fault", "no_such_pkg.mod:Fault", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "no_such_pkg" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_user_fault_outside_the_tree_is_run_and_scored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = _write_package(tmp_path)
    out = tmp_path / "bench"
    res = CliRunner().invoke(app, [
        "faultbench", "--fault", spec, "--seeds", "0", "--healthy-seeds", "0", "--mode", "advise", "--steps", "10",
        "--start", "5", "--workers", "1", "--out", str(out), "--set", "sft.steps=40"])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    row = next(r for r in results["per_fault"] if r["fault"] == spec)
    assert (row["cause"], row["family"], row["severity"], row["runs"]) == ("data_corruption", "data", "obvious", 1)
    assert row["detected"] == 1  # answers nobody can give: flagged
    assert results["recall_obvious"] == 1.0 and results["recall_subtle"] is None
    assert results["diagnosis_top1"] is not None  # scored against the class's cause


def test_rescore_marks_a_benchmark_cut_short_as_partial(tmp_path):
    rec = lambda seed, alarm: {"id": Case(None, None, seed, "advise").id, "final_train_acc": 0.4,  # noqa: E731
                               "case": {"fault": None, "severity": None, "seed": seed, "mode": "advise"},
                               "first_alarm_step": alarm}
    (tmp_path / "cases.jsonl").write_text("\n".join(json.dumps(rec(s, 7 if s == 0 else None)) for s in range(4)) + "\n")
    res = CliRunner().invoke(app, ["faultbench", "--out", str(tmp_path), "--rescore", "--planned", "10"])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "results.json").read_text())
    assert out["partial"] is True and out["runs_done"] == 4 and out["false_alarm_rate"] == 0.25


def test_repairs_are_scored_against_a_healthy_run_in_the_faults_own_base_config():
    """clip_disabled runs 3 epochs per batch (its `base`): a healthy 3-epoch run ends lower than
    the plain base run, and the damage auto mode must undo is measured from it, not from the
    plain run (whose extra accuracy no repair of the fault could bring back)."""
    from tether.recipes.faultbench import compute_results

    cases = make_cases(["clip_disabled", "lr_spike"], ("obvious",), [0, 1], [0], auto_remediable_only=True)
    own = [c for c in cases if c.variant == "base-clip_disabled"]
    assert [(c.seed, c.mode, c.fault) for c in own] == [(0, "advise", None), (1, "advise", None)]
    assert not any(c.variant == "base-lr_spike" for c in cases)  # no base config: the plain controls
    ov = _case_overrides(own[0], "m", 30, 13, [])
    assert "algo.epochs=3" in ov and not any(o.startswith("health.inject") for o in ov)

    def rec(case, acc):
        return {"id": case.id, "case": {"fault": case.fault, "severity": case.severity, "seed": case.seed,
                                        "mode": case.mode, "variant": case.variant},
                "final_train_acc": acc, "first_alarm_step": 14 if case.fault else None, "diagnosis": ["lr_too_high"],
                "diagnosis_family": ["optimisation"], "actions": [], "halted": None}

    records = [rec(Case(None, None, 0, "advise"), 0.5), rec(Case(None, None, 0, "auto"), 0.5),
               rec(Case("clip_disabled", "obvious", 0, "advise"), 0.1), rec(Case("clip_disabled", "obvious", 0, "auto"), 0.22)]
    registry = {"clip_disabled": get_fault_class("clip_disabled")}
    plain = compute_results(records, registry, 13)  # no own-config control: the plain run (0.5) is the reference
    assert plain["remediation_success"] == 0.0 and plain["per_fault"][0]["healthy_acc"] == 0.5
    both = compute_results(records + [rec(own[0], 0.3)], registry, 13)  # 0.12 of the 0.2 damage recovered
    assert both["remediation_success"] == 1.0 and both["per_fault"][0]["healthy_acc"] == 0.3
    assert both["remediation_success_plain_ref"] == 0.0


def test_scores_are_reported_per_half_and_outside_faults_are_right_when_unexplained():
    """mask_shift (tuned, in the taxonomy), loss_sign_flip (tuned, outside it) and a held-out kind
    inside the taxonomy: each half gets its own recall, diagnosis and unexplained rate; a fault outside the
    taxonomy scores top-1 only when the answer is `unexplained`, one inside it never does."""
    from tether.health.faults.split import HELD_OUT
    from tether.recipes.faultbench import compute_results

    held = next(k for k in HELD_OUT if get_fault_class(k).cause != "unexplained")  # the current round's
    cause = get_fault_class(held).cause

    def rec(fault, sev, seed, dx, conf=0.9, alarm=14):
        return {"id": Case(fault, sev, seed, "advise").id,
                "case": {"fault": fault, "severity": sev, "seed": seed, "mode": "advise", "variant": ""},
                "final_train_acc": 0.4, "first_alarm_step": alarm, "diagnosis": dx, "diagnosis_family": ["x"] * len(dx),
                "diagnosis_detail": [{"cause": d, "confidence": conf} for d in dx], "actions": [], "halted": None}

    records = [rec("mask_shift", "obvious", 0, ["loss_mask_bug"]), rec("mask_shift", "subtle", 0, ["unexplained", "loss_mask_bug"]),
               rec("loss_sign_flip", "obvious", 0, ["unexplained", "advantage_bug"]),
               rec("loss_sign_flip", "subtle", 0, ["advantage_bug"], conf=0.7),
               rec(held, "obvious", 0, [cause]), rec(held, "subtle", 0, [], alarm=None)]
    registry = {f: get_fault_class(f) for f in ("mask_shift", "loss_sign_flip", held)}
    res = compute_results(records, registry, 13)
    t, h = res["tuned"], res["held_out"]
    assert t["runs"] == 4 and t["diagnosis_top1"] == 0.5  # mask_shift obvious and loss_sign_flip obvious right
    assert t["diagnosis_top1_in_taxonomy"] == 0.5 and t["abstain_rate_in_taxonomy"] == 0.5
    assert t["unexplained_rate_outside"] == 0.5 and t["outside_detected"] == 2
    assert h["runs"] == 2 and h["recall_subtle"] == 0.0 and h["recall_obvious"] == 1.0 and h["diagnosis_top1"] == 1.0
    # calibration over named answers: 0.9 (right: mask_shift, the held-out kind), 0.7 (wrong: loss_sign_flip subtle)
    assert res["calibration"]["runs"] == 3


def test_reliability_table_and_expected_calibration_error_by_hand():
    from tether.recipes.faultbench_score import compute_reliability

    pts = [(0.9, True), (0.9, True), (0.9, False), (0.3, False)]
    rel = compute_reliability(pts)
    top = next(r for r in rel["table"] if r["bin"] == "0.8-1.0")
    assert top == {"bin": "0.8-1.0", "runs": 3, "confidence": 0.9, "right": round(2 / 3, 4)}
    # ECE = 3/4 x |2/3 - 0.9| + 1/4 x |0 - 0.3| = 0.175 + 0.075
    assert rel["ece"] == pytest.approx(0.75 * abs(2 / 3 - 0.9) + 0.25 * 0.3)
    assert compute_reliability([(1.0, True)])["ece"] == 0.0  # 1.0 falls in the last bin
