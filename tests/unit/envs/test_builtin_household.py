"""The text household world (ALFWorld-like): command semantics, goal check, the expert and its
weak-teacher mistakes, and the batched rollout."""

from __future__ import annotations

import random

from builtin_helpers import run_expert_rollouts

from tether.config import EnvConfig
from tether.envs import Action, make_env, run_expert_episode
from tether.envs.builtin.household import CLOSED, OPEN, World
from tether.tasks import make_problems, make_splits

TASK = {"env": "household", "id": "h", "receptacles": ["table", "fridge", "shelf", "drawer"],
        "layout": {"table": ["apple", "key"], "fridge": [], "shelf": ["mug"], "drawer": []},
        "object": "apple", "goal": "fridge", "answer": "apple fridge", "prompt": "p"}


def _play(env, *commands):
    return [env.step(Action(text=c)) for c in commands]


def test_tasks_are_deterministic_held_out_and_well_formed():
    a = make_problems("household", 50, 0)
    assert a == make_problems("household", 50, 0) and a != make_problems("household", 50, 1)
    for p in a:
        assert len(p["receptacles"]) == 4 and p["goal"] != next(r for r, v in p["layout"].items() if p["object"] in v)
        assert all(not v for r, v in p["layout"].items() if r in CLOSED)  # objects lie on open receptacles
        assert p["prompt"].startswith("You see: ") and p["prompt"].endswith(f"the {p['goal']}.")
        source = next(r for r, v in p["layout"].items() if p["object"] in v)
        assert f"The {p['object']} is on the {source}." in p["prompt"]
    train, held = make_splits("household", 300, 50, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_commands_follow_alfworld_rules():
    w = World(TASK)
    assert w.describe() == "You see: table, fridge (closed), shelf, drawer (closed)."
    assert w.apply("take apple") == "Nothing happens."  # not at the table yet
    assert w.apply("go to table") == "At the table: apple, key."
    assert w.apply("put apple in table") == "Nothing happens."  # not holding it
    assert w.apply("take the apple from the table") == "You hold the apple."
    assert w.apply("take key") == "Nothing happens."  # hands full
    assert w.apply("go to fridge") == "At the fridge. It is closed."
    assert w.apply("put apple in fridge") == "Nothing happens."  # closed
    assert w.apply("open fridge") == "The fridge is open: nothing."
    assert w.apply("open fridge") == "Nothing happens."
    assert w.apply("Put the apple in the fridge.") == "You put the apple in the fridge."
    assert w.placed == ("apple", "fridge") and w.apply("dance") == "Nothing happens."
    assert w.apply("go to garage") == "Nothing happens."
    assert set(OPEN).isdisjoint(CLOSED)


def test_goal_check_ends_the_episode():
    env = make_env(TASK)
    env.reset()
    *_, last = _play(env, "go to table", "take apple", "go to fridge", "open fridge", "put apple in fridge")
    assert last.done and last.reward == 1.0 and last.info["correct"]
    env = make_env(TASK)
    env.reset()
    steps = _play(env, "go to table", "take key", "go to shelf", "put key on shelf")
    assert not any(s.done for s in steps)  # another object put down: the task goes on
    *_, last = _play(env, "go to table", "take apple", "go to shelf", "put apple on shelf")
    assert last.done and last.reward == 0.0 and not last.info["correct"]


def test_expert_solves_every_task_in_at_most_five_commands():
    for p in make_problems("household", 100, 2):
        history, _, last = run_expert_episode(p)
        assert last.info["correct"] and sum(m.role == "assistant" for m in history) <= 5


def test_weak_teacher_puts_the_object_in_a_wrong_place():
    problems = make_problems("household", 60, 3)
    rng = random.Random(0)
    for p in problems:
        history, _, last = run_expert_episode(p, noise=1.0, rng=rng)
        assert last.done and not last.info["correct"]
        assert f"go to {p['goal']}" not in [m.content for m in history if m.role == "assistant"]
    ok = [run_expert_episode(p, noise=0.4, rng=rng)[2].info["correct"] for p in problems]
    assert 0.4 < sum(ok) / len(ok) < 0.8


def test_expert_through_the_batched_rollout(env_policy, scripted):
    problems = make_problems("household", 4, 4)
    groups, m = run_expert_rollouts(env_policy, scripted, problems, EnvConfig(max_turns=6))
    assert m["env/success_rate"] == 1.0 and m["env/stop/done"] == 1.0 and m["env/tool_calls"] == 0
    assert m["rollout/tokenization_drift_count"] == 0
