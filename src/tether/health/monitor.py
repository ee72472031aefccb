"""The online health monitor: observe every step, detect, diagnose, and (mode=auto) repair.

    st.health = build_health(cfg, rd, st)           # run_rl, before the first evaluation
    if st.health.observe(st, cfg, metrics, groups): # after each step, before the sinks log it
        stop.requested = True                       # auto mode halted the run with a report

`observe` adds the `health/*` telemetry and `health/alarms` to the step's metrics (so the
detectors can be replayed from metrics.jsonl by `tether doctor`), appends findings, diagnoses
and actions to `health.jsonl`, and never raises: a failing detector is logged and disabled, a
failing monitor is logged and skipped. A watchdog thread names the phase a hung run is stuck in
(reward, generate, update, eval, checkpoint, ...), dumps every thread's stack and exits with 3.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
from typing import Any

from tether.health import (detectors_learned, detectors_progress, detectors_rollout,  # noqa: F401  (register their detectors)
                           detectors_sanity)
from tether.health.detectors import DETECTORS, Detector, Finding, RunContext
from tether.health.diagnosis import Hypothesis, diagnose
from tether.health.remediation import (ACTIONS, RESIDUAL_BAND, SIZE_ACTIONS, Snapshot, do_rollback, helped, probe_drop,
                                       residual, restore_in_force, size_repair_unfinished, snapshot_before,
                                       state_write_step, take_snapshot, update_ratio, window_before)
from tether.health.invariants import compute_param_norm
from tether.health.watchdog import Watchdog, current_phase
from tether.health.telemetry import (History, compute_buffers_fingerprint, compute_fingerprint_of_sums, compute_sums_match,
                                     compute_trajectory_stats, compute_weight_sums, finite, load_history)
from tether.io.state import decode_state, encode_state

log = logging.getLogger("tether.health")
# findings that mean the weights themselves are damaged: a repair then starts from a rollback
DAMAGE = {"regression", "entropy_collapse", "entropy_explosion", "kl_explosion", "grad_spike", "clip_saturation",
          "length", "reward_hacking", "nonfinite", "advantage_misalignment", "advantage_invariants", "accuracy_drop",
          "loss_mask", "reward_linkage", "update_size", "progress"}


def build_detectors(hc: Any) -> dict[str, Detector]:
    """The enabled detectors with their `health.thresholds` overrides applied."""
    unknown = [n for n in hc.disable if n not in DETECTORS]
    over: dict[str, dict[str, float]] = {}
    for key, v in hc.thresholds.items():
        name, _, param = key.partition(".")
        if name not in DETECTORS or not param:
            unknown.append(key)
        over.setdefault(name, {})[param] = v
    if unknown:
        raise ValueError(f"health: unknown detector(s) {unknown}; valid: {', '.join(sorted(DETECTORS))}")
    return {n: cls(over.get(n)) for n, cls in DETECTORS.items() if n not in hc.disable}


def build_context(cfg: Any) -> RunContext:
    comps, r = cfg.reward.components, cfg.rollout
    return RunContext(cfg.reward.correctness or (comps[0].name if comps else None),
                      {c.name: float(c.weight) for c in comps}, cfg.health.max_staleness, rollout_n=int(r.n),
                      advantage=_estimator(cfg.algo.advantage), distinct_tasks=cfg.data.train_size >= 2 * r.problems_per_step,
                      sequences_filtered=any(v != "keep" for v in cfg.algo.compact_filter.values()))


def _estimator(adv: Any) -> str:
    """The estimator's name; a per-task whitening on top (`task_norm`) makes it another estimator
    (group means are no longer 0), so the name says so and the group-relative checks skip it."""
    norm = getattr(adv, "task_norm", "none")
    return adv.name if norm == "none" else f"{adv.name}+{norm}_norm"


@dataclasses.dataclass(frozen=True)
class OnTop:
    """A trial on top of a change kept as part of the repair: the update-size evidence is measured
    from step `stacked` on, from the current weights unless `rollback`; `extra` joins the evidence."""

    stacked: int
    rollback: bool = False
    extra: dict[str, Any] | None = None


class NullMonitor:
    """`health.mode=off`: observes nothing."""

    def observe(self, st: Any, cfg: Any, metrics: dict, groups: list) -> bool:
        return False

    def summary(self) -> dict[str, Any]:
        return {"mode": "off"}

    def close(self) -> None:
        pass

    def state_dict(self) -> None:
        return None


class HealthMonitor:
    def __init__(self, cfg: Any, rd: Any = None, watchdog: bool = True) -> None:
        hc = cfg.health
        self.mode, self.hc, self.rd = hc.mode, hc, rd
        self.history = History(hc.baseline_skip, hc.baseline_window, hc.rebase_every)
        self.detectors = build_detectors(hc)
        self.disabled: dict[str, str] = {}
        self.findings: list[Finding] = []
        self._active: dict[str, str] = {}  # detector -> severity last reported
        self.diagnosis: list[Hypothesis] = []
        self.decided = False
        self.decision: dict[str, Any] | None = None
        self.decisions: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self.snapshots: list[Snapshot] = []
        self.trial: dict[str, Any] | None = None
        self.halted: str | None = None
        self.overhead_s = 0.0
        self._prev_tasks: list[str] = []
        self.weight_fps: dict[int, float] = {}  # policy version -> fingerprint of the trainer's weights
        self.buffer_fps: dict[int, float] = {}  # policy version -> fingerprint of the trainer's buffers
        self.weight_sums: dict[int, Any] = {}  # policy version -> per-tensor sums of the trainer's weights (the last
        # 256 versions; checkpointed with the rest of the monitor's state)
        self._sampler_sums: Any = None  # the last rollout's per-tensor sums (`note_sampler_weights`)
        self._ctx: RunContext | None = None
        self._unactionable: set[str] = set()
        self._tried = 0
        self._tried_for: dict[str, list[str]] = {}
        self._given_up: dict[str, str] = {}  # cause -> why no repair is left (halts if accuracy regresses)
        self.watchdog = Watchdog(hc.watchdog_timeout_s, rd) if hc.watchdog_timeout_s and watchdog else None

    # ------------------------------------------------------------------ observe

    def observe(self, st: Any, cfg: Any, metrics: dict, groups: list) -> bool:
        """Health of the step just finished; True when auto mode halts the run."""
        t0 = time.perf_counter()
        halt = False
        try:
            halt = self._observe(st, cfg, metrics, groups)
        except Exception as err:  # the monitor must never stop training
            log.error("health monitor failed at step %s (skipped): %s", getattr(st, "step", "?"), err)
            self._write({"kind": "monitor_error", "step": getattr(st, "step", None), "error": repr(err),
                         "traceback": traceback.format_exc(limit=5)})
        dt = time.perf_counter() - t0
        self.overhead_s += dt
        metrics["time/health"] = dt
        return halt

    def _observe(self, st, cfg, metrics, groups) -> bool:
        step = int(st.step)
        metrics.update(compute_trajectory_stats(groups, self._prev_tasks))
        self._prev_tasks = [g.task_id for g in groups]
        metrics["health/weights_mismatch"] = self._check_weights(metrics)
        if metrics["health/weights_mismatch"] == 1.0 and self._sampler_sums is not None:  # stale, or no version at all?
            metrics.update(compute_sums_match(self._sampler_sums, self.weight_sums))
        self._sampler_sums = None
        metrics["health/buffers_mismatch"] = self._check_weights(metrics, "rollout/buffers_fp", self.buffer_fps)
        metrics["health/param_norm"] = compute_param_norm(getattr(getattr(st, "policy", None), "model", None))
        ctx = build_context(cfg)
        if ctx != self._ctx:  # recorded so that `tether doctor` replays with the same reward weights
            self._ctx = ctx
            self._write({"kind": "context", "step": step, **dataclasses.asdict(ctx)})
        findings = self.run_detectors(step, metrics, ctx)
        metrics["health/alarms"] = float(len(findings))
        metrics["health/critical"] = float(sum(f.severity == "critical" for f in findings))
        halt = self.mode == "auto" and self._remediate(st, cfg, step, findings)
        self._record_weights(st)  # after any rollback: the weights the next rollout must run
        return halt

    def _check_weights(self, metrics: dict, key: str = "rollout/weights_fp", fps: dict[int, float] | None = None) -> float:
        """1.0 when the rollout's weights (`key`: rollout/weights_fp, or rollout/buffers_fp for the
        non-parameter state) differ from the trainer's at the version the rollout reports for them
        (rollout/weights_fp_version; a silently failed weight sync), 0.0 when they match, NaN when
        either is unknown (no fingerprint, first step, resumed run)."""
        fp, v = finite(metrics.get(key)), finite(metrics.get("rollout/weights_fp_version",
                                                             metrics.get("health/rollout_version_min")))
        fps = self.weight_fps if fps is None else fps
        ref = fps.get(int(v)) if v is not None else None
        if fp is None or ref is None:
            return float("nan")
        return 0.0 if abs(fp - ref) <= 1e-9 * max(1.0, abs(ref)) else 1.0

    def note_sampler_weights(self, sums: Any) -> None:
        """The rollout's per-tensor weight sums (tether.rollout.collect), read by the next observe."""
        self._sampler_sums = sums

    def _record_weights(self, st: Any) -> None:
        model = getattr(getattr(st, "policy", None), "model", None)
        sums = compute_weight_sums(model)  # one pass over the weights: the fingerprint and its per-tensor parts
        if sums is not None:
            v = int(st.policy.version)
            # every recent version (a tensor a partial sync never delivers stays at an old one): 256 x 8 bytes a tensor
            self.weight_sums = {**{k: x for k, x in self.weight_sums.items() if k > v - 256}, v: sums}
        for name, fp in (("weight_fps", compute_fingerprint_of_sums(sums)), ("buffer_fps", compute_buffers_fingerprint(model))):
            if math.isfinite(fp):
                kept = {k: x for k, x in getattr(self, name).items() if k > st.policy.version - 8}
                setattr(self, name, {**kept, int(st.policy.version): fp})

    def run_detectors(self, step: int, row: dict, ctx: RunContext) -> list[Finding]:
        """Add `row` to the history, run every enabled detector, report and diagnose."""
        self.history.add(step, dict(row))
        found = []
        for name, det in list(self.detectors.items()):
            try:
                f = det.check(self.history, ctx)
            except Exception as err:  # a broken detector is switched off, never fatal
                self.disabled[name] = repr(err)
                del self.detectors[name]
                log.error("health detector %s failed and is disabled: %r", name, err)
                self._write({"kind": "detector_error", "step": step, "detector": name, "error": repr(err)})
                continue
            if f is not None:
                found.append(f)
        for f in found:
            if self._active.get(f.detector) != f.severity:
                self._write({"kind": "finding", **f.to_json()})
                log.warning("step %d: %s [%s] since step %d: %s (docs/health/%s.md)", step, f.detector, f.severity,
                            f.since, f.message, f.mode)
        self._active = {f.detector: f.severity for f in found}
        self.decided = False
        if found:
            self.history.exclude([step])
            self.findings.extend(found)
            self._diagnose(step, ctx)
        return found

    def _diagnose(self, step: int, ctx: RunContext | None = None) -> None:
        recent = [f for f in self.findings if f.step > step - 10]
        hyps = diagnose(recent, ctx)
        previous = self.diagnosis[0].cause if self.diagnosis else None
        if hyps and hyps[0].cause != previous:
            self._write({"kind": "diagnosis", "step": step, "hypotheses": [h.to_json() for h in hyps[:3]]})
            log.warning("step %d: likely cause: %s (%s, confidence %.0f%%)", step, hyps[0].title, hyps[0].family,
                        100 * hyps[0].confidence)
        self.diagnosis = hyps
        # the diagnosis the monitor stands by: a critical finding, and the same top cause two steps running
        self.decided = bool(hyps) and hyps[0].cause == previous and any(
            f.severity == "critical" and f.step == step for f in recent)
        if self.decided and (self.decision is None or self.decision["cause"] != hyps[0].cause):
            self.decision = {"kind": "decision", "step": step, "since": hyps[0].since, "cause": hyps[0].cause,
                             "family": hyps[0].family, "hypotheses": [h.to_json() for h in hyps[:3]]}
            self.decisions.append(self.decision)
            self._write(self.decision)

    # ------------------------------------------------------------------ auto mode

    def _remediate(self, st, cfg, step: int, findings: list[Finding]) -> bool:
        if self.trial is not None:
            return self._judge_trial(st, cfg, step)
        if not findings and step % self.hc.snapshot_every == 0 and self._clean_since(step - 2):
            self.snapshots = (self.snapshots + [take_snapshot(st, step)])[-3:]
        critical = [f for f in findings if f.severity == "critical"]
        if critical and not self.decided and self._restore_at_once(st, cfg, step, critical):
            return False
        if not critical or not self.decided:
            return False
        top = size_repair_unfinished(self.actions, self.findings, self.diagnosis[0]) or self.diagnosis[0]
        since = min(f.since for f in self.findings if f.step > step - 10)
        if top.cause in self._given_up:  # no repair left: halt once the fault costs accuracy
            if not self._regressed(step):
                return False
            snap = snapshot_before(self.snapshots, since)
            return self._halt(st, step, top, snap, self._given_up[top.cause] + "; accuracy regressed")
        if top.cause in self._unactionable:
            return False
        tried = self._tried_for.setdefault(top.cause, [])
        candidates = [a for a in top.actions if a not in tried]  # a change that was kept and did not last is not retried
        return self._start_trial(st, cfg, step, since, candidates, top, critical)

    def _restore_at_once(self, st, cfg, step: int, critical: list[Finding]) -> bool:
        """The optimizer state written at this step: an exact finding with an exact undo (the rollback), tried at
        once - a one-shot write never holds a diagnosis two steps. Reverted, the usual flow resumes (`eager`)."""
        top, name = (self.diagnosis[0] if self.diagnosis else None), "restore_optimizer_state"
        if (top is None or name not in top.actions or name in self._tried_for.get(top.cause, [])
                or state_write_step(critical, step) is None):
            return False
        self._start_trial(st, cfg, step, min(f.since for f in self.findings if f.step > step - 10), [name], top, critical)
        if self.trial is None:
            return False
        self.trial["eager"] = True
        return True

    def _regressed(self, step: int) -> bool:
        """The fault costs accuracy, or critical signs of damage to the weights keep coming."""
        recent = [f for f in self.findings if f.step > step - 10]
        return any(f.detector in ("regression", "accuracy_drop") for f in recent) or any(
            f.detector in DAMAGE and f.severity == "critical" for f in recent if f.step >= step - 1)

    def _give_up(self, st, step: int, hyp: Hypothesis, snap: Snapshot | None, why: str) -> bool:
        """No (further) repair: halt at the last healthy weights if the fault costs accuracy, else
        keep training and advise (halting a run that still learns would do more harm than good)."""
        if self._regressed(step):
            return self._halt(st, step, hyp, snap, why)
        self._given_up[hyp.cause] = why
        self._write({"kind": "advice", "step": step, "cause": hyp.cause, "advice": hyp.advice,
                     "message": f"{why}; accuracy has not regressed: training continues, halting if it does"})
        log.warning("step %d: %s: %s; advising only", step, hyp.cause, why)
        return False

    def _clean_since(self, step: int) -> bool:
        return not any(f.step >= step for f in self.findings[-20:])

    def _start_trial(self, st, cfg, step, since, candidates, hyp, evidence_findings, on_top: OnTop | None = None) -> bool:
        """Try the next candidate; `on_top`: on top of a change kept as part of the repair (OnTop)."""
        stacked, rollback, extra = (on_top.stacked, on_top.rollback, on_top.extra) if on_top else (None, False, None)
        recent = {f.detector for f in self.findings if f.step > step - 10}
        damaged = bool(recent & DAMAGE) and (stacked is None or rollback)
        # damaged weights: back to the newest snapshot before the onset (detection lags the onset, so a
        # snapshot from the step just before `since` may already hold damage); else undo point = now
        snap = snapshot_before(self.snapshots, since) if damaged else None
        rollback = snap is not None
        base = self.history.baseline("approx_kl", abs_floor=1e-4)
        evidence: dict[str, Any] = {"update_ratio": update_ratio(self.history, since if stacked is None else stacked),
                                    "kl_base": base.median if base is not None else None, **(extra or {})}
        for f in evidence_findings:
            evidence.update({k: v for k, v in f.evidence.items() if not isinstance(v, dict)})
        if (written := state_write_step(self.findings, step)) is not None:  # once: a rollback alone undoes it
            evidence["state_write"] = written
        while candidates:
            name = candidates.pop(0)
            if name == "halt":
                return self._give_up(st, step, hyp, snap, "the diagnosed cause needs a fix no setting can make")
            if self._tried >= self.hc.max_actions:
                return self._give_up(st, step, hyp, snap, f"{self._tried} repairs tried (health.max_actions)")
            if ACTIONS[name].restores:  # the change is the rollback itself: only from a snapshot before the onset
                if "state_write" not in evidence:
                    continue
                if not rollback:
                    snap = snapshot_before(self.snapshots, since)
                    rollback = snap is not None
                if not rollback:
                    continue
            if rollback:  # first roll back (a KL anchor is taken from the restored weights)
                do_rollback(st, snap)
            undo = snap if rollback else take_snapshot(st, step)
            changes = ACTIONS[name].apply(st, cfg, evidence)
            if not changes:
                continue
            self._tried += 1
            self._tried_for.setdefault(hyp.cause, []).append(name)
            pre = self._window_before(since)
            self.trial = {"action": name, "start": step, "since": since, "snap": undo, "changes": changes,
                          "candidates": candidates, "hyp": hyp, "pre": pre, "evidence": evidence}
            for d in self.detectors.values():
                d.reset()
            if rollback:
                self.history.discard(range(since, step + 1))
            self._act("apply", step, name, hyp, changes, snap if rollback else None,
                      discarded_from=since if rollback else None)
            return False
        if not hyp.actions:
            self._unactionable.add(hyp.cause)
            self._write({"kind": "advice", "step": step, "cause": hyp.cause, "advice": hyp.advice,
                         "message": "no safe automatic change for this cause; advising only"})
            return False
        return self._give_up(st, step, hyp, snap, "no applicable repair left")

    def _window_before(self, since: int) -> list[float]:
        return window_before(self.history, since, self.hc.trial_window)

    def _judge_trial(self, st, cfg, step: int) -> bool:
        t = self.trial
        if step < t["start"] + self.hc.trial_window:
            return False
        watch = set(ACTIONS[t["action"]].watch)
        bad = [f for f in self.findings if f.step > t["start"] + 1 and f.severity == "critical" and f.detector in watch]
        key = "accuracy" if self.history.baseline("accuracy") is not None else "reward/mean"
        trial_rows = [r for r in self.history.rows if r["step"] > t["start"]]
        now = [v for r in trial_rows if (v := finite(r.get(key))) is not None]
        unsafe = ACTIONS[t["action"]].guard(trial_rows)
        pre = t["pre"]
        pre_mean = sum(pre) / len(pre) if pre else None
        now_mean = sum(now) / len(now) if now else None
        tol = 0.03
        if len(pre) >= 2 and now:  # two standard errors of the difference of the two window means
            var = sum((x - pre_mean) ** 2 for x in pre) / (len(pre) - 1)
            tol = max(tol, 2 * (var / len(pre) + var / len(now)) ** 0.5)
        worse = pre_mean is not None and now_mean is not None and now_mean < pre_mean - tol
        probe = probe_drop(self.history, t["since"], t["start"])
        worse = worse or probe is not None
        self.trial = None
        # a kept repair of the update size that left the per-update KL out of its healthy band: the
        # next change is an LR cut sized by what is left (then the other candidates)
        left = residual(self.history, t) if t["action"] in SIZE_ACTIONS and not unsafe else None
        nxt = (["lower_lr_residual"] if left else []) + t["candidates"]
        extra = {"residual_ratio": left, "kl_base": t["evidence"].get("kl_base")}
        if not bad and not worse and not unsafe:
            part = f"per-update KL still {left:.3g}x its pre-fault median (band {RESIDUAL_BAND:g}x)" if left else None
            self._act("keep", step, t["action"], t["hyp"], t["changes"], t["snap"], window_mean=now_mean, pre_mean=pre_mean,
                      **({"partial": part} if part else {}))
            return self._start_trial(st, cfg, step, t["since"], nxt, t["hyp"], [],
                                     OnTop(t["start"] + 1, extra=extra)) if left else False
        part = helped(self.history, t) if bad and not unsafe and nxt else None
        if part:  # part of the repair: it stays and the next candidate goes on top (weights rolled back if they lost accuracy)
            self._act("keep", step, t["action"], t["hyp"], t["changes"], t["snap"], window_mean=now_mean,
                      pre_mean=pre_mean, partial=part)
            return self._start_trial(st, cfg, step, t["since"], nxt, t["hyp"], [],
                                     OnTop(t["start"] + 1, rollback=bool(worse), extra=extra))
        if t["snap"] is not None:
            do_rollback(st, t["snap"])
        for c in reversed(t["changes"]):
            c.undo()
        why = unsafe or (f"{len(bad)} critical finding(s) of {sorted({f.detector for f in bad})}" if bad else probe or
                         f"{key} {now_mean:.3g} below pre-fault {pre_mean:.3g}")
        self._act("revert", step, t["action"], t["hyp"], t["changes"], t["snap"], reason=why,
                  discarded_from=t["start"] if t["snap"] is not None else None)
        if t["snap"] is not None:
            self.history.discard(range(t["start"], step + 1))
        if t.get("eager"):  # the restore tried at once did not hold: back to the usual flow, nothing given up
            return False
        return self._start_trial(st, cfg, step, t["since"], t["candidates"], t["hyp"], [])

    def _act(self, kind, step, name, hyp, changes, snap, **more) -> None:
        rec = {"kind": "action", "event": kind, "step": step, "action": name, "title": ACTIONS[name].title,
               "cause": hyp.cause, "changes": [c.to_json() for c in changes],
               "rollback_to": snap.step if snap is not None else None, **more}
        self.actions.append(rec)
        self._write(rec)
        log.warning("step %d: %s %s (%s) for cause %s%s", step, kind, name, ACTIONS[name].title, hyp.cause,
                    f", rolled back to step {snap.step}" if snap is not None and kind != "keep" else "")

    def _halt(self, st, step: int, hyp: Hypothesis, snap: Snapshot | None, why: str) -> bool:
        """Stop the run with a report, leaving it at the last healthy weights (the final checkpoint)."""
        if snap is not None:
            do_rollback(st, snap)
        self.halted = f"step {step}: {hyp.title} ({hyp.family}); {why}"
        self._write({"kind": "halt", "step": step, "cause": hyp.cause, "family": hyp.family, "reason": why,
                     "rollback_to": snap.step if snap is not None else None,
                     "advice": hyp.advice, "hypotheses": [h.to_json() for h in self.diagnosis[:3]]})
        log.error("halting: %s. %s", self.halted, hyp.advice)
        return True

    # ------------------------------------------------------------------ reporting

    def _write(self, record: dict[str, Any]) -> None:
        if self.rd is not None:
            try:
                self.rd.append_health(record)
            except OSError as err:
                log.error("cannot write health.jsonl: %s", err)

    def summary(self) -> dict[str, Any]:
        first = min(self.findings, key=lambda f: (f.step, f.since), default=None)
        return {
            "mode": self.mode, "healthy": not self.findings, "findings": len(self.findings),
            "first_alarm": None if first is None else {"step": first.step, "since": first.since, "detector": first.detector},
            "diagnosis": [h.to_json() for h in self.diagnosis[:3]], "decision": self.decision, "actions": self.actions,
            "halted": self.halted, "disabled": self.disabled, "overhead_s": self.overhead_s,
        }

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    # ------------------------------------------------------------------ checkpoint state

    _NOT_STATE = frozenset({"mode", "hc", "rd", "watchdog", "detectors"})
    _DETECTOR_PARAMS = frozenset({"p", "persist_n", "window_n", "critical_n"})  # follow the (resumed) config

    def state_dict(self) -> dict[str, Any] | None:
        """What the monitor learned so far (history, excluded steps, detector streaks, findings,
        diagnosis, snapshots, repair trial, previous tasks) as plain data (tether.io.state), saved in
        checkpoints so that a resumed run continues it exactly. A detector's attributes are its
        state, except its parameters. None (logged) if some state cannot be stored."""
        try:
            return encode_state({
                "monitor": {k: v for k, v in vars(self).items() if k not in self._NOT_STATE},
                "detectors": {n: {k: v for k, v in vars(d).items() if k not in self._DETECTOR_PARAMS}
                              for n, d in self.detectors.items()},
            })
        except (TypeError, ValueError) as err:
            log.error("health monitor state not checkpointed (a resume restarts it): %s", err)
            return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`; detectors disabled before the checkpoint stay disabled."""
        s = decode_state(state)
        vars(self).update(s["monitor"])
        for name, det in list(self.detectors.items()):
            if name in self.disabled:
                del self.detectors[name]
            elif name in s["detectors"]:
                vars(det).update(s["detectors"][name])


def build_health(cfg: Any, rd: Any = None, st: Any = None, state: dict[str, Any] | None = None) -> HealthMonitor | NullMonitor:
    """The run's monitor (`NullMonitor` for `health.mode=off`). A resumed run restores `state`
    (`HealthMonitor.state_dict` from its checkpoint); without one it re-reads its history."""
    if cfg.health.mode == "off":
        return NullMonitor()
    mon = HealthMonitor(cfg, rd)
    if state is not None:
        mon.load_state_dict(state)
        if st is not None and (rebuilt := restore_in_force(st, cfg, mon.actions)) and mon.trial is not None:
            mon.trial["changes"] = rebuilt[-1]  # the repair on trial: its undo works after the resume
    elif st is not None and st.step == 0 and getattr(st, "policy", None) is not None:
        mon._record_weights(st)  # the starting weights: the first rollout samples with them
    elif rd is not None and st is not None and st.step > 0:
        load_history(mon.history, rd.read_metrics(), st.step)
    return mon


__all__ = ["HealthMonitor", "NullMonitor", "Watchdog", "build_health", "build_detectors", "current_phase"]
