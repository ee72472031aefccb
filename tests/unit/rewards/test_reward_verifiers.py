"""Hand-checked values for the verifier built-ins and the answer-extraction helpers."""

from __future__ import annotations

import pytest

from tether.rewards import REWARD_FUNCTIONS, extract_answer, parse_final_number

exact_match = REWARD_FUNCTIONS["exact_match"]
numeric = REWARD_FUNCTIONS["numeric"]
math_verify = REWARD_FUNCTIONS["math_verify"]


def task(answer: object) -> dict:
    return {"prompt": "q", "answer": answer}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("reasoning <answer> 42 </answer>", "42"),
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),  # DOTALL
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # last block
        ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),  # nested braces balanced
        ("\\boxed{3} and finally \\boxed{4}", "4"),
        ("\\boxed{5", None),  # unbalanced (cut off) and nothing else: no answer
        ("so 3 + 4 = 7\n#### 7\n", "7"),  # GSM8K
        ("#### 1,234.", "1,234"),  # trailing period stripped
        ("The answer is 12.", "12"),
        ("Answer: $x+1$", "x+1"),
        ("the answer depends on x", None),  # prose, not a statement of the answer
        ("no convention here", None),
        ("<answer>7</answer> \\boxed{8}", "7"),  # tags win over boxed
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1, 2 and 3", 3.0),  # a list is not a thousands-separated number
        ("total 1,234.5 apples", 1234.5),
        ("-7", -7.0),
        ("3/4", 0.75),
        ("x = 1.5e-3", 0.0015),
        ("about .5", 0.5),
        ("1/0", None),
        ("none", None),
    ],
)
def test_parse_final_number(text: str, expected: float | None) -> None:
    assert parse_final_number(text) == expected


def test_exact_match_values() -> None:
    assert exact_match("  7 \n", task("7")) == 1.0  # no convention: the stripped text
    assert exact_match("8", task("7")) == 0.0
    assert exact_match("I think <answer>7</answer>", task("7")) == 1.0
    assert exact_match("Answer: Paris", task("paris")) == 0.0  # case-sensitive by default
    assert exact_match("Answer: Paris", task("paris"), ignore_case=True) == 1.0
    assert exact_match("#### 18", task("Janet sells 16 - 3 - 4 = 9 eggs...\n#### 18")) == 1.0  # gold reduced too
    assert exact_match("17", task(17)) == 1.0  # non-string gold


def test_exact_match_without_answer_field_raises() -> None:
    with pytest.raises(KeyError, match="no 'answer'"):
        exact_match("1", {"prompt": "q"})


def test_numeric_values() -> None:
    assert numeric("The answer is 1,000.", task("1000")) == 1.0
    assert numeric("<answer>0.5</answer>", task("1/2")) == 1.0
    assert numeric("steps 3, 4 ... final 12", task("12")) == 1.0  # last number of the text
    assert numeric("12.0001", task("12")) == 0.0  # default tolerance is tight
    assert numeric("12.0001", task("12"), rel_tol=1e-3) == 1.0  # |d| = 1e-4 <= 1e-3 * 12
    assert numeric("12.0001", task("12"), abs_tol=1e-3) == 1.0
    assert numeric("no number", task("3")) == 0.0  # a wrong completion, not an error
    assert numeric("3", task(3)) == 1.0


def test_numeric_gold_without_number_raises() -> None:
    with pytest.raises(ValueError, match="no number in the gold answer"):
        numeric("3", task("three"))


@pytest.mark.parametrize(
    "text, gold, expected",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is 0.5", "\\frac{1}{2}", 1.0),  # bare LaTeX gold parsed inside $...$
        ("<answer>1/2</answer>", "0.5", 1.0),  # the answer block is what gets parsed
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{2x+2}", "2(x+1)", 1.0),  # symbolic equality
        ("I don't know", "0.5", 0.0),  # nothing parseable: wrong, not an error
    ],
)
def test_math_verify_values(text: str, gold: str, expected: float) -> None:
    assert math_verify(text, task(gold)) == expected


def test_math_verify_unparseable_gold_raises() -> None:
    with pytest.raises(ValueError, match="cannot parse the gold answer"):
        math_verify("\\boxed{1}", task("\\boxed{"))
