"""Each detector on synthetic series: quiet on healthy noise, fires (with its mode) on the change
it documents, a few steps after the change starts."""

from __future__ import annotations

import math
import random

import pytest

from tether.health.detectors import DETECTORS, Detector
from health_helpers import replay, series


def _set(key, value):
    def fn(row, step):
        row[key] = value(row, step) if callable(value) else value
    return fn


CASES = {
    "nonfinite": {"nonfinite_steps": _set("nonfinite_steps", lambda r, s: float(s - 14))},
    "grad_spike": {"grad_norm": _set("grad_norm", 12.0)},
    "kl_explosion": {"approx_kl": _set("approx_kl", 0.5)},
    "clip_saturation": {"clip_frac": _set("clip_frac", 0.4)},
    "entropy_collapse": {"entropy": _set("entropy", 0.1)},
    "entropy_explosion": {"entropy": _set("entropy", 2.5)},
    "no_signal": {"zv": _set("frac_zero_variance_groups", 1.0)},
    "truncation": {"t": _set("truncation_rate", 0.6)},
    "length": {"l": _set("response_length/mean", 0.9)},
    "reward_hacking": {"w": _set("health/reward_incorrect_mean", 0.5), "r": _set("reward/mean", 0.6)},
    "reward_noise": {"c": _set("health/reward_correct_mean", 0.6)},
    "error_surge": {"e": _set("reward/error_rate", 0.2)},
    "advantage_misalignment": {"a": _set("advantage/score_corr", -0.9)},
    "group_integrity": {"g": _set("health/group_mixed_frac", 0.5)},
    "data_shift": {"p": _set("health/prompt_len_mean", 2.5)},
    "stale_weights": {"v": _set("health/rollout_version_min", 14.0)},
    "logp_gap": {"g": _set("logp_gap_mean", 0.05)},
    "stall": {"t": _set("time/step", 1.0), "r": _set("time/reward", 0.8)},
    "regression": {"a": _set("accuracy", 0.05)},
    "learned_reward": {"a": _set("eval/reward_agreement/reward_model", 0.3)},
}


SANITY = {"logp_floor", "update_size", "advantage_invariants", "group_structure", "reward_linkage", "accuracy_drop",
          "loss_mask", "token_ids"}  # absolute checks: from step 1, tested in test_sanity.py
PROGRESS = {"progress", "kl_probe", "forward_mismatch", "loss_norm", "sampler_state", "param_drift", "duplicates",
            "answer_leak", "grad_memory", "optimizer_state"}  # progress and invariant checks: tested in test_progress.py


def test_every_detector_has_a_case_and_a_docstring():
    assert set(CASES) | SANITY | PROGRESS == set(DETECTORS)
    assert not set(CASES) & SANITY and not (set(CASES) | SANITY) & PROGRESS
    for cls in DETECTORS.values():
        assert cls.__doc__ and cls.mode


@pytest.mark.parametrize("seed", range(5))
def test_quiet_on_healthy_noise(seed):
    assert replay(series(60, seed)) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_fires_after_the_change(name):
    found = replay(series(30, 3, CASES[name]), detector=name)
    assert found, f"{name} did not fire"
    first = found[0]
    assert 15 <= first.step <= 18, (name, first.step)
    assert first.since >= 15 and first.mode == DETECTORS[name].mode
    assert any(f.severity == "critical" for f in found)
    assert first.evidence and first.message


def test_kl_explosion_ignores_the_healthy_tail_of_the_max_ratio():
    """The largest per-token ratio of a healthy step wanders 2x-9x (faultbench's 60 healthy runs:
    three false alarms from a rule on it) while the mean KL stays put: no finding; a mean KL far
    above its baseline still is one."""
    rng = random.Random(0)

    def tail(row, step):
        row["ratio_max"] = 2.0 + 7.0 * rng.random()  # healthy window: ~2

    rows = series(30, 6, {"t": tail})
    for r in rows[:14]:
        r["ratio_max"] = 2.0 + 0.1 * rng.random()
    assert replay(rows, detector="kl_explosion") == []
    rows = series(30, 6, {"t": tail, **CASES["kl_explosion"]})
    assert replay(rows, detector="kl_explosion")


