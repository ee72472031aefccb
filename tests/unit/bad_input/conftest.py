"""The bad-input suite's one helper: run a surface on bad input and check the refusal.

Every test in this folder takes the `bad_input` fixture and sends each bad input through it:

    def test_missing_teacher(bad_input, tmp_path):
        bad_input.cli(["pipeline", cfg, "--run-dir", str(tmp_path / "run")], field="distill.teacher")
        bad_input.call(read_state_dict, str(tmp_path), field="merge.models", exc=ConfigError)
        bad_input.check(response.json()["error"]["message"], field="messages[0].role")  # any other surface

Each refusal must be one line that names `field` (and every `fragment`), carry no traceback
("Traceback", 'File "', "internal error") and, for the command line, exit with code 2 and print
exactly one `tether: error:` line. The check runs inside the test that made the refusal, so it
holds under pytest-xdist whatever worker runs it; `test_bad_input_meta.py` checks that every test
here goes through the helper, and the autouse fixture below fails a test that refused nothing.

Set TETHER_BAD_INPUT_LOG=path.jsonl to collect every recorded message (test id, field, message):
docs/errors.md's message columns were read off that log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[3]
TRACEBACK_MARKERS = ("Traceback", 'File "', "internal error")
# The tiny model's settings for commands that get as far as building one (a few seconds, never trained).
TINY = ["model.tiny.hidden_size=16", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=32", "model.tiny.vocab_size=96", "logging.progress=false",
        "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "data.train_size=16", "data.eval_size=4",
        "eval.samples=1", "eval.problems=2", "rollout.problems_per_step=2", "rollout.n=2",
        "rollout.sampling.max_new_tokens=4", "eval.sampling.max_new_tokens=4", "train.steps=1",
        "reward.isolation=inline", "sft.steps=1"]


def find_traceback_marker(text: str) -> str | None:
    """The first marker of a traceback or of an "internal error" in `text`, else None."""
    return next((m for m in TRACEBACK_MARKERS if m in text), None)


@dataclass
class BadInput:
    """Runs bad input through a surface and checks the refusal (see the module docstring)."""

    test_id: str
    records: list[dict[str, Any]] = dc_field(default_factory=list)

    def check(self, message: str, field: str, *fragments: str, output: str | None = None) -> str:
        """Record a refusal `message` (one line naming `field` and every fragment); `output`: all the
        text the surface printed (stderr, logs), scanned for tracebacks too."""
        assert message.strip(), f"an empty refusal (field {field!r})"
        assert "\n" not in message.strip(), f"a refusal of more than one line: {message!r}"
        assert field in message, f"the refusal does not name the field {field!r}: {message!r}"
        for frag in fragments:
            assert frag in message, f"the refusal lacks {frag!r}: {message!r}"
        for text in (message, output or ""):
            marker = find_traceback_marker(text)
            assert marker is None, f"a refusal shows {marker!r} (a traceback or an internal error): {text[-2000:]}"
        record = {"test": self.test_id, "field": field, "message": message.strip()}
        self.records.append(record)
        log = os.environ.get("TETHER_BAD_INPUT_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return message.strip()

    def cli(self, argv: Sequence[str], field: str, *fragments: str, code: int = 2) -> str:
        """`tether ARGV` in this process (typer's runner): exit `code`, one `tether: error:` line."""
        from typer.testing import CliRunner

        from tether.cli import app

        result = CliRunner().invoke(app, [str(a) for a in argv])
        out = result.output
        assert result.exit_code == code, f"exit code {result.exit_code}, expected {code}: {out[-3000:]}"
        errors = [line for line in out.splitlines() if line.startswith("tether: error:")]
        assert len(errors) == 1, f"expected one 'tether: error:' line: {out[-3000:]}"
        return self.check(errors[0].removeprefix("tether: error:").strip(), field, *fragments, output=out)

    def process(self, argv: Sequence[str], field: str, *fragments: str, cwd: Path, code: int = 2) -> str:
        """`python -m tether.cli ARGV` as a real process: stderr holds that one line and nothing else."""
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "tether.cli", *map(str, argv)], capture_output=True, text=True,
                           cwd=cwd, env=env, timeout=300)
        assert r.returncode == code, f"exit code {r.returncode}, expected {code}: {r.stderr[-3000:]}"
        lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("(removed")]
        assert len(lines) == 1 and lines[0].startswith("tether: error:"), f"stderr is not one error line: {r.stderr[-3000:]}"
        return self.check(lines[0].removeprefix("tether: error:").strip(), field, *fragments, output=r.stderr + r.stdout)

    def call(self, fn: Callable[..., Any], *args: Any, field: str, fragments: Sequence[str] = (),
             exc: type[BaseException] | None = None, **kwargs: Any) -> BaseException:
        """`fn(*args, **kwargs)` must raise a user error (`exc`, default tether.errors.UserError) that the
        command line would print as one line with exit code 2 (tether.cli.describe_error)."""
        from tether.cli import describe_error
        from tether.errors import UserError

        with pytest.raises(exc or UserError) as info:
            fn(*args, **kwargs)
        message, code = describe_error(info.value)
        assert code == 2, f"{type(info.value).__name__} would exit {code}, not 2: {message}"
        self.check(message, field, *fragments)
        return info.value


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


def write(path: Path, content: str | bytes) -> str:
    """Write a file (parents made) and return its path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)
