"""Fault plugins: the catalogue, the seams, and user faults in one file."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tether.algos.base import AdvantageOutputs
from tether.config import TetherConfig
from tether.health.faults import (FAMILIES, NO_FAULTS, UNEXPLAINED, Fault, FaultSet, build_faults, get_fault_class,
                                  load_fault_plugins, register_fault)
from tether.settings import RunSettings
from health_helpers import make_group


class _St:
    """The parts of a run state the seams read: the step, the policy, the run settings (tether.settings)."""

    def __init__(self, cfg: TetherConfig | None = None, step: int = 14, policy=None) -> None:
        self.step, self.policy, self.settings = step, policy, RunSettings(cfg or TetherConfig())


def _fault(name, severity="obvious", start=15):
    return get_fault_class(name)(severity, start)


def test_catalogue_covers_28_types_in_5_families():
    reg = load_fault_plugins()
    assert len(reg) >= 28
    assert {c.family for c in reg.values()} == set(FAMILIES)
    from tether.health.faults import reported
    from tether.health.diagnosis import CAUSES

    new = [c for c in reg.values() if c.__module__ == reported.__name__]
    assert len(new) >= 10 and {c.family for c in new} == set(FAMILIES)
    for name, cls in reg.items():
        assert cls.severities and set(cls.severities) <= {"subtle", "obvious"}, name
        assert cls.cause in CAUSES or cls.cause == UNEXPLAINED, name  # outside the taxonomy: the doctor must say so
        assert cls.__doc__, name


def test_the_split_is_fixed_and_covers_every_registered_fault():
    from tether.health.faults import (fresh, fresh3, fresh4, fresh5, fresh6, fresh7, fresh8, fresh9, fresh10, fresh11,
                                      fresh12, seams, split)

    reg = load_fault_plugins()
    def kinds_of(mod):
        return sorted(n for n, c in reg.items() if c.__module__ == mod.__name__)

    assert set(split.TUNED) | set(split.HELD_OUT) == set(reg) and not set(split.TUNED) & set(split.HELD_OUT)

    assert len(kinds_of(seams)) >= 10 and kinds_of(seams) == sorted(split.NEW_TUNED + split.SEEN_ONCE)
    assert kinds_of(fresh) == sorted(split.SEEN_ROUND2)  # round 2's held-out set, scored once, then tuned on
    assert kinds_of(fresh3) == sorted(split.SEEN_ROUND3)  # round 3's, the same
    assert kinds_of(fresh4) == sorted(split.SEEN_ROUND4)  # round 4's, the same
    assert kinds_of(fresh5) == sorted(split.SEEN_ROUND5)  # round 5's, the same
    assert kinds_of(fresh6) == sorted(split.SEEN_ROUND6)  # round 6's, the same
    assert kinds_of(fresh7) == sorted(split.SEEN_ROUND7)  # round 7's, the same
    assert kinds_of(fresh8) == sorted(split.SEEN_ROUND8)  # round 8's, the same
    assert kinds_of(fresh9) == sorted(split.SEEN_ROUND9)  # round 9's, the same
    assert kinds_of(fresh10) == sorted(split.SEEN_ROUND10)  # round 10's, the same
    assert kinds_of(fresh11) == sorted(split.SEEN_ROUND11)  # round 11's, the same
    # the held-out half is the twelfth set, written apart from the tuning (faults/fresh12.py)
    assert kinds_of(fresh12) == sorted(split.HELD_OUT) == sorted(fresh12.FRESH12) and len(split.HELD_OUT) >= 6
    for half in (split.NEW_TUNED, split.SEEN_ONCE, split.SEEN_ROUND2, split.SEEN_ROUND3, split.SEEN_ROUND4,
                 split.SEEN_ROUND5, split.SEEN_ROUND6, split.SEEN_ROUND7, split.SEEN_ROUND8, split.SEEN_ROUND9,
                 split.SEEN_ROUND10, split.SEEN_ROUND11, split.HELD_OUT):  # each holds kinds outside the taxonomy and inside it
        assert any(reg[n].cause == UNEXPLAINED for n in half) and any(reg[n].cause != UNEXPLAINED for n in half)
    assert split.split_of("my.module:Fault") == "other"


def test_no_faults_is_identity_and_falsy():
    assert not NO_FAULTS
    x = object()
    problems, sampling = NO_FAULTS.begin_rollout(x, None)
    assert problems is x and sampling is None and NO_FAULTS.end_rollout(x) is x and NO_FAULTS.on_advantages(x, None) is x
    assert build_faults([], None) is NO_FAULTS


def test_faults_wait_for_their_start_step():
    st = _St()
    st.step = 13  # computing step 14; the fault starts at 15
    f = FaultSet([_fault("advantage_sign_flip")], st)
    adv = AdvantageOutputs(torch.ones(4, 3))
    assert f.on_advantages(adv, torch.tensor([0, 0, 1, 1])) is adv
    st.step = 14
    assert torch.equal(f.on_advantages(adv, torch.tensor([0, 0, 1, 1])).advantages_BT, -torch.ones(4, 3))


def test_sign_flip_negates_all_groups_when_obvious():
    f = FaultSet([_fault("advantage_sign_flip")], _St())
    out = f.on_advantages(AdvantageOutputs(torch.ones(4, 3)), torch.tensor([0, 0, 1, 1]))
    assert torch.equal(out.advantages_BT, -torch.ones(4, 3))


def test_group_mixing_breaks_group_integrity():
    from tether.health.telemetry import compute_trajectory_stats

    groups = [make_group(str(i), (i, i + 1), [1.0, 0.0, 1.0, 0.0], [True, False, True, False]) for i in range(8)]
    mixed = _fault("group_mixing").on_rollouts(groups, 15)
    assert compute_trajectory_stats(mixed)["health/group_mixed_frac"] > 0.5


def test_label_corruption_is_deterministic_per_problem():
    f = _fault("label_corruption")
    probs = [{"id": f"p{i}", "prompt": "1+1=", "answer": "2"} for i in range(50)]
    a, b = f.on_problems(probs, 15), f.on_problems(probs, 30)
    assert a == b
    assert 0.6 < sum(p["answer"] != "2" for p in a) / 50 <= 1.0


def test_config_fault_changes_the_run_settings_once_and_logs_it():
    cfg = TetherConfig()
    st = _St(cfg)
    f = FaultSet([_fault("low_temperature")], st)
    f.begin_step()
    f.begin_rollout([], st.settings.config.rollout.sampling)
    assert st.settings.config.rollout.sampling.temperature == pytest.approx(0.3)
    assert cfg.rollout.sampling.temperature == 1.0  # the run's config itself is frozen, never changed
    assert st.settings.drain() == [{"step": 15, "path": "rollout.sampling.temperature", "old": 1.0,
                                    "new": pytest.approx(0.3), "source": "fault low_temperature"}]


def test_sampler_swap_lasts_one_rollout_and_leaves_the_settings_alone():
    st = _St(policy="trainer-policy")
    f = FaultSet([_fault("sampler_mismatch")], st)
    original = st.settings.config.rollout.sampling
    _, sampling = f.begin_rollout([], original)
    assert sampling.temperature == pytest.approx(0.5) and st.policy == "trainer-policy"
    f.end_rollout([])
    assert st.settings.config.rollout.sampling is original and not st.settings.overrides


def test_user_fault_in_one_file_by_module_path():
    mod = types.ModuleType("my_faults")

    class Blank(Fault):
        name, family, cause = "blank_answers", "data", "data_corruption"
        severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}

        def on_problems(self, problems, step):
            return [dict(p, answer="") for p in problems if self.coin(step, p["id"]) < self.p["p"]]

    mod.Blank = Blank
    sys.modules["my_faults"] = mod
    try:
        fs = build_faults([{"name": "my_faults:Blank", "severity": "obvious", "start": 1}], _St())
        assert fs.begin_rollout([{"id": "x", "answer": "3"}], None)[0] == [{"id": "x", "answer": ""}]
        with pytest.raises(ValueError, match="not a Fault"):
            get_fault_class("my_faults:nothing")
        register_fault(Blank)  # registering by name works too
        assert get_fault_class("blank_answers") is Blank
    finally:
        sys.modules.pop("my_faults")
        from tether.health.faults import FAULTS

        FAULTS.pop("blank_answers", None)


def test_unknown_fault_lists_valid_names():
    with pytest.raises(ValueError, match="lr_spike"):
        get_fault_class("lr_spyke")


def test_exploitable_judge_replaces_the_verifier_with_a_length_biased_judge():
    from tether.health.faults.reward import length_judge

    st = _St()
    f = get_fault_class("exploitable_judge")("obvious", 1)
    assert f.cause == "learned_reward_exploited" and "eval.every=5" in f.base
    f.begin_step(st, st.settings.config, 1)
    f.begin_step(st, st.settings.config, 2)  # once only
    cfg = st.settings.config
    weights = {c.name: c.weight for c in cfg.reward.components}
    assert weights == {"exact_match": 0.0, f.COMPONENT: 1.0}
    assert cfg.reward.correctness == "exact_match"  # the verifier still decides `correct`
    task = {"answer": "12"}
    assert length_judge("12", task, bias=0.8) == pytest.approx(0.2 + 0.8 * 2 / 6)
    assert length_judge("999999", task, bias=0.8) == pytest.approx(0.8)  # a long wrong reply beats the right one
