"""Remediation: roll back to the last healthy snapshot and apply one safe change, transactionally.

The catalogue holds small, revertible changes; each names the detectors that must be quiet for
the change to count as a repair (`watch`). The controller (monitor.py, `health.mode=auto`):

1. a critical finding -> diagnosis -> the top cause's candidate actions;
2. when the findings show damage to the policy (regression, entropy, KL, grad-norm, length,
   reward-hacking signals), roll the weights and optimizer moments back to the newest snapshot
   taken before the fault's first evidence; otherwise keep the weights (a snapshot of them is the
   trial's undo point). Apply the first applicable candidate;
3. watch `health.trial_window` steps: the change is KEPT if none of its `watch` detectors fired
   critically, its guard raises nothing (e.g. a correction masking most tokens) and the window's
   verified accuracy is not below the pre-fault window's; otherwise REVERTED (roll back again,
   undo the change) and the next candidate is tried - except a change that took the update-size
   evidence at least halfway back (`helped`): it is part of the repair (clipping restored while
   the LR is still too high), stays, and the next candidate is tried on top of it - from the
   current weights, or from the pre-fault snapshot when accuracy fell during the trial (the excess
   that is left did damage);
   A kept repair of the update size that did not last (accuracy fell again after the keep with
   only signs of decline that name no mechanism: `size_repair_unfinished`) goes on with the next
   candidate of its cause rather than a new diagnosis the decline alone suggests;
4. with no candidate left (`health.max_actions` tries, or a cause no setting can fix: a code or
   data bug), the run halts with a report at the last healthy weights once the fault costs
   accuracy (a `regression` finding); until then it keeps training and advises.

A rollback restores weights, optimizer moments and the update counters; it keeps the current
hyper-parameters (the LR, temperature, ... in force), the data position and the RNG stream, and
policy versions keep increasing (weight-sync handshakes stay monotonic). Snapshots are in memory
(`health.snapshot_every` healthy steps, the newest three kept) and only taken in auto mode.
"""

from __future__ import annotations

import copy
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    update: dict[str, Any]
    critic: dict[str, torch.Tensor] | None = None


def take_snapshot(st: Any, step: int) -> Snapshot:
    """Copy what a rollback restores (to CPU, so GPU memory is not doubled)."""
    model = {k: v.detach().to("cpu", copy=True) for k, v in st.policy.model.state_dict().items()}
    opt = copy.deepcopy(st.optimizer.state_dict())
    critic = None
    if getattr(st, "critic", None) is not None:
        critic = {k: v.detach().to("cpu", copy=True) for k, v in st.critic.state_dict().items()}
    return Snapshot(step, model, opt, dict(vars(st.update)), critic)


def snapshot_before(snapshots: list[Snapshot], since: int) -> Snapshot | None:
    """The newest snapshot taken before a fault first showed at `since` (detection lags the onset, so the one
    from the step just before `since` may already hold damage); None when there is none."""
    return next((s for s in reversed(snapshots) if s.step < since - 1), None)


def do_rollback(st: Any, snap: Snapshot) -> None:
    """Restore weights, optimizer moments and counters from `snap`; keep current hyper-parameters."""
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in st.optimizer.param_groups]
    st.policy.model.load_state_dict(snap.model)
    st.optimizer.load_state_dict(copy.deepcopy(snap.optimizer))
    for g, h in zip(st.optimizer.param_groups, hyper):
        g.update(h)
    st.update.bad_steps_in_a_row = 0
    st.update.moments = snap.update.get("moments")  # the state the restored moments were left in
    if snap.critic is not None and getattr(st, "critic", None) is not None:
        st.critic.load_state_dict(snap.critic)


# ----------------------------------------------------------------------------- changes


@dataclass
class Change:
    """One reversible setting change; `undo` restores what `apply` replaced."""

    path: str
    old: Any
    new: Any
    undo: Callable[[], None] = field(repr=False, default=lambda: None)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "old": self.old, "new": self.new}