def test_kl_explosion_flags_a_kl_several_times_too_high_on_every_step_within_five_steps():
    """An LR a few times too high (faultbench lr_spike/subtle s1): the per-update KL 6x its baseline
    on every step, never 8x - the spike rule stays quiet, the sustained rule (mean of 4 steps > 5x)
    flags it, critical within 5 steps, and names the LR. One healthy 7.7x step (the largest of 63
    healthy faultbench runs) is not a finding."""
    def six_x(row, step):
        row["approx_kl"] *= 6.0

    found = replay(series(30, 3, {"k": six_x}), detector="kl_explosion", thresholds={"kl_explosion.sustained": 1e9})
    assert found == []  # the spike rule alone misses it
    found = replay(series(30, 3, {"k": six_x}), detector="kl_explosion")
    crit = [f for f in found if f.severity == "critical"]
    assert crit and crit[0].step <= 15 + 5 and crit[0].evidence["rule"] == "sustained"
    from tether.health.diagnosis import diagnose
    assert diagnose(found)[0].cause == "lr_too_high"

    def one_spike(row, step):
        if step == 20:
            row["approx_kl"] *= 7.7

    assert replay(series(30, 3, {"k": one_spike}), detector="kl_explosion") == []


def test_a_healthy_run_whose_kl_holds_four_and_a_half_times_its_baseline_is_not_an_explosion():
    """Round 9's healthy seed 11 (Intel Xeon): the per-update KL held 4.4x its baseline median over 4
    steps and came back. The sustained bar is 5x: 4.5x on every step from 15 to 21 is quiet, 5.5x is
    flagged by the sustained rule."""
    def bump(x):
        def fn(row, step):
            if 15 <= step <= 21:
                row["approx_kl"] = x * 0.01
            else:
                row["approx_kl"] = 0.01
        return fn

    assert replay(series(30, 3, {"k": bump(4.5)}), detector="kl_explosion") == []
    found = replay(series(30, 3, {"k": bump(5.5)}), detector="kl_explosion")
    assert found and found[0].evidence["rule"] == "sustained" and 18 <= found[0].step <= 21


def test_stall_of_a_small_phase_that_became_ten_times_slower():
    """A reward at 5% of the step taking 30x longer: the step only 2.4x slower (below the 3x
    rule) - still a stalled component. Load that stretches the biggest phase 4x (a 2.5x step),
    or every phase alike, is not."""
    def slow_reward(row, step):
        row["time/reward"] = 0.3
        row["time/step"] += 0.29

    found = replay(series(30, 7, {"r": slow_reward}), detector="stall")
    assert found and 15 <= found[0].step <= 17 and found[0].evidence["phase"] == "time/reward"

    def busy_update(row, step):
        row["time/step"] += 3 * row["time/update"]
        row["time/update"] *= 4

    def busy_machine(row, step):
        for k in ("time/step", "time/generate", "time/reward", "time/batch", "time/update"):
            row[k] *= 2.5

    assert replay(series(30, 7, {"u": busy_update}), detector="stall") == []

    def three_epochs(row, step):  # the update phase 3x longer, nothing else: more epochs per batch
        row["time/step"] += 12 * row["time/update"]
        row["time/update"] *= 13

    found = replay(series(30, 7, {"u": three_epochs}), detector="stall")
    assert found and found[0].evidence["phase"] == "time/update" and found[0].evidence["rule"] == "update"
    assert "rule" not in replay(series(30, 7, {"r": slow_reward}), detector="stall")[0].evidence
    assert replay(series(30, 7, {"m": busy_machine}), detector="stall") == []
    rows = series(30, 7)  # one 1.1 s pause in the reward phase (a loaded machine; faultbench healthy s17)
    rows[15]["time/reward"] += 0.6
    rows[15]["time/step"] += 0.6
    assert replay(rows, detector="stall") == []


