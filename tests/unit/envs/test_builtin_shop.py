"""The web shop (WebShop-like): catalog and BM25 search, attribute-match reward, the expert and
its weak-teacher mistakes, and the batched rollout."""

from __future__ import annotations

import random

import pytest
from builtin_helpers import run_expert_rollouts

from tether.envs import Action, make_env, run_expert_episode
from tether.envs.builtin.shop import build_catalog, compute_match, run_search
from tether.tasks import make_problems, make_splits


def _env(task):
    env = make_env(task)
    env.reset()
    return env


def _do(env, text):
    return env.step(Action(text=text))


def test_catalog_tasks_and_splits_are_deterministic():
    cat = build_catalog()
    assert len(cat) == 120 and len({p["title"] for p in cat}) == 120 and cat == build_catalog(0)
    assert make_problems("shop", 30, 0) == make_problems("shop", 30, 0)
    for p in make_problems("shop", 50, 1):
        product = next(x for x in cat if x["id"] == p["product"])
        assert p["color"] in product["colors"] and p["size"] in product["sizes"] and product["price"] <= p["budget"]
    train, held = make_splits("shop", 400, 50, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_search_finds_each_product_by_its_title():
    for p in build_catalog():
        hits = run_search(p["title"])
        assert hits[0]["id"] == p["id"] and len(hits) == 3
    assert run_search("the") == [] and run_search("zzz") == []


def test_reward_is_attribute_match():
    task = make_problems("shop", 1, 2)[0]
    env = _env(task)
    assert "$" in _do(env, f"search[{task['material']} {task['type']}]").observation.messages[0].content
    assert _do(env, "buy[red, M]").observation.messages[0].content == "Open a product first."
    page = _do(env, f"open[{task['product']}]").observation.messages[0].content
    assert page.startswith(task["product"]) and "colors:" in page
    last = _do(env, f"buy[{task['color']}, {task['size'].lower()}]")
    assert last.done and last.reward == 1.0 and last.info["correct"]
    product = next(x for x in build_catalog() if x["id"] == task["product"])
    other = next(c for c in product["colors"] if c != task["color"])
    checks = compute_match(task, product, other, task["size"])
    assert sum(checks.values()) == 4 and not checks["color"]
    env = _env(task)
    _do(env, f"open[{task['product']}]")
    near = _do(env, f"buy[{other}, {task['size']}]")
    assert near.done and near.reward == pytest.approx(0.8) and not near.info["correct"]


def test_bad_actions_are_observations_not_errors():
    env = _env(make_problems("shop", 1, 3)[0])
    assert _do(env, "hello").observation.messages[0].content.startswith("Unknown action")
    assert _do(env, "open[p999]").observation.messages[0].content == "No product p999."
    assert not _do(env, "search[]").done


def test_expert_and_weak_teacher():
    problems = make_problems("shop", 80, 4)
    assert all(run_expert_episode(p)[2].info["correct"] for p in problems)
    rng = random.Random(0)
    wrong = [run_expert_episode(p, noise=1.0, rng=rng)[2] for p in problems]
    assert not any(w.info["correct"] for w in wrong) and all(0 < w.reward < 1 for w in wrong)
    kinds = {w.info["match_material"] + w.info["match_type"] for w in wrong}
    assert 2 in kinds and 1 in kinds  # wrong colors on the right product, and wrong products


def test_expert_through_the_batched_rollout(env_policy, scripted):
    problems = make_problems("shop", 4, 5)
    groups, m = run_expert_rollouts(env_policy, scripted, problems)
    assert m["env/success_rate"] == 1.0 and m["env/stop/done"] == 1.0 and m["env/turns_mean"] == 3
    assert all(g.trajectories[0].reward.total == 1.0 for g in groups)
