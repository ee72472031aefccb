"""A reward function that raises for some completions (used by the recipe tests)."""


def reward(text, task, **kwargs):
    if int(str(task["id"]).rsplit("-", 1)[-1]) % 4 == 0:  # a quarter of the problems
        raise RuntimeError("flaky reward: cannot score this one")
    return float(text == task["answer"])


def letter_fraction(text, task, **kwargs):
    """Dense, easy signal for smoke tests: the fraction of characters in 'abcdefgh'."""
    return sum(c in "abcdefgh" for c in text) / max(len(text), 1)


def starts_with_letter(text, task, **kwargs):
    """Binary and about even on a random model: some groups all 0 or all 1 (no GRPO signal), some mixed."""
    return float(text[:1] in "abcdefghijklm")