def test_waits_for_the_baseline_window():
    rows = series(10, 0, CASES["grad_spike"], start=2)
    assert replay(rows, detector="grad_spike", baseline_window=12) == []


def test_single_spike_is_not_a_finding():
    rows = series(40, 1)
    rows[20]["grad_norm"] = 6.0
    assert replay(rows, detector="grad_spike") == []


def test_threshold_overrides_and_unknown_parameter():
    rows = series(30, 2, {"g": _set("grad_norm", 3.0)})
    assert replay(rows, detector="grad_spike") == []  # 3x is below the default 4x
    assert replay(rows, detector="grad_spike", thresholds={"grad_spike.factor": 2.0})
    with pytest.raises(ValueError, match="no parameter"):
        DETECTORS["grad_spike"]({"nope": 1.0})


def test_missing_and_nonfinite_values_are_ignored():
    rows = series(30, 4)
    for r in rows[10:]:
        r["grad_norm"] = math.nan
        r.pop("entropy")
    assert replay(rows) == []


def test_severity_escalates_with_persistence():
    found = replay(series(30, 5, {"c": _set("clip_frac", 0.12)}), detector="clip_saturation")
    sev = [f.severity for f in found]
    assert sev[0] == "warn" and "critical" in sev


def test_base_class_contract():
    class Always(Detector):
        name, mode, needs_baseline = "always", "x", False

        def evaluate(self, h, ctx):
            return 1, "m", {}

    from tether.health.telemetry import History

    d, h = Always(), History()
    h.add(1, {})
    assert d.check(h, None) is None  # persistence 2 of 3
    h.add(2, {})
    f = d.check(h, None)
    assert f.since == 1 and f.severity == "warn"


def test_everything_truncated_warns_within_3_steps():
    """docs/design.md, correctness rule 8: a config that truncates every response is flagged within 3 steps,
    before any baseline exists."""
    rows = series(5, 0, {"t": _set("truncation_rate", 1.0)}, start=1)
    found = replay(rows, detector="no_signal")
    assert found and found[0].step <= 3 and "truncated" in found[0].message


def test_every_failure_mode_has_a_doc_page():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[3] / "docs" / "health"
    for cls in DETECTORS.values():
        page = docs / f"{cls.mode}.md"
        assert page.is_file(), page
        text = page.read_text()
        for section in ("## Symptoms", "## Detector", "## Likely causes", "## What tether does"):
            assert section in text, (page, section)


def test_environment_error_surge():
    found = replay(series(30, 6, {"e": _set("env/stop/env_error", 0.3)}), detector="error_surge")
    assert found and found[0].step == 15 and "env_error" in found[0].message


def test_a_machine_slowed_by_other_jobs_is_not_a_stall():
    def contended(row, step):
        for k in ("time/step", "time/generate", "time/reward", "time/batch", "time/update"):
            row[k] *= 5

    assert replay(series(30, 7, {"c": contended}), detector="stall") == []


def test_contention_that_hits_the_biggest_phase_hardest_is_not_a_stall():
    def contended(row, step):
        row["time/update"] *= 12
        row["time/generate"] *= 9
        row["time/reward"] *= 8
        row["time/batch"] *= 10
        row["time/step"] = row["time/update"] + row["time/generate"] + row["time/reward"] + row["time/batch"]

    assert replay(series(30, 8, {"c": contended}), detector="stall") == []


