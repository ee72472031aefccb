"""Synthetic trajectories and metric series for the health tests."""

from __future__ import annotations

import random

from tether.health.detectors import RunContext
from tether.health.monitor import HealthMonitor
from tether.health.config import HealthConfig
from tether.types import Outcome, RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn


def make_group(task_id: str, prompt: tuple[int, ...], rewards: list[float], correct: list[bool | None],
               responses: list[tuple[int, ...]] | None = None, version: int = 0) -> TrajectoryGroup:
    responses = responses or [(10 + i, 2) for i in range(len(rewards))]
    trajs = []
    for r, c, resp in zip(rewards, correct, responses):
        turn = Turn(context_ids=prompt, action_ids=resp, action_logprobs=tuple(-0.5 for _ in resp), policy_version=version)
        trajs.append(Trajectory(task_id, (turn,), RewardResult(r, {"exact_match": r}, Outcome.OK, c), StopReason.EOS))
    return TrajectoryGroup(task_id, tuple(trajs), {"prompt": "p", "answer": "1"})


HEALTHY = {  # signal: (mean, noise std) of a healthy step
    "reward/mean": (0.35, 0.05), "accuracy": (0.35, 0.05), "entropy": (0.7, 0.03), "grad_norm": (1.0, 0.2),
    "approx_kl": (0.01, 0.002), "kl_loss": (0.01, 0.002), "clip_frac": (0.02, 0.005), "logp_gap_mean": (2e-7, 2e-8),
    "ess": (1.0, 0.0), "response_length/mean": (2.4, 0.1), "truncation_rate": (0.0, 0.0),
    "frac_zero_variance_groups": (0.4, 0.05), "reward/error_rate": (0.0, 0.0), "time/step": (0.2, 0.01),
    "time/generate": (0.08, 0.005), "time/reward": (0.01, 0.001), "time/batch": (0.01, 0.001), "time/update": (0.1, 0.005),
    "advantage/score_corr": (0.99, 0.003), "health/reward_correct_auc": (1.0, 0.0), "health/reward_incorrect_mean": (0.0, 0.0),
    "health/reward_correct_mean": (1.0, 0.0), "health/distinct_frac": (0.5, 0.03), "health/group_mixed_frac": (0.0, 0.0),
    "health/prompt_len_mean": (5.0, 0.1), "health/task_repeat_frac": (0.2, 0.05), "health/all_wrong_groups": (0.3, 0.05),
    "reward/exact_match/mean": (0.35, 0.05), "nonfinite_steps": (0.0, 0.0),
    # the update's probes and the invariant signals (what a healthy faultbench run logs)
    "update/step_ratio": (0.26, 0.02), "update/logp_change": (0.15, 0.03), "update/logp_gain": (0.08, 0.04),
    "update/frozen_frac": (0.0, 0.0), "update/norm_ratio": (1.0, 0.0), "update/kl_pre": (0.0, 0.0),
    "update/kl_pre_sampler": (0.0, 0.0), "update/grad_cos_prev": (0.08, 0.2),
    "health/param_norm": (32.8, 0.002), "health/dup_groups_unlikely": (0.0, 0.0), "health/dup_groups_expected": (0.02, 0.0),
    "health/answer_in_prompt": (0.28, 0.06), "health/answer_in_prompt_chance": (0.12, 0.03),
    "health/buffers_mismatch": (0.0, 0.0), "health/weights_mismatch": (0.0, 0.0),
}


def healthy_row(step: int, rng: random.Random) -> dict:
    row = {k: m + rng.gauss(0.0, s) for k, (m, s) in HEALTHY.items()}
    row["policy_version"] = float(step)
    row["health/rollout_version_min"] = float(step - 1)
    return row


def replay(series: list[dict], detector: str | None = None, **health) -> list:
    """Run the detectors (one, or all) over `series` rows; returns the findings."""
    cfg = HealthConfig(**health)
    class _C:  # the parts of TetherConfig the monitor reads
        pass
    c = _C()
    c.health = cfg
    mon = HealthMonitor(c, rd=None, watchdog=False)
    if detector is not None:
        mon.detectors = {detector: mon.detectors[detector]}
    ctx = RunContext("exact_match", {"exact_match": 1.0}, 0)
    for i, row in enumerate(series, 1):
        mon.run_detectors(i, row, ctx)
    return mon.findings


def series(n: int, seed: int = 0, change: dict | None = None, start: int = 15) -> list[dict]:
    """n healthy rows; from `start` on, `change[key](row, step)` rewrites the row."""
    rng = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        row = healthy_row(step, rng)
        if change and step >= start:
            for fn in change.values():
                fn(row, step)
        out.append(row)
    return out


class SeamState:
    """The parts of a run state the fault seams read; computing step `step + 1`."""

    def __init__(self, step: int = 14, policy=None) -> None:
        from tether.config import TetherConfig
        from tether.settings import RunSettings

        self.step, self.policy, self.settings = step, policy, RunSettings(TetherConfig())


def make_fault(name: str, severity: str = "obvious", start: int = 15):
    from tether.health.faults import get_fault_class

    return get_fault_class(name)(severity, start)


def fault_before_start(name: str, severity: str, policy=None):
    """A FaultSet whose fault starts at step 15, and its state computing step 14 (before the start)."""
    from tether.health.faults import FaultSet

    st = SeamState(13, policy)
    return FaultSet([make_fault(name, severity)], st), st


def registered_fault_set(module, kinds: tuple[str, ...], outside: int) -> dict:
    """The checks every held-out fault set passes (faults/fresh*.py): exactly `kinds` registered from
    `module`, each labelled with a cause of the taxonomy or UNEXPLAINED (`outside` of them), with both
    severities and a docstring. Returns the registry for the set's own checks."""
    from tether.health.causes import CAUSES
    from tether.health.faults import UNEXPLAINED, load_fault_plugins

    reg = load_fault_plugins()
    assert sorted(n for n, c in reg.items() if c.__module__ == module.__name__) == sorted(kinds)
    causes = [reg[n].cause for n in kinds]
    assert all(c in CAUSES or c == UNEXPLAINED for c in causes) and causes.count(UNEXPLAINED) == outside
    assert all(set(reg[n].severities) == {"subtle", "obvious"} and reg[n].__doc__ for n in kinds)
    return reg
