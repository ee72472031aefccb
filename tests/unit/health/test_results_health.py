"""The extended benchmark's results section (tools/results_health.py) from a small, hand-built set of run
records scored by tether.recipes.faultbench_score: the halves side by side, the reliability table and
the blind spots come out with the numbers the records give. Pure computation: well under a second."""

import sys
from pathlib import Path

from tether.health.faults import get_fault_class
from tether.recipes.faultbench_score import case_id, compute_results

ROOT = Path(__file__).resolve().parents[3]


def _tools(name):
    sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not a package: its modules import each other by name
    return __import__(name)


def _rec(fault, severity, seed, mode="advise", acc=0.4, alarm=None, answer=None, conf=0.9, variant=""):
    cls = get_fault_class(fault) if fault else None
    named = answer not in (None, "unexplained")
    return {"id": case_id(fault, severity, seed, mode, variant),
            "case": {"fault": fault, "severity": severity, "seed": seed, "mode": mode, "variant": variant},
            "final_train_acc": acc, "first_alarm_step": alarm, "alarms_before_start": 0,
            "diagnosis": [answer] if answer else [], "diagnosis_family": [cls.family if named and cls else answer] if answer else [],
            "diagnosis_detail": [{"cause": answer, "confidence": conf if named else 0.2}] if answer else [],
            "actions": [], "halted": None}


def _held_kind() -> str:
    """A held-out kind inside the taxonomy: the current round's (tether.health.faults.split)."""
    from tether.health.faults.split import HELD_OUT

    return next(k for k in HELD_OUT if get_fault_class(k).cause != "unexplained")


HELD = _held_kind()


def _records():
    recs = [_rec(None, None, s, m, acc=0.4) for s in range(4) for m in ("advise", "auto")]
    recs += [_rec(None, None, s, "advise", variant="threads2") for s in range(4)]
    recs.append(_rec(None, None, 3, "advise", variant="kl", alarm=20, answer="lr_too_high"))  # one false alarm
    for s in (0, 1):
        # tuned, inside the taxonomy: caught and named right
        recs.append(_rec("mask_shift", "obvious", s, alarm=13, answer="loss_mask_bug", conf=0.9))
        # tuned, outside the taxonomy: caught, answered unexplained once and a wrong name once
        recs.append(_rec("loss_sign_flip", "obvious", s, alarm=15, answer="unexplained" if s == 0 else "lr_too_high", conf=0.7))
        # held out: never caught
        recs.append(_rec(HELD, "subtle", s))
    return recs


def test_the_section_reads_the_halves_reliability_and_blind_spots():
    rh = _tools("results_health")
    f = compute_results(_records(), {k: get_fault_class(k) for k in ("mask_shift", "loss_sign_flip", HELD)}, 13)
    assert f["tuned"]["diagnosis_top1"] == 0.75 and f["tuned"]["unexplained_rate_outside"] == 0.5
    assert f["held_out"]["recall_subtle"] == 0.0 and f["held_out"]["diagnosis_top1"] is None
    f["config"] = {"faults": ["mask_shift", "loss_sign_flip", HELD], "seeds": [0, 1]}
    f["wall_seconds"], f["cpu_seconds_runs"] = 600.0, 3600.0
    f["provenance"] = {"workers": 2, "cpu": "a CPU", "cores": 2, "commit": "0123456789abcdef", "finished": "2026-12-04T17:00:00Z",
                       "loadavg_before": "1.0 1.0 1.0 1/1 1", "loadavg_after": "2.0 2.0 2.0 1/1 1",
                       "command": "bash benchmarks/faultbench_extended.sh 2"}
    values = rh.read_health_extended({"fb": f})
    text = rh.HEALTH_EXTENDED.text.format(**values)
    assert "| tuned half | 2 | 1.00 | — | **0.75** |" in text
    assert "| held-out half | 1 | — | 0.00 | **—** |" in text
    assert values["fa"] == "0/4" and values["fa_t2"] == "0/4" and values["fa_kl"] == "1/1"
    # reliability: the three named answers (two at 0.9 right, one at 0.7 wrong) in their bins
    assert "| 0.8-1.0 | 2: 0.90 / 1.00 | 2: 0.90 / 1.00 | 0 |" in text
    assert "| 0.6-0.8 | 1: 0.70 / 0.00 | 1: 0.70 / 0.00 | 0 |" in text
    # the blind spots: the held-out kind never caught; the outside kind named right in 1 of 2 is not listed
    assert f"| `{HELD}` | subtle | held_out | `{get_fault_class(HELD).cause}` | 0/2 | — | — | not caught |" in text
    assert "`loss_sign_flip`" not in values["blind"] and "`mask_shift`" not in values["blind"]
    assert "| outside the taxonomy answered \"unexplained\" | ≥ 0.8 | 0.50 | **missed** |" in text
    headline = rh.HEALTH_EXTENDED.headline.format(**values)
    assert "names the cause first in 0.75 of runs on the tuned kinds and — on the held-out ones" in headline
    assert "\"unexplained\" for 1/2 of the faults outside its taxonomy, 0/4 false alarms" in headline


def test_the_overhead_section_adds_the_batch_checks_and_judges_the_bar():
    rh = _tools("results_health")
    o = {"overhead_frac": 0.012, "overhead_frac_per_step_median": 0.011, "overhead_frac_per_step_max": 0.03, "steps": 40,
         "layer_seconds": {"time/health": 2.0, "time/probes": 1.5, "time/fingerprint": 0.1}, "step_seconds_without_layer": 300.0,
         "date": "2026-12-04T16:40:00Z", "cores": 2, "loadavg_start": [5.0, 6.0, 7.0], "cpu_seconds": 500.0,
         "batch_shape": {"sequences": 128, "tokens_per_sequence": 320}, "batch_checks_seconds_per_step": 0.01,
         "overhead_frac_with_batch_checks": 0.0133}
    text = rh.HEALTH_OVERHEAD.text.format(**rh.read_health_overhead({"oh": o}))
    assert "in all **1.33%** of the RL step time" in text and "within issue 41's bar" in text and "10.0 ms a step" in text
    o["overhead_frac_with_batch_checks"] = 0.025
    assert "**above** issue 41's bar" in rh.HEALTH_OVERHEAD.text.format(**rh.read_health_overhead({"oh": o}))