def _set_cfg(st: Any, path: str, value: Any) -> Change:
    """Put `value` in force at a config path from the next step on: a run-settings change
    (`st.settings`, tether.settings: checkpointed, logged to settings.jsonl); undo puts back the old value."""
    old = st.settings.set(path, value, source="health", step=st.step)
    return Change(path, old, value, lambda: st.settings.set(path, old, source="health: revert", step=st.step))


def _set_lr(st: Any, factor: float) -> Change:
    """Scale the policy's learning rate (param group 0 and the scheduler's base LR)."""
    old_lr = st.optimizer.param_groups[0]["lr"]
    sched = getattr(st, "scheduler", None)
    old_base = list(getattr(sched, "base_lrs", []) or [])
    st.optimizer.param_groups[0]["lr"] = old_lr * factor
    if sched is not None and old_base:
        sched.base_lrs[0] = old_base[0] * factor

    def undo() -> None:  # param_groups are new dicts after a rollback (load_state_dict): look them up
        st.optimizer.param_groups[0]["lr"] = old_lr
        if sched is not None and old_base:
            sched.base_lrs[0] = old_base[0]

    return Change("train.lr", old_lr, old_lr * factor, undo)


# ----------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    watch: tuple[str, ...]  # detectors that must stay quiet for the change to be kept
    apply: Callable[[Any, Any, dict], list[Change]]  # (st, cfg, evidence) -> changes; [] = not applicable
    guard: Callable[[list[dict]], str | None] = lambda rows: None  # trial rows -> why the change is unsafe
    restores: bool = False  # the change IS the rollback: applied only from a snapshot before the onset


def _lower_lr(factor: float, scaled: bool = False, key: str = "update_ratio"):
    """A fixed factor, or (`scaled`) one sized by the evidence: the per-update KL grows with the
    square of the step size, so an update `ev[key]` x its healthy KL needs the LR scaled by
    1/sqrt(ev[key]) (at most `factor`, at least 0.02x). With `factor` 1 (no fixed cut) and no
    evidence above 1 the action does not apply."""
    def apply(st, cfg, ev):
        f = factor
        ratio = ev.get(key)
        if scaled and isinstance(ratio, (int, float)) and ratio > 1:
            f = min(factor, max(0.02, 1.0 / ratio ** 0.5))
        return [_set_lr(st, f)] if f < 1 else []
    return apply


def _restore_clip(st, cfg, ev):
    """PPO clipping back to its defaults when it was switched off (a range of 1 or more)."""
    pl = cfg.algo.policy_loss
    if pl.clip_low < 0.9 and pl.clip_high < 1.0:
        return []
    d = type(pl).model_fields
    return [_set_cfg(st, "algo.policy_loss.clip_low", d["clip_low"].default),
            _set_cfg(st, "algo.policy_loss.clip_high", d["clip_high"].default)]


def _lower_epochs(st, cfg, ev):
    """One pass over each batch: every extra epoch moves the policy further from the one that sampled."""
    return [_set_cfg(st, "algo.epochs", 1)] if cfg.algo.epochs > 1 else []


def _drop_entropy_bonus(st, cfg, ev):
    return [_set_cfg(st, "algo.entropy_coef", 0.0)] if cfg.algo.entropy_coef > 0 else []


def _raise_kl(st, cfg, ev):
    kl = cfg.algo.kl
    new = 0.05 if kl.coef == 0 else kl.coef * 3
    changes = []
    if getattr(st, "ref", None) is None:
        from tether.policy.reference import make_reference

        st.ref = make_reference(st.policy)  # anchored at the rolled-back (healthy) weights

        def drop_ref() -> None:
            st.ref = None

        changes.append(Change("reference", None, "snapshot weights", drop_ref))
    old_coef = st.update.kl_coef
    changes.append(_set_cfg(st, "algo.kl.coef", new))
    st.update.kl_coef = new

    def undo_coef() -> None:
        st.update.kl_coef = old_coef

    changes.append(Change("update.kl_coef", old_coef, new, undo_coef))
    return changes


