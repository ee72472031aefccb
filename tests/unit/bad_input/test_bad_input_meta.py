"""The suite checks itself: every test in tests/unit/bad_input goes through the `bad_input` helper,
so every refusal it provokes is scanned for tracebacks (conftest.py), on whichever xdist worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _tests(tree: ast.Module):
    """(name, argument names, marker names) of every test function, also inside test classes."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            marks = {ast.unparse(d).split("(")[0].removeprefix("pytest.mark.") for d in node.decorator_list}
            yield node.name, [a.arg for a in node.args.args], marks


@pytest.mark.no_refusal
def test_every_bad_input_test_takes_the_helper():
    files = sorted(HERE.glob("test_*.py"))
    assert len(files) >= 2, files
    missing = [f"{f.name}::{name}" for f in files for name, args, marks in _tests(ast.parse(f.read_text()))
               if "bad_input" not in args and "no_refusal" not in marks]
    assert not missing, f"tests that do not take the bad_input fixture (their refusals go unscanned): {missing}"


def test_the_helper_catches_what_it_must(bad_input):
    """The checks themselves: a traceback, a second line, an unnamed field, a wrong exit code all fail."""
    bad_input.check("data.path=x.jsonl: file not found", "data.path")
    for message, field in [("boom (an internal error; rerun with --debug)", "boom"),
                           ('Traceback (most recent call last):\n  File "x.py"', "x.py"),
                           ("first line\nsecond line", "first"), ("nothing named here", "data.path"), ("", "x")]:
        with pytest.raises(AssertionError):
            bad_input.check(message, field)
    with pytest.raises(AssertionError, match="exit code 0"):
        bad_input.cli(["--help"], "x")
