"""SFT demonstrations from the built-in environments: the weak teacher (`sft.demo_noise`) and
demonstrations cut by the context builder exactly as rollouts of the same actions are."""

from __future__ import annotations

import random

import pytest
from builtin_helpers import expert_actions, run_expert_rollouts

from tether.train.batching import build_sequences
from tether.config import ContextConfig, EnvConfig
from tether.envs import run_expert_episode
from tether.rollout.demos import build_env_demo_records
from tether.tasks import make_problems


def test_one_mistake_per_noisy_episode_and_none_without_noise():
    problems = make_problems("env_mix", 60, 0, {"envs": [{"name": n} for n in ("qa", "household", "shop", "calc")]})
    clean = [run_expert_episode(p, noise=0.0, rng=random.Random(0))[2].info["correct"] for p in problems]
    assert all(clean)
    rng = random.Random(0)
    noisy = [run_expert_episode(p, noise=1.0, rng=rng) for p in problems]  # env_mix delegates to each env
    assert not any(last.info["correct"] for _, _, last in noisy)
    for (history, _, _), p in zip(noisy, problems):  # the teacher's actions part from the expert's
        expert = [m.content for m in run_expert_episode(p)[0] if m.role == "assistant"]
        taught = [m.content for m in history if m.role == "assistant"]
        assert sum(a != b for a, b in zip(expert, taught)) >= 1


@pytest.mark.parametrize("builder", ["sliding_window", "summary"])
def test_windowed_demos_are_the_sequences_a_rollout_of_the_same_actions_trains_on(env_policy, scripted, builder):
    problems = make_problems("household", 3, 1)
    ctx = ContextConfig(builder=builder, window=2)
    groups, _ = run_expert_rollouts(env_policy, scripted, problems, EnvConfig(max_turns=6, context=ctx),
                                    expert_actions(problems))
    demos = build_env_demo_records(env_policy, problems, 6, context=ctx)
    rolled = [s for g in groups for s in build_sequences(g.trajectories[0], 0, 0, True)]
    assert len(demos) == len(rolled) > len(problems)  # the window split each episode
    for d, r in zip(demos, rolled):
        assert d.ids == r.ids and d.loss_mask == r.loss_mask and len(d.ids) == len(d.rollout_logp)


def test_append_demos_keep_one_sequence_per_episode_and_noise_changes_them(env_policy):
    problems = make_problems("shop", 20, 2)
    clean = build_env_demo_records(env_policy, problems, 6)
    assert len(clean) == 20 and clean == build_env_demo_records(env_policy, problems, 6, noise=0.5)  # no rng: no noise
    noisy = build_env_demo_records(env_policy, problems, 6, noise=0.5, rng=random.Random(0))
    changed = sum(a.ids != b.ids for a, b in zip(clean, noisy))
    assert 3 <= changed <= 17