def _tighten_clip(st, cfg, ev):
    pl = cfg.algo.policy_loss
    return [_set_cfg(st, "algo.policy_loss.clip_low", pl.clip_low * 0.5),
            _set_cfg(st, "algo.policy_loss.clip_high", pl.clip_high * 0.5)]


def _enable_is(st, cfg, ev):
    c = cfg.algo.correction
    if c.mode == "mask" and c.level == "sequence":
        return []
    return [_set_cfg(st, "algo.correction.threshold_low", 0.5), _set_cfg(st, "algo.correction.level", "sequence"),
            _set_cfg(st, "algo.correction.mode", "mask")]


def _raise_temperature(st, cfg, ev):
    t = cfg.rollout.sampling.temperature
    return [_set_cfg(st, "rollout.sampling.temperature", max(1.0, 1.5 * t))] if t < 1.5 else []


def _raise_max_tokens(factor: int):
    def apply(st, cfg, ev):
        m = cfg.rollout.sampling.max_new_tokens
        limit = getattr(st.policy, "max_positions", m * factor)
        new = min(m * factor, max(m, limit - 1))
        return [_set_cfg(st, "rollout.sampling.max_new_tokens", new)] if new > m else []
    return apply


def _downweight_component(st, cfg, ev):
    """Switch off (weight 0) the component the reward-hacking evidence names, else the
    non-correctness component with the largest weight; the verified-correctness component stays."""
    comps = list(cfg.reward.components)
    correctness = cfg.reward.correctness or comps[0].name
    name = ev.get("component")
    if name is None:
        others = [c for c in comps if c.name != correctness]
        if not others:
            return []
        name = max(others, key=lambda c: abs(c.weight)).name
    i = next((i for i, c in enumerate(comps) if c.name == name), None)
    if i is None or name == correctness:
        return []
    new = comps[i].model_copy(update={"weight": 0.0})
    changes = [_set_cfg(st, "reward.components", [*comps[:i], new, *comps[i + 1:]])]
    changes[0].path = f"reward.components[{name}].weight"
    changes[0].old, changes[0].new = comps[i].weight, new.weight
    if cfg.reward.correctness is None:
        changes.append(_set_cfg(st, "reward.correctness", correctness))
    return changes


# the optimizer-state check's rules for moments written between steps (a rescale, a loss, another tensor's state)
STATE_WRITES = ("shrunk", "grown", "foreign")


def state_write_step(findings: Any, step: int) -> int | None:
    """The step of the one optimizer-state write among `findings` of the last 10 steps (None: none, or several)."""
    writes = {f.step for f in findings if f.step > step - 10 and f.detector == "optimizer_state"
              and f.evidence.get("rule") in STATE_WRITES}
    return next(iter(writes)) if len(writes) == 1 else None


def _restore_state(st, cfg, ev):
    """A one-shot write of the optimizer state (the moments rescaled or replaced once, between two
    steps): the rollback that precedes this change restores the moments, so no setting changes -
    an LR cut would stay in force after the cause is gone and cost the rest of the run its pace.
    Applies only when the optimizer-state check fired at a single step (`state_write`); a write that
    recurs fires again during the trial (watched) and the trial is reverted."""
    step = ev.get("state_write")
    if not isinstance(step, int):
        return []
    return [Change("optimizer.state", f"written outside optimizer.step() at step {step}", "restored from the snapshot")]


def _halt(st, cfg, ev):
    return []


def _guard_masking(rows: list[dict]) -> str | None:
    """A correction that throws away most of the batch is not a repair."""
    fr = [r["is_mask_frac"] for r in rows if isinstance(r.get("is_mask_frac"), (int, float))]
    if fr and sum(fr) / len(fr) > 0.5:
        return f"the correction masked {sum(fr) / len(fr):.0%} of the tokens"
    return None