def test_slow_entropy_climb_is_flagged_below_the_explosion_level():
    """An entropy bonus slightly too large: entropy creeps up 0.015/step (never 1.6x its median,
    1.12); RL should lower entropy, so staying above the baseline maximum is flagged as a trend."""
    rows = series(40, 0, {"e": _set("entropy", lambda r, s: 0.7 + 0.015 * (s - 14))})
    found = [f for f in replay(rows, "entropy_explosion")]
    assert found and found[0].evidence["rule"] == "trend" and found[0].severity == "warn"
    assert max(r["entropy"] for r in rows) < 1.6 * 0.7 and found[0].step < 36
    flat_high = series(40, 1, {"e": _set("entropy", lambda r, s: r["entropy"] * 0.8)})  # RL sharpening: lower
    assert replay(flat_high, "entropy_explosion") == []


def test_a_sustained_kl_rise_does_not_argue_against_an_entropy_bonus():
    """An entropy bonus flattens every distribution a little on every step: a steady KL rise comes
    with it (faultbench entropy_bonus/obvious s0, s2). Only a KL spike points away from it, to the LR."""
    from tether.health.detectors import Finding
    from tether.health.diagnosis import diagnose

    ent = Finding("entropy_explosion", "entropy_explosion", "critical", 25, 23, "entropy up")
    steady = Finding("kl_explosion", "kl_explosion", "critical", 26, 24, "mean KL up", {"rule": "sustained"})
    spike = Finding("kl_explosion", "kl_explosion", "critical", 26, 24, "KL spike", {"rule": "spike"})
    assert diagnose([ent, steady])[0].cause == "entropy_explosion"
    assert diagnose([ent, spike])[0].cause == "lr_too_high"


def test_a_slow_update_phase_with_a_large_update_is_too_many_epochs_not_a_slow_component():
    """Faultbench epoch_overuse (auto, seeds 3 and 5 at round 9's sitting): more epochs per batch make
    the update phase several times longer (`stall`, mostly in time/update) while the KL per update
    jumps. The update-size cause explains both (fit 1), so auto mode lowers the epochs instead of
    halting on an unexplained anomaly; a slow update phase alone is still a slow component, and a slow
    reward phase does not count for the update size."""
    from tether.health.detectors import Finding
    from tether.health.diagnosis import diagnose

    kl = Finding("kl_explosion", "kl_explosion", "critical", 13, 13, "KL spike", {"rule": "spike"})
    slow_update = Finding("stall", "stall", "critical", 13, 13, "slow update", {"phase": "time/update", "rule": "update"})
    slow_reward = Finding("stall", "stall", "critical", 13, 13, "slow reward", {"phase": "time/reward"})
    top = diagnose([kl, slow_update])[0]
    assert top.cause == "lr_too_high" and top.fit == 1.0 and "lower_epochs" in top.actions
    top = diagnose([kl, slow_reward])[0]
    assert top.cause == "unexplained" or top.fit < 1.0
    assert diagnose([slow_update])[0].cause == "slow_component"


def test_a_paid_loophole_with_rising_entropy_is_the_loophole():
    """Faultbench reward_hack_bonus/subtle s2 (round 9's sitting): a bonus for long answers pays
    incorrect samples and spreads the policy over filler, so entropy rises with it. The paid loophole
    explains both; an entropy blow-up without paid wrong answers stays an entropy problem."""
    from tether.health.detectors import Finding
    from tether.health.diagnosis import diagnose

    ent = Finding("entropy_explosion", "entropy_explosion", "critical", 24, 24, "entropy up")
    hack = Finding("reward_hacking", "reward_hacking", "critical", 24, 24, "incorrect samples paid")
    top = diagnose([ent, hack])[0]
    assert top.cause == "exploitable_reward" and top.fit == 1.0
    assert diagnose([ent])[0].cause == "entropy_explosion"


