"""Built-in task generators whose demonstrations have structure the stages rely on."""

import pytest

from tether.rewards.verifiers import exact_match_reward as exact_match
from tether.tasks import DataError, demonstration, make_problems


def test_reverse_think_trace_length_is_drawn_and_the_answer_follows_hashes():
    probs = make_problems("reverse_think", 200, seed=0, kwargs={"think_min": 1, "think_max": 3})
    assert {p["think"] for p in probs} == {1, 2, 3}
    p = {"prompt": "reverse abc:", "answer": "cba", "think": 2}
    assert demonstration("reverse_think", p) == "cba ; cba ; #### cba"
    assert demonstration("reverse_think", p | {"think": 0}) == "#### cba"
    # only the final answer is verified: a long and a short completion score the same
    assert exact_match("cba ; cba ; #### cba", p) == exact_match("#### cba", p) == 1.0
    assert exact_match("cba ; #### abc", p) == 0.0


def test_reverse_think_prompts_do_not_depend_on_the_trace_setting():
    """A stage that asks for short demonstrations (think 0) sees the same problems as the long one."""
    long = make_problems("reverse_think", 50, seed=3, kwargs={"think_min": 1, "think_max": 3})
    short = make_problems("reverse_think", 50, seed=3, kwargs={"think_min": 0, "think_max": 0})
    assert [p["prompt"] for p in long] == [p["prompt"] for p in short]
    assert {p["think"] for p in short} == {0}


def test_reverse_think_bad_range_names_the_kwargs():
    with pytest.raises(DataError, match="task_kwargs"):
        make_problems("reverse_think", 5, seed=0, kwargs={"think_min": 3, "think_max": 1})