# signs that a trial's change did not stop the damage; update_size is the absolute per-update KL
# check (> 0.5 nats), the relative kl_explosion rule's twin when the run's baseline KL was already high
_HARM = ("grad_spike", "kl_explosion", "update_size", "nonfinite", "regression")
ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("restore_optimizer_state", "roll back to the last healthy weights and optimizer state, no setting changed",
           _HARM + ("optimizer_state",), _restore_state, restores=True),
    Action("lower_lr", "lower the learning rate by the update-size evidence (0.3x or less)",
           _HARM + ("clip_saturation", "entropy_explosion", "entropy_collapse"), _lower_lr(0.3, scaled=True)),
    Action("restore_clip", "switch PPO clipping back on (default range)", _HARM + ("clip_saturation",), _restore_clip),
    Action("lower_epochs", "one epoch per batch", _HARM + ("clip_saturation",), _lower_epochs),
    Action("lower_lr_residual", "lower the learning rate again by the update size a kept repair left",
           # the trial window's median KL over the pre-fault median (`residual`), 1/sqrt of it; no 0.3x
           # floor: a residual just over the band costs a mild cut
           _HARM + ("clip_saturation", "entropy_explosion", "entropy_collapse"), _lower_lr(1.0, scaled=True, key="residual_ratio")),
    Action("lower_lr_x10", "lower the learning rate 10x", _HARM + ("clip_saturation", "entropy_explosion", "entropy_collapse"),
           _lower_lr(0.1)),
    Action("drop_entropy_bonus", "switch the entropy bonus off", _HARM + ("entropy_explosion",), _drop_entropy_bonus),
    Action("raise_kl", "add / raise a KL anchor to the last healthy weights", _HARM + ("entropy_explosion", "reward_hacking"), _raise_kl),
    Action("tighten_clip", "halve the clipping range", _HARM + ("clip_saturation",), _tighten_clip),
    Action("enable_is_correction", "sequence-level masked importance sampling (MIS)", _HARM, _enable_is, _guard_masking),
    Action("raise_temperature", "raise the rollout temperature (to at least 1.0)", ("entropy_collapse", "regression"), _raise_temperature),
    Action("raise_max_tokens", "double max_new_tokens", ("truncation", "no_signal", "regression"), _raise_max_tokens(2)),
    Action("raise_max_tokens_x4", "quadruple max_new_tokens", ("truncation", "no_signal", "regression"), _raise_max_tokens(4)),
    Action("downweight_component", "switch off the reward component carrying the reward", ("reward_hacking", "regression"),
           _downweight_component),
    Action("halt", "halt with a report", (), _halt),
)}


# ----------------------------------------------------------------------------- judging a trial

KL_REFERENCE = 0.01  # per-update KL of a healthy PPO step (OpenAI baselines' target_kl 0.01-0.015): without a baseline


def update_ratio(history: Any, since: int) -> float | None:
    """How far the update size is out of range: the largest per-update KL from step `since` on
    over the baseline's median (or over KL_REFERENCE when there is no baseline)."""
    from tether.health.telemetry import finite

    kl = [v for r in history.rows if r["step"] >= since and (v := finite(r.get("approx_kl"))) is not None]
    if not kl:
        return None
    base = history.baseline("approx_kl", abs_floor=1e-4)
    return max(kl) / (base.median if base is not None else KL_REFERENCE)


def window_before(history: Any, since: int, n: int) -> list[float]:
    """The verified accuracy (else mean reward) of the last `n` kept steps before the onset."""
    from tether.health.telemetry import finite

    key = "accuracy" if history.baseline("accuracy") is not None else "reward/mean"
    rows = [r for r in history.rows if r["step"] < since and r["step"] not in history.discarded]
    return [v for r in rows[-n:] if (v := finite(r.get(key))) is not None]


