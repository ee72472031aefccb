"""Fixtures of tests/unit/bad_input (the helpers themselves: bad_input_helpers.py).

`bad_input` runs bad input through a surface and checks the refusal; an autouse fixture fails a test
that refused nothing through it; `models` builds saved tiny model directories on first use.
"""

from __future__ import annotations

import pytest
from bad_input_helpers import BadInput, Models


@pytest.fixture
def bad_input(request) -> BadInput:
    return BadInput(request.node.nodeid)


@pytest.fixture(autouse=True)
def _each_test_refuses_through_the_helper(request):
    """A test here that recorded no refusal checked nothing that the traceback scan could see."""
    yield
    if request.node.get_closest_marker("no_refusal"):
        return
    helper = request.node.funcargs.get("bad_input")
    assert helper is not None, f"{request.node.nodeid} does not take the bad_input fixture"
    assert helper.records, f"{request.node.nodeid} recorded no refusal through bad_input"


def pytest_configure(config):
    config.addinivalue_line("markers", "no_refusal: a test of tests/unit/bad_input that checks the suite itself")


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("models"))