def test_an_entropy_bonus_explains_cut_answers_and_an_update_against_the_surrogate():
    """Faultbench entropy_bonus/obvious s4 (round 9's sitting): entropy up, then noise-like answers cut
    at the limit and updates that lower the advantage-weighted log-probs (the entropy term in the loss
    pulls the other way). The entropy blow-up explains all three; without the entropy finding, an
    update against the surrogate still names no cause."""
    from tether.health.detectors import Finding
    from tether.health.diagnosis import UNEXPLAINED, diagnose

    ent = Finding("entropy_explosion", "entropy_explosion", "critical", 17, 16, "entropy up")
    cut = Finding("truncation", "truncation", "critical", 17, 17, "truncation up")
    against = Finding("progress", "no_progress", "critical", 17, 17, "update against", {"rule": "against"})
    top = diagnose([ent, cut, against])[0]
    assert top.cause == "entropy_explosion" and top.fit == 1.0
    assert diagnose([against])[0].cause == UNEXPLAINED


def test_a_fifth_of_the_correct_samples_unpaid_by_a_verifier():
    """A verifier pays every correct sample exactly 1 (no spread): a fifth of them going unpaid is a
    finding (a relative floor of 5% x 1 on the spread would have hidden it), and full pay stays quiet."""
    pay = lambda v: {"c": _set("health/reward_correct_mean", lambda r, s: 1.0 if s < 15 else v)}  # noqa: E731
    found = replay(series(30, 3, pay(0.8)), detector="reward_noise")
    assert found and 15 <= found[0].step <= 17 and found[0].evidence["rule"] == "correct_unpaid"
    assert replay(series(30, 3, pay(1.0)), detector="reward_noise") == []


def test_correct_samples_underpaid_by_another_term_of_the_reward():
    """`component`: correct samples paid 0.75 from step 15 while the correctness term still ranks every correct
    sample first (agreement 1.0) - the pay is taken by another term (a length penalty, agreement 0.5); the same
    drop with the correctness term itself disagreeing (0.8), or with no other term, stays `correct_unpaid`."""
    from tether.health.diagnosis import diagnose

    def run(exact, penalty):
        mods = {"c": _set("health/reward_correct_mean", lambda r, s: 1.0 if s < 15 else 0.75),
                "e": _set("health/reward_agreement/exact_match", lambda r, s: 1.0 if s < 15 else exact)}
        if penalty is not None:
            mods["p"] = _set("health/reward_agreement/overlong_penalty", lambda r, s: 1.0 if s < 15 else penalty)
        return replay(series(30, 3, mods), detector="reward_noise")  # the run's correctness term: exact_match

    found = run(1.0, 0.5)
    assert found and 15 <= found[0].step <= 17 and found[0].evidence["rule"] == "component"
    assert found[0].evidence["terms"] == {"overlong_penalty": 0.5} and "'overlong_penalty'" in found[0].message
    assert diagnose(found)[0].cause == "misaligned_reward"
    for exact, penalty in ((0.8, 0.5), (1.0, None), (1.0, 0.95)):
        other = run(exact, penalty)
        assert other and other[0].evidence["rule"] == "correct_unpaid", (exact, penalty)
        assert diagnose(other)[0].cause == "noisy_reward"


def test_identical_responses_paid_differently_is_noise_against_a_baseline():
    """`inconsistent`: a deterministic reward splits no cluster of identical responses; a verifier that
    starts timing out at step 15 splits a third of them (critical); a reward with a random term that split
    a fifth of them from step 1 (its baseline) is not a new fault."""
    split = lambda before, after: {"s": _set("health/reward_split_clusters",  # noqa: E731
                                             lambda r, s: before if s < 15 else after)}
    found = replay(series(30, 3, split(0.0, 0.3), start=1), detector="reward_noise")
    assert found and 15 <= found[0].step <= 16 and found[0].evidence["rule"] == "inconsistent"
    assert any(f.severity == "critical" for f in found)
    from tether.health.diagnosis import diagnose
    assert diagnose(found)[0].cause == "noisy_reward"
    assert replay(series(30, 3, split(0.2, 0.2), start=1), detector="reward_noise") == []
    assert replay(series(30, 3, split(0.0, 0.0), start=1), detector="reward_noise") == []