def probe_drop(history: Any, since: int, start: int, tol: float = 0.15) -> str | None:
    """The held-out probe (eval/pass@1) evaluated during the trial fell more than `tol` below
    its last value before the fault (None: no probe on both sides, or no drop)."""
    from tether.health.telemetry import finite

    ev = [(r["step"], v) for r in history.rows if (v := finite(r.get("eval/pass@1"))) is not None]
    before = [v for s, v in ev if s < since]
    during = [v for s, v in ev if s > start]
    if before and during and during[-1] < before[-1] - tol:
        return f"held-out pass@1 {during[-1]:.3g} below pre-fault {before[-1]:.3g}"
    return None


def helped(history: Any, trial: dict[str, Any]) -> str | None:
    """Why a change that did not silence its watch is still part of the repair (None: it is not): it
    took the update-size evidence (the per-update KL over its healthy level) at least halfway back;
    KL grows with the square of the step size, so halving it removes a good part of the excess
    step. The change stays and the next candidate goes on top (clipping restored while the LR is
    still too high)."""
    before = trial.get("evidence", {}).get("update_ratio")
    after = update_ratio(history, trial["start"] + 1)
    if isinstance(before, (int, float)) and before > 1 and after is not None and after <= 0.5 * before:
        return f"update size {after:.3g}x healthy, down from {before:.3g}x"
    return None


# repairs of the update size: kept only once the per-update KL is back in its healthy band
SIZE_ACTIONS = ("lower_lr", "lower_lr_residual", "lower_lr_x10", "restore_clip", "lower_epochs")
# The healthy band: in 63 healthy faultbench runs (AMD EPYC, 2026-12-02: 1 and 2 threads, 1 and 3
# epochs) the median approx_kl of a 6-step window after step 13 was at most 2.8x the median of
# steps 4-12, and at most 1.9x in 95% of the 252 windows; a residual just over the band costs a
# mild extra cut (1/sqrt(2) = 0.71x), a missed one leaves an LR several times too high.
RESIDUAL_BAND = 2.0


# signs of lost accuracy that name no mechanism of their own (diagnosis signature keys)
DECLINE = ("regression", "accuracy_drop", "data_shift", "data_shift:unsolvable", "no_signal")


def size_repair_unfinished(actions: list[dict[str, Any]], findings: list[Any], top: Any) -> Any | None:
    """The hypothesis whose repair goes on when a kept repair of the update size did not last (None:
    it did, or something else moved): after the keep, the run lost accuracy again and every finding
    since then is a sign of decline that names no mechanism of its own (DECLINE) - the update is
    still too large for the run (at one epoch the per-update KL can sit in its band with the LR
    several times too high), which outranks a new cause the decline alone would suggest (lost
    accuracy makes problems look unsolvable: `data_shift:unsolvable`, read alone as wrong labels).
    The next candidate of the kept repair's cause is tried (an LR cut) instead of halting."""
    from tether.health.causes import CAUSES
    from tether.health.diagnosis import Hypothesis, signatures

    kept = next((a for a in reversed(actions) if a.get("event") == "keep" and a.get("action") in SIZE_ACTIONS), None)
    if kept is None or top is None or top.cause == kept["cause"] or kept["cause"] not in CAUSES:
        return None
    fresh = [f for f in findings if f.step >= kept["step"]]
    if not fresh or not any(f.detector in ("regression", "accuracy_drop", "data_shift") for f in fresh) or any(
            set(signatures(f)) - set(DECLINE) for f in fresh):
        return None
    c = CAUSES[kept["cause"]]
    return Hypothesis(c.name, c.family, c.title, 0.0, top.confidence, min(f.since for f in fresh),
                      [{"detector": f.detector, "message": f.message} for f in fresh], c.actions,
                      c.advice + f" (the kept repair {kept['action']!r} did not last: accuracy fell again after it)")


