"""Format and length rewards, including the adversarial probes of docs/design.md, correctness rule 16."""

from __future__ import annotations

import pytest

from tether.rewards import REWARD_FUNCTIONS, check_format

fmt = REWARD_FUNCTIONS["format"]
length = REWARD_FUNCTIONS["length"]
TASK = {"prompt": "q", "answer": "4"}


@pytest.mark.parametrize(
    "text",
    [
        "<answer>4</answer>",
        "Let me add 2 and 2.\nThat is 4.\n<answer>4</answer>\n",  # free reasoning before the block
        "<think>2+2\n=4</think>\n<answer>\n4\n</answer>",  # multi-line (DOTALL, unsloth#1761)
    ],
)
def test_well_formed_scores_one(text: str) -> None:
    assert check_format(text) == ""
    assert fmt(text, TASK) == 1.0


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<think></think>a", "exactly one <answer>"),  # Soup#814 probe
        ("<answer>4</answer><answer>5</answer>", "exactly one <answer>"),  # open-r1 PR#418
        ("<answer>4</answer>\n<answer>4</answer>", "exactly one <answer>"),
        ("<answer></answer>", "empty <answer>"),
        ("<answer>  \n </answer>", "empty <answer>"),
        ("<answer>4</answer> and more text", "after </answer>"),
        ("<answer>4</answer><|endoftext|>junk", "after </answer>"),  # scored past the stop token
        ("</answer>4<answer>", "out of order"),
        ("<answer>4", "exactly one <answer>"),  # cut off
        ("<think></think><answer>4</answer>", "empty <think>"),
        ("<think>a</think><think>b</think><answer>4</answer>", "at most one <think>"),
        ("<think>a</think> chatter <answer>4</answer>", "out of order"),
        ("intro <think>a</think><answer>4</answer>", "out of order"),
        ("<answer>4</answer><think>late</think>", "out of order"),
        ("4", "exactly one <answer>"),
    ],
)
def test_adversarial_probes_score_zero(text: str, reason: str) -> None:
    assert reason in check_format(text)
    assert fmt(text, TASK) == 0.0


def test_require_think() -> None:
    assert fmt("<answer>4</answer>", TASK, require_think=True) == 0.0
    assert "missing <think>" in check_format("<answer>4</answer>", require_think=True)
    assert fmt("<think>2+2</think><answer>4</answer>", TASK, require_think=True) == 1.0


def test_custom_pattern_is_fullmatch_dotall_with_nonblank_answer() -> None:
    pattern = r"Reasoning:.*\nFinal: (?P<answer>.*)"
    assert fmt("Reasoning: a\nb\nFinal: 4", TASK, pattern=pattern) == 1.0  # DOTALL spans lines
    assert fmt("Reasoning: a\nFinal:  ", TASK, pattern=pattern) == 0.0  # blank answer group
    assert fmt("Preamble Reasoning: a\nFinal: 4", TASK, pattern=pattern) == 0.0  # whole text must match


def test_length_penalty_values() -> None:
    assert length("x" * 10, TASK, max_len=100) == pytest.approx(-0.1)
    assert length("x" * 10, TASK, max_len=100, free_len=20) == 0.0
    assert length("x" * 60, TASK, max_len=100, free_len=20) == pytest.approx(-0.5)  # 40 of 80
    assert length("x" * 500, TASK, max_len=100) == -1.0  # clamped
    assert length("a b c d", TASK, max_len=8, unit="words") == pytest.approx(-0.5)


def test_length_bad_kwargs_raise() -> None:
    with pytest.raises(ValueError, match="unit must be one of"):
        length("x", TASK, unit="tokens")
    with pytest.raises(ValueError, match="must exceed free_len"):
        length("x", TASK, max_len=5, free_len=5)
