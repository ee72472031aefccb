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
here goes through the helper, and an autouse fixture (conftest.py) fails a test that refused nothing.
This module is imported by that name (`from bad_input_helpers import ...`), which no other test
folder uses: every folder's conftest.py is a module named `conftest`.

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
        command line would print as one line with exit code 2 (tether.commands.common.describe_error)."""
        from tether.commands.common import describe_error
        from tether.errors import UserError

        with pytest.raises(exc or UserError) as info:
            fn(*args, **kwargs)
        message, code = describe_error(info.value)
        assert code == 2, f"{type(info.value).__name__} would exit {code}, not 2: {message}"
        self.check(message, field, *fragments)
        return info.value


def params(table: Sequence[tuple]) -> list:
    """pytest parameters of a table of cases `(id, *values)`."""
    return [pytest.param(*case[1:], id=case[0]) for case in table]


def write(path: Path, content: str | bytes) -> str:
    """Write a file (parents made) and return its path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


STRICT_TEMPLATE = (  # refuses a system message, as Llama-2 / Mistral-style templates do
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


class Models:
    """Saved tiny Hugging Face directories, built on first use (a fraction of a second each)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def _get(self, name: str, build) -> str:
        if name not in self._built:
            out = self.root / name
            build(out)
            self._built[name] = out
        return str(self._built[name])

    @staticmethod
    def _build(out: Path, corpus=None, vocab: int = 96, hidden: int = 16, template: str | None = "chatml",
               head: str | None = None, labels: int = 1) -> None:
        from tether.config import TinyModelConfig
        from tether.policy.tiny import build_tiny_model, build_tokenizer

        tok = build_tokenizer(corpus or [f"{a}+{b}={a + b}" for a in range(20) for b in range(20)], vocab)
        if template is None:
            tok.chat_template = None
        elif template != "chatml":
            tok.chat_template = template
        tiny = TinyModelConfig(hidden_size=hidden, num_layers=1, num_heads=2, intermediate_size=32)
        model = build_tiny_model(tiny, tok)
        if head is not None:  # a classifier on the same backbone (a reward model when labels=1)
            from transformers import LlamaForSequenceClassification

            model.config.num_labels = labels
            model.config.pad_token_id = tok.pad_token_id
            model = LlamaForSequenceClassification(model.config)
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
        if template is None:  # transformers writes no template file; make sure none is left in the config either
            (out / "chat_template.jinja").unlink(missing_ok=True)
            cfg = json.loads((out / "tokenizer_config.json").read_text())
            cfg.pop("chat_template", None)
            (out / "tokenizer_config.json").write_text(json.dumps(cfg))

    @property
    def chat(self) -> str:  # the tiny model as tether builds it (ChatML template)
        return self._get("chat", self._build)

    @property
    def plain(self) -> str:  # no chat template (a base model)
        return self._get("plain", lambda o: self._build(o, template=None))

    @property
    def strict(self) -> str:  # a template that refuses system messages
        return self._get("strict", lambda o: self._build(o, template=STRICT_TEMPLATE))

    @property
    def other_vocab(self) -> str:  # another tokenizer (a vocabulary trained on other text)
        return self._get("other_vocab", lambda o: self._build(o, ["hello world, the quick brown fox"] * 50, vocab=300))

    @property
    def wider(self) -> str:  # the same tokenizer, another hidden size
        return self._get("wider", lambda o: self._build(o, hidden=24))

    @property
    def reward(self) -> str:  # a one-label *ForSequenceClassification (what `tether rm` saves)
        return self._get("reward", lambda o: self._build(o, head="seq"))

    @property
    def classifier(self) -> str:  # three labels: a classifier, not a reward model
        return self._get("classifier", lambda o: self._build(o, head="seq", labels=3))