def residual(history: Any, trial: dict[str, Any], band: float = RESIDUAL_BAND) -> float | None:
    """The update size a kept repair of it left: the median per-update KL of the trial window (its
    first step excluded: the change takes effect there) over the pre-fault baseline median, when
    above `band` (None: back in the band, or no KL logged)."""
    from tether.health.telemetry import finite

    base = trial.get("evidence", {}).get("kl_base")
    kl = [v for r in history.rows if r["step"] > trial["start"] + 1 and r["step"] not in history.discarded
          and (v := finite(r.get("approx_kl"))) is not None]
    if not isinstance(base, (int, float)) or base <= 0 or len(kl) < 3:
        return None
    ratio = statistics.median(kl) / base
    return ratio if ratio > band else None


# ----------------------------------------------------------------------------- resume


def _rebuild_change(st: Any, cfg: Any, rec: dict[str, Any]) -> Change:
    """A change recorded as `{path, old, new}` (an action record) in force again after a resume,
    with its undo: config changes came back with the checkpoint's run settings (`st.settings`; set
    again if it had none); the LR and the KL coefficient came back with the optimizer/scheduler and
    the update state; a KL anchor is rebuilt from the checkpoint's reference weights (`st.pending_ref`)."""
    path, old, new = rec["path"], rec["old"], rec["new"]
    if path == "optimizer.state":  # a rollback, done before the checkpoint: nothing to put back in force
        return Change(path, old, new)
    if path == "train.lr":
        sched = getattr(st, "scheduler", None)
        base = list(getattr(sched, "base_lrs", []) or [])

        def undo_lr() -> None:
            st.optimizer.param_groups[0]["lr"] = old
            if sched is not None and base and new:
                sched.base_lrs[0] = base[0] * old / new
        return Change(path, old, new, undo_lr)
    if path == "update.kl_coef":
        st.update.kl_coef = new

        def undo_coef() -> None:
            st.update.kl_coef = old
        return Change(path, old, new, undo_coef)
    if path == "reference":
        if getattr(st, "ref", None) is None:
            from tether.policy.reference import make_reference

            st.ref = make_reference(st.policy)
            saved = getattr(st, "pending_ref", None)
            if saved is not None:
                st.ref.model.load_state_dict(saved)

        def drop_ref() -> None:
            st.ref = None
        return Change(path, old, new, drop_ref)
    if path.startswith("reward.components["):
        name = path[len("reward.components["):].split("]")[0]
        comps = list(st.settings.get("reward.components"))
        i = next(i for i, c in enumerate(comps) if c.name == name)
        ch = _set_cfg(st, "reward.components", [*comps[:i], comps[i].model_copy(update={"weight": new}), *comps[i + 1:]])
        return Change(path, old, new, ch.undo)
    _set_cfg(st, path, new)  # in force already when the checkpoint carried the run settings: no change then
    return Change(path, old, new, lambda: st.settings.set(path, old, source="health: revert", step=st.step))


def restore_in_force(st: Any, cfg: Any, actions: list[dict[str, Any]]) -> list[list[Change]]:
    """Re-apply, after a resume, every repair still in force at the checkpoint (applied and not
    reverted: kept ones and the one on trial), in the order they were made. Returns the rebuilt
    changes per applied action still in force; the last is the trial's when one is running."""
    in_force: list[tuple[str, list[dict[str, Any]]]] = []
    for a in actions:
        if a.get("event") == "apply":
            in_force.append((a["action"], a["changes"]))
        elif a.get("event") == "revert":
            idx = max((i for i, (n, _) in enumerate(in_force) if n == a["action"]), default=None)
            if idx is not None:
                in_force.pop(idx)
    rebuilt = [[_rebuild_change(st, cfg, c) for c in changes] for _, changes in in_force]
    if rebuilt:
        log.warning("resumed with %d health repair(s) in force: %s", len(rebuilt),
                    ", ".join(f"{c.path}={c.new}" for cs in rebuilt for c in cs))
    return rebuilt
