"""Auto mode: rollback + one safe change, kept or reverted after a trial window; halts with a
report when the cause needs a code fix or the repairs run out. Never crashes training."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from tether.config import TetherConfig
from tether.health.monitor import HealthMonitor, NullMonitor, build_context, build_health
from tether.health.remediation import ACTIONS, do_rollback, take_snapshot
from tether.optim import build_optimizer, build_scheduler
from tether.policy.hf import HFPolicy
from tether.settings import RunSettings
from tether.train.step import UpdateState
from health_helpers import healthy_row


def _state(cfg: TetherConfig | None = None):
    model = torch.nn.Linear(3, 3)
    opt = build_optimizer(model.parameters(), 1e-3)
    return SimpleNamespace(step=0, policy=HFPolicy(model, None, (0,), 0), optimizer=opt,
                           scheduler=build_scheduler(opt, 100), update=UpdateState(), critic=None, ref=None,
                           settings=RunSettings(cfg or TetherConfig()))


def _cfg(**health):
    cfg = TetherConfig()
    return cfg.model_copy(update={"health": cfg.health.model_copy(update={
        "mode": "auto", "snapshot_every": 2, "trial_window": 4, "watchdog_timeout_s": None, **health})})


class _Live:
    """The config in force, `st.settings.config`, read afresh at every access: what the RL loop
    passes the monitor each step (a repair is a run-settings change, tether.settings)."""

    def __init__(self, st) -> None:
        self._st = st

    def __getattr__(self, name):
        return getattr(self._st.settings.config, name)


def _live(cfg: TetherConfig | None = None):
    st = _state(cfg)
    return st, _Live(st)


def _fault(st, path, value):
    st.settings.set(path, value, source="test fault", step=st.step)


def _drive(mon, st, cfg, steps, edit, direct=False, seed=0):
    """Feed the monitor synthetic rows; `edit(row, step)` injects the fault. `direct` skips
    observe() (which recomputes health/* from trajectories) to feed health/* rows as given.
    Returns the step auto mode halted at, or None."""
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        st.step = step
        with torch.no_grad():
            st.policy.model.weight.add_(1.0)  # "training" moves the weights
        row = healthy_row(step, rng)
        edit(row, step)
        if direct:
            halted = mon._remediate(st, cfg, step, mon.run_detectors(step, row, build_context(cfg)))
        else:
            halted = mon.observe(st, cfg, row, [])
        if halted:
            return step
    return None


def _run(mon, st, cfg, steps, sick):
    """`sick(st, step)`: whether the fault shows (as an oversized update: a grad-norm spike and a per-update
    KL far above its baseline) at this step."""
    def edit(row, step):
        if sick(st, step):
            row["grad_norm"], row["approx_kl"] = 12.0, 0.3
    return _drive(mon, st, cfg, steps, edit)


def test_lower_lr_repairs_an_lr_fault_and_is_kept():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)
    sick = lambda st, step: step >= 15 and st.optimizer.param_groups[0]["lr"] * 25 > 1e-2  # noqa: E731
    assert _run(mon, st, cfg, 40, sick) is None
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events == [("apply", "lower_lr"), ("keep", "lower_lr")]
    assert mon.actions[0]["rollback_to"] < 15
    lr = st.optimizer.param_groups[0]["lr"]  # 0.3x or less: the KL's 35x over its baseline asks for more
    assert lr <= 3e-4 + 1e-12 and st.scheduler.base_lrs[0] == pytest.approx(lr)


def test_failed_repairs_are_reverted_then_the_run_halts_while_damage_persists():
    st, cfg = _live(_cfg(max_actions=3))
    mon = HealthMonitor(cfg)
    halted = _run(mon, st, cfg, 60, lambda st, step: step >= 15)  # nothing fixes it: grad spikes keep coming
    assert halted == 29 and "no applicable repair left" in mon.halted
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events == [("apply", "lower_lr"), ("revert", "lower_lr"), ("apply", "lower_lr_x10"), ("revert", "lower_lr_x10"),
                      ("apply", "raise_kl"), ("revert", "raise_kl")]
    # every change was undone
    assert st.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert cfg.algo.kl.coef == 0.0 and st.ref is None and st.update.kl_coef == 0.0
    assert cfg.algo.policy_loss.clip_low == 0.2


def test_failed_repairs_without_damage_advise_until_accuracy_regresses():
    st, cfg = _live(_cfg(max_actions=2))
    mon = HealthMonitor(cfg)

    def edit(row, step):
        if step >= 15:
            row["logp_gap_mean"] = 0.2  # a rollout/trainer mismatch: weights intact, no damage signal
        if cfg.algo.correction.mode == "mask":
            row["is_mask_frac"] = 0.7  # the one repair is unsafe and reverted
        if step >= 35:
            row["accuracy"] = row["reward/mean"] = 0.05

    step = _drive(mon, st, cfg, 60, edit)
    assert [(a["event"], a["action"]) for a in mon.actions] == [("apply", "enable_is_correction"),
                                                                ("revert", "enable_is_correction")]
    assert 35 < step < 40 and mon.halted and "regressed" in mon.halted


def test_code_bug_halts_once_it_costs_accuracy_at_the_last_healthy_weights():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        if step >= 15:
            row["health/group_mixed_frac"] = 0.5
        if step >= 22:
            row["accuracy"] = row["reward/mean"] = 0.05

    step = _drive(mon, st, cfg, 40, edit, direct=True, seed=1)
    assert 22 < step < 27 and "grouped with the wrong prompt" in mon.halted
    assert mon.actions == []
    snap = max((s for s in mon.snapshots if s.step < 14), key=lambda s: s.step)  # before the onset, 1 step margin
    assert torch.equal(st.policy.model.weight.detach(), snap.model["weight"])  # the last healthy weights


def test_rollback_restores_weights_and_moments_but_keeps_hyperparameters():
    st = _state()
    st.update.moments = "what the snapshot's moments were left as"  # the sketch `update/moments_changed` compares with
    snap = take_snapshot(st, 3)
    w = st.policy.model.weight.detach().clone()
    st.policy.model.weight.sum().backward()
    st.optimizer.step()
    st.optimizer.param_groups[0]["lr"] = 5e-5
    st.update.moments = "after the step"
    do_rollback(st, snap)
    assert torch.equal(st.policy.model.weight, w)
    assert st.optimizer.state_dict()["state"] == {}
    assert st.optimizer.param_groups[0]["lr"] == 5e-5
    assert st.update.moments == "what the snapshot's moments were left as"  # restored with the moments


@pytest.mark.parametrize("name", ["lower_lr", "raise_kl", "tighten_clip", "enable_is_correction", "raise_temperature",
                                  "raise_max_tokens", "downweight_component", "restore_clip", "lower_epochs"])
def test_every_action_undoes_itself(name):
    base = TetherConfig.model_validate({"reward": {"components": [{"name": "exact_match"}, {"name": "format", "weight": 1.0}]},
                                         "rollout": {"sampling": {"temperature": 0.5}},
                                         "algo": {"policy_loss": {"clip_low": 1000.0, "clip_high": 1000.0}, "epochs": 6}})
    st, cfg = _live(base)  # clipping off
    before, lr = cfg.model_dump(), st.optimizer.param_groups[0]["lr"]
    changes = ACTIONS[name].apply(st, cfg, {})
    assert changes, name
    assert cfg.model_dump() != before or st.optimizer.param_groups[0]["lr"] != lr
    for c in reversed(changes):
        c.undo()
    assert cfg.model_dump() == before and st.optimizer.param_groups[0]["lr"] == lr and st.ref is None


def test_a_broken_detector_is_disabled_and_training_goes_on():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def boom(h, ctx):
        raise RuntimeError("bug in a detector")

    mon.detectors["grad_spike"].check = boom
    assert _run(mon, st, cfg, 5, lambda st, step: False) is None
    assert "grad_spike" in mon.disabled and "grad_spike" not in mon.detectors


def test_a_failing_monitor_never_raises():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)
    metrics = {}
    assert mon.observe(st, cfg, metrics, None) is False  # groups=None breaks telemetry: logged, skipped
    assert "time/health" in metrics


def test_mode_off_is_a_null_monitor():
    cfg = TetherConfig.model_validate({"health": {"mode": "off"}})
    mon = build_health(cfg)
    assert isinstance(mon, NullMonitor) and mon.observe(None, cfg, {}, []) is False
    assert TetherConfig.model_validate({"health": {"mode": False}}).health.mode == "off"  # YAML `off`


def test_undamaged_weights_are_kept_and_an_unsafe_correction_is_reverted():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        if step >= 15:
            row["logp_gap_mean"] = 0.2  # rollout/trainer mismatch: the weights are fine
        if cfg.algo.correction.mode == "mask":
            row["is_mask_frac"] = 0.7

    _drive(mon, st, cfg, 29, edit, seed=3)
    events = [(a["event"], a["action"], a["rollback_to"]) for a in mon.actions]
    assert events[0][:2] == ("apply", "enable_is_correction") and events[0][2] is None  # no rollback
    assert events[1][:2] == ("revert", "enable_is_correction") and "masked 70%" in mon.actions[1]["reason"]
    assert cfg.algo.correction.mode == "truncate"


def test_lr_repair_scales_with_how_far_the_update_size_is_out_of_range():
    st = _state()
    lr = st.optimizer.param_groups[0]["lr"]
    ACTIONS["lower_lr"].apply(st, st.settings.config, {"update_ratio": 400.0})  # KL 400x: LR ~20x too high
    assert st.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 20)
    st = _state()
    ACTIONS["lower_lr"].apply(st, st.settings.config, {"update_ratio": 2.0})  # barely out of range: the 0.3x step
    assert st.optimizer.param_groups[0]["lr"] == pytest.approx(lr * 0.3)


def test_clip_and_epoch_repairs_apply_only_when_out_of_range():
    st, cfg = _live()
    assert ACTIONS["restore_clip"].apply(st, cfg, {}) == [] and ACTIONS["lower_epochs"].apply(st, cfg, {}) == []
    _fault(st, "algo.epochs", 8)
    assert [c.new for c in ACTIONS["lower_epochs"].apply(st, cfg, {})] == [1]


def _feed(mon, st, cfg, rows, steps, edit):
    for step in steps:
        st.step = step
        with torch.no_grad():
            st.policy.model.weight.add_(1.0)
        row = dict(rows[step - 1])
        edit(row, step, cfg)
        mon.observe(st, cfg, row, [])


def _mismatch(row, step, cfg):
    if step >= 15:
        row["logp_gap_mean"] = 0.2  # rollout/trainer mismatch: repaired by a config change (IS correction)
    if cfg.algo.correction.mode == "mask":
        row["is_mask_frac"] = 0.7  # ... which masks too much and is reverted


def test_a_repair_on_trial_stays_in_force_and_undoable_across_a_resume():
    """Issue 14: a repair's config change is a run-settings change (tether.settings) that the
    checkpoint carries; a resume restores it with the monitor, and its undo still works."""
    import io

    rng = random.Random(3)
    rows = [healthy_row(s, rng) for s in range(1, 30)]
    st_a, cfg_a = _live(_cfg())
    whole = HealthMonitor(cfg_a)
    _feed(whole, st_a, cfg_a, rows, range(1, 30), _mismatch)
    applied = whole.actions[0]["step"]
    assert [a["event"] for a in whole.actions][:2] == ["apply", "revert"] and cfg_a.algo.correction.mode == "truncate"

    st_b, cfg_b = _live(_cfg())
    first = HealthMonitor(cfg_b)
    _feed(first, st_b, cfg_b, rows, range(1, applied + 2), _mismatch)  # killed one step into the trial
    assert first.trial is not None and cfg_b.algo.correction.mode == "mask"
    buf = io.BytesIO()
    torch.save({"health": first.state_dict(), "settings": st_b.settings.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # what RLState.load_extra_state reads back
    st_b.settings = RunSettings(_cfg())  # the resumed run's config, from config.yaml: no repair in it
    st_b.settings.load_state_dict(saved["settings"])
    cfg_c = _Live(st_b)
    assert cfg_c.algo.correction.mode == "mask" and cfg_c.algo.correction.level == "sequence"
    resumed = build_health(cfg_c, st=st_b, state=saved["health"])
    assert st_b.settings.drain() == []  # in force already: nothing is changed (or logged) again
    _feed(resumed, st_b, cfg_c, rows, range(applied + 2, 30), _mismatch)
    assert resumed.actions == whole.actions
    assert cfg_c.algo.correction.model_dump() == cfg_a.algo.correction.model_dump()  # the revert's undo ran


def test_a_kept_kl_anchor_is_rebuilt_from_the_checkpoint_on_resume():
    from tether.health.remediation import restore_in_force

    st, cfg = _live(_cfg())
    changes = ACTIONS["raise_kl"].apply(st, cfg, {})
    records = [{"event": "apply", "action": "raise_kl", "changes": [c.to_json() for c in changes]},
               {"event": "keep", "action": "raise_kl", "changes": [c.to_json() for c in changes]}]
    st2, cfg2 = _live(_cfg())  # a checkpoint without run settings: restore_in_force puts the repair in force again
    saved = {k: v + 1.0 for k, v in st.ref.model.state_dict().items()}
    st2.pending_ref = saved  # RLState.load_extra_state keeps the checkpoint's reference weights here
    rebuilt = restore_in_force(st2, cfg2, records)
    assert len(rebuilt) == 1 and cfg2.algo.kl.coef == cfg.algo.kl.coef == 0.05 and st2.update.kl_coef == 0.05
    assert st2.ref is not None and all(torch.equal(st2.ref.model.state_dict()[k], v) for k, v in saved.items())
    for c in reversed(rebuilt[0]):
        c.undo()
    assert st2.ref is None and cfg2.algo.kl.coef == 0.0 and st2.update.kl_coef == 0.0
    reverted = records[:1] + [{"event": "revert", "action": "raise_kl", "changes": records[0]["changes"]}]
    st3, cfg3 = _live(_cfg())
    assert restore_in_force(st3, cfg3, reverted) == [] and cfg3.algo.kl.coef == 0.0 and st3.ref is None


def _clip_off_and_lr_x4(st, cfg, row, step, lr_factor=4):
    """From step 15: clipping switched off and the LR 4x too high; the per-update KL scales with
    the LR squared, and 10x more without clipping."""
    if step == 15:
        _fault(st, "algo.policy_loss.clip_low", 1000.0)
        _fault(st, "algo.policy_loss.clip_high", 1000.0)
        st.optimizer.param_groups[0]["lr"] *= lr_factor
    lr_x = st.optimizer.param_groups[0]["lr"] / 1e-3
    row["approx_kl"] *= lr_x ** 2 * (10 if cfg.algo.policy_loss.clip_low >= 0.9 else 1)


def test_a_repair_that_halves_the_update_size_stays_and_the_next_goes_on_top():
    """Clipping switched off AND the LR 4x too high (a copied config): restoring clipping brings the
    per-update KL from 160x to 16x healthy - not enough to silence kl_explosion, but part of the
    repair, so it stays and an LR cut sized by what is left (the trial window's median KL over the
    pre-fault median) is tried on top."""
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        _clip_off_and_lr_x4(st, cfg, row, step)

    assert _drive(mon, st, cfg, 40, edit) is None
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events == [("apply", "restore_clip"), ("keep", "restore_clip"), ("apply", "lower_lr_residual"),
                      ("keep", "lower_lr_residual")], events
    assert "down from" in mon.actions[1]["partial"] and mon.actions[2]["rollback_to"] is None  # on top, no rollback
    assert cfg.algo.policy_loss.clip_low == 0.2  # clipping back on, and the LR back near its configured 1e-3
    assert st.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3, rel=0.3)  # (sized by the noisy max KL)


def test_a_partial_repair_that_lost_accuracy_stays_and_the_next_starts_from_the_healthy_weights():
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        _clip_off_and_lr_x4(st, cfg, row, step)
        if row["approx_kl"] > 0.05:  # the excess update size costs accuracy
            row["accuracy"] = row["reward/mean"] = 0.15

    _drive(mon, st, cfg, 40, edit)
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events[:3] == [("apply", "restore_clip"), ("keep", "restore_clip"), ("apply", "lower_lr_residual")], events
    assert mon.actions[1]["partial"] and mon.actions[2]["rollback_to"] is not None and mon.actions[2]["rollback_to"] < 15
    assert cfg.algo.policy_loss.clip_low == 0.2


def test_the_absolute_update_size_check_counts_as_harm_in_a_trial():
    """The LR 8x too high with clipping off; restoring clipping leaves ~0.6 nats per update (64x
    healthy, down from 640x), which costs accuracy. Here only the absolute check (`update_size`:
    > 0.5 nats) sees it - the relative KL rule is off, as when its baseline was already high (a
    multi-epoch config; faultbench clip_disabled seed 1). Restoring clipping is part of the repair
    (kept, partial), not reverted for the accuracy the remaining excess costs."""
    st, cfg = _live(_cfg(disable=["kl_explosion"]))
    mon = HealthMonitor(cfg)

    def edit(row, step):
        _clip_off_and_lr_x4(st, cfg, row, step, lr_factor=8)
        if row["approx_kl"] > 0.05:
            row["accuracy"] = row["reward/mean"] = 0.15

    _drive(mon, st, cfg, 40, edit)
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events[:3] == [("apply", "restore_clip"), ("keep", "restore_clip"), ("apply", "lower_lr_residual")], events
    assert mon.actions[1]["partial"] and mon.actions[2]["rollback_to"] is not None
    assert cfg.algo.policy_loss.clip_low == 0.2


def test_a_kept_lr_repair_that_leaves_the_update_size_out_of_band_is_followed_by_a_sized_cut():
    """The LR 25x too high from step 15, and the per-update KL saturating at 100x healthy (it grows
    with the square of the step only for small steps): the first cut, sized by the saturated
    evidence (1/sqrt(100)), leaves the LR 2.5x too high - 6x the healthy KL, which the 8x spike
    rule does not flag, so the trial keeps it. The trial window's median KL is still out of the
    healthy band (2x), so the LR is cut again by 1/sqrt(6.25) and the update size is back."""
    st, cfg = _live(_cfg(trial_window=5))
    mon = HealthMonitor(cfg)

    def edit(row, step):
        if step >= 15:
            lr_x = st.optimizer.param_groups[0]["lr"] * 25 / 1e-3
            row["approx_kl"] = min(0.01 * lr_x ** 2, 1.0) * row["approx_kl"] / 0.01

    assert _drive(mon, st, cfg, 40, edit) is None
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events == [("apply", "lower_lr"), ("keep", "lower_lr"), ("apply", "lower_lr_residual"),
                      ("keep", "lower_lr_residual")], events
    assert mon.actions[1]["partial"] and mon.actions[2]["rollback_to"] is None  # on top of the first cut
    assert "partial" not in mon.actions[3]  # back in the band: done
    assert st.optimizer.param_groups[0]["lr"] * 25 == pytest.approx(1e-3, rel=0.35)


def test_a_kept_repair_back_in_the_healthy_band_is_not_cut_again():
    from tether.health.remediation import residual
    from tether.health.telemetry import History

    h = History(4, 8, 50)
    for s, kl in enumerate([0.01] * 12 + [0.5, 0.015, 0.018, 0.012, 0.02, 0.016, 0.014], 1):
        h.add(s, {"approx_kl": kl})
    trial = {"start": 13, "evidence": {"kl_base": 0.01}}
    assert residual(h, trial) is None  # steps 15-19 (the first trial step is left out): median 0.016, 1.6x
    assert residual(h, {"start": 13, "evidence": {"kl_base": 0.005}}) == pytest.approx(3.2)
    assert residual(h, {"start": 13, "evidence": {}}) is None  # no pre-fault baseline: nothing to compare


def test_an_unexplained_anomaly_is_held_not_repaired_and_halts_once_it_costs_accuracy():
    """The parameters' norm drifts one way, fast (a negative weight decay): no cause in the taxonomy
    has it as a hallmark, so the answer is an unexplained anomaly and auto mode tries no repair on a
    guess - it keeps training while accuracy holds (the drift is no damage signal) and halts at the
    last healthy weights once accuracy regresses."""
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        row["health/param_norm"] = 30.0 * (1.0002 ** min(step, 14)) * (1.01 ** max(0, step - 14))
        if step >= 26:
            row["accuracy"] = row["reward/mean"] = 0.05

    step = _drive(mon, st, cfg, 40, edit, direct=True)
    assert mon.decisions and mon.decisions[0]["cause"] == "unexplained" and mon.decisions[0]["step"] < 26
    assert mon.actions == []  # no repair tried
    assert step is not None and 26 < step < 31 and "regressed" in mon.halted
    snap = max((s for s in mon.snapshots if s.step < 14), key=lambda s: s.step)
    assert torch.equal(st.policy.model.weight.detach(), snap.model["weight"])


def _state_write_run(recurs: bool, harm: bool = True):
    """Adam's second moments are written once at step 15 (x0.01, every tensor alike), or at every step from
    15 on (`recurs`); while the written state is in force every update is oversized (grad-norm spike, KL
    30x its baseline). A rollback restores the state the snapshot's moments were left in."""
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def edit(row, step):
        if step == 15 or (recurs and step > 15):
            st.update.moments = "written"
            row.update({"update/moments_changed": 1.0, "update/moments_scale": 0.01, "update/moments_spread": 1.0})
        if st.update.moments == "written" and harm:
            row["grad_norm"], row["approx_kl"] = 12.0, 0.3
    return st, mon, _drive(mon, st, cfg, 40, edit, direct=True)


def test_a_one_shot_write_of_the_optimizer_state_is_repaired_by_the_rollback_alone():
    st, mon, halted = _state_write_run(recurs=False)
    assert halted is None
    events = [(a["event"], a["action"]) for a in mon.actions]
    assert events == [("apply", "restore_optimizer_state"), ("keep", "restore_optimizer_state")]
    assert mon.actions[0]["rollback_to"] < 15 and st.update.moments != "written"
    assert st.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # no LR cut left in force


def test_a_recurring_write_of_the_optimizer_state_is_not_repaired_by_a_rollback_alone():
    st, mon, _ = _state_write_run(recurs=True)
    events = [(a["event"], a["action"]) for a in mon.actions]
    # tried at once at the first write, reverted when the write comes back; then the cause's LR repairs
    assert events[:2] == [("apply", "restore_optimizer_state"), ("revert", "restore_optimizer_state")]
    assert mon.actions[0]["step"] == 15 and events[2] == ("apply", "lower_lr")


def test_a_one_shot_write_is_restored_at_once_even_before_damage_shows():
    """A write that does no visible damage never holds a diagnosis two steps (nothing else fires): the exact
    finding with its exact undo is acted on at the step it fired."""
    st, mon, halted = _state_write_run(recurs=False, harm=False)
    assert halted is None and [(a["event"], a["action"], a["step"]) for a in mon.actions] == [
        ("apply", "restore_optimizer_state", 15), ("keep", "restore_optimizer_state", 19)]
    assert mon.actions[0]["rollback_to"] < 15 and st.update.moments != "written"


def test_the_restore_action_applies_only_to_a_single_write():
    st, cfg = _live(_cfg())
    assert ACTIONS["restore_optimizer_state"].apply(st, cfg, {}) == []
    (ch,) = ACTIONS["restore_optimizer_state"].apply(st, cfg, {"state_write": 15})
    assert ch.path == "optimizer.state" and "step 15" in ch.old


def _epochs_and_lr_x3(st, cfg, row, step, since_keep):
    """From step 15: 8 epochs a batch and the LR 3x too high (a PPO config copied whole). The extra
    epochs inflate the per-update KL 30x; at one epoch the KL is back in its band, but the LR still
    costs accuracy a few steps after the keep (`since_keep()`), once the KL findings have left the
    diagnosis's window: problems the run could solve go all wrong - a decline that names no mechanism
    (regression, `data_shift:unsolvable`), which alone reads as wrong labels."""
    if step == 15:
        _fault(st, "algo.epochs", 8)
        st.optimizer.param_groups[0]["lr"] *= 3
    if cfg.algo.epochs > 1:
        row["approx_kl"] *= 30
    keep = since_keep()
    if keep is not None and step > keep + 6 and st.optimizer.param_groups[0]["lr"] > 1.5e-3:
        row["accuracy"] = row["reward/mean"] = row["reward/exact_match/mean"] = 0.12
        row["health/all_wrong_groups"] = 0.8


def test_a_kept_repair_of_the_update_size_that_does_not_last_goes_on_with_an_lr_cut_instead_of_a_halt():
    """One epoch a batch is kept (the KL is back in its band), then accuracy falls again with no
    mechanism of its own in the evidence: the update is still too large, so the LR is cut (the
    cause's next candidate) instead of halting on the wrong labels the decline alone suggests."""
    st, cfg = _live(_cfg())
    mon = HealthMonitor(cfg)

    def kept():
        return next((a["step"] for a in mon.actions if a["event"] == "keep"), None)

    halted = _drive(mon, st, cfg, 50, lambda row, step: _epochs_and_lr_x3(st, cfg, row, step, kept), direct=True)
    events = [(a["event"], a["action"], a["cause"]) for a in mon.actions]
    assert halted is None, (mon.halted, events, mon.decisions)
    assert events[:3] == [("apply", "lower_epochs", "lr_too_high"), ("keep", "lower_epochs", "lr_too_high"),
                          ("apply", "lower_lr", "lr_too_high")], events
    assert st.optimizer.param_groups[0]["lr"] < 1.5e-3 and cfg.algo.epochs == 1


def test_only_a_decline_with_no_mechanism_of_its_own_reopens_a_kept_size_repair():
    from tether.health.detectors import Finding
    from tether.health.diagnosis import Hypothesis
    from tether.health.remediation import size_repair_unfinished

    kept = [{"event": "apply", "action": "lower_epochs", "cause": "lr_too_high", "step": 17},
            {"event": "keep", "action": "lower_epochs", "cause": "lr_too_high", "step": 21}]
    wrong_labels = Hypothesis("data_corruption", "data", "t", 5.0, 0.8, 22)

    def f(det, step, rule=None):
        return Finding(det, det, "critical", step, step - 2, "m", {"rule": rule} if rule else {})

    decline = [f("regression", 24), f("data_shift", 25, "unsolvable")]
    h = size_repair_unfinished(kept, decline, wrong_labels)
    assert h is not None and h.cause == "lr_too_high" and "lower_lr" in h.actions and "did not last" in h.advice
    assert size_repair_unfinished(kept[:1], decline, wrong_labels) is None  # on trial, not kept
    assert size_repair_unfinished(kept, decline + [f("data_shift", 25, "prompt")], wrong_labels) is None  # prompts moved
    assert size_repair_unfinished(kept, decline + [f("reward_hacking", 25)], wrong_labels) is None
    assert size_repair_unfinished(kept, [f("no_signal", 25)], wrong_labels) is None  # no loss of accuracy
    assert size_repair_unfinished(kept, [f("regression", 20)], wrong_labels) is None  # before the keep
    same = Hypothesis("lr_too_high", "optimisation", "t", 5.0, 0.8, 22)
    assert size_repair_unfinished(kept, decline, same) is None  # its own cause: the usual flow
    other = [{"event": "keep", "action": "raise_temperature", "cause": "entropy_collapse", "step": 21}]
    assert size_repair_unfinished(other, decline, wrong_labels) is None  # not a repair of the update size
