"""Property-based tests (hypothesis) of the override parser and the row readers: no generated input
crashes them, whatever they accept means what it must, and every refusal is a one-line user error
(exit code 2) that names its field. Bounded for CI: few examples, no deadline, derandomized (the same
examples on every run), no example database written to the repository."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.errors import UserError

BOUNDED = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                                    HealthCheck.too_slow])
MARKERS = ("Traceback", 'File "', "internal error")  # a user's value may not contain them (the scan would see them)


def _config_keys() -> list[str]:
    """Every dotted key of the config's sections (the real fields an override addresses)."""
    from pydantic import BaseModel

    from tether.config import TetherConfig

    out = []

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            else:
                out.append(prefix + name)

    walk(TetherConfig, "")
    return out


KEYS = _config_keys()
SEGMENT = st.one_of(st.sampled_from(["train", "steps", "lr", "0", "1", "components", "name", "kwargs", "x"]),
                    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6))
KEY = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS), st.lists(SEGMENT, min_size=1, max_size=4).map(".".join),
                st.sampled_from(KEYS).flatmap(lambda k: st.sampled_from([f"{k}.0", f"{k}.x", k + "."])))
VALUE = st.one_of(
    st.sampled_from(["", "[", "{", "[1,", "{a: 1", "null", "~", "-1", "0", "1e9", "true", "[1, 2]", "{a: b}", "'x'",
                     "2024-01-01", ":", "a:b", "!!python/object:os.system", "[{name: exact_match}]", "&a [*a]",
                     "{name: exact_match, weight: -1}", "nan", ".inf", "[[[[", "\x00", "é"]),
    st.integers().map(str), st.floats().map(repr),
    st.text(max_size=24)).filter(lambda v: not any(m in v for m in MARKERS))


def _names_a_prefix(message: str, key: str) -> bool:
    parts = [p.strip() for p in key.split(".")]
    prefixes = [".".join(parts[:k]) for k in range(len(parts), 0, -1)]
    return any(p in message or repr(p)[1:-1] in message for p in prefixes if p) or not any(parts)


@settings(max_examples=150, **BOUNDED)
@given(key=KEY, value=VALUE, with_equals=st.booleans())
def test_override_parser(bad_input, key, value, with_equals):
    from tether.config import load_config

    text = f"{key}={value}" if with_equals else key
    try:
        load_config(None, [text])
    except UserError as err:
        message = bad_input.check(" ".join(str(err).split()), "")  # one line, no traceback; field below
        assert _names_a_prefix(message, key if with_equals else text), (text, message)


# ----------------------------------------------------------------------------- rows


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
JSONISH = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                          max_size=3), max_leaves=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "human", None, 3])},
                                optional={"content": st.one_of(st.text(max_size=12), st.none(), st.lists(
                                    st.one_of(st.text(max_size=5), st.fixed_dictionaries(
                                        {"type": st.sampled_from(["text", "image"]), "text": st.text(max_size=5)})),
                                    max_size=2)), "from": st.sampled_from(["human", "gpt", "bot"]),
                                    "value": st.text(max_size=8)})
GOOD_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=12)})
PROMPT = st.one_of(st.text(min_size=1, max_size=20), st.lists(GOOD_MESSAGE, min_size=1, max_size=2),  # mostly readable
                   st.lists(MESSAGE, max_size=3), st.lists(MESSAGE, max_size=3).map(json.dumps), JSONISH)
WORD = st.text(alphabet="abcxyz0123456789 .-", min_size=1, max_size=6).filter(str.strip)
GOLD = st.one_of(WORD, st.integers(), st.lists(WORD, min_size=1, max_size=3),  # mostly readable
                 st.fixed_dictionaries({"target": st.lists(WORD, min_size=1, max_size=3)}),
                 JSONISH, JSONISH.map(json.dumps), st.fixed_dictionaries({"target": JSONISH}),
                 st.lists(st.text(max_size=6), min_size=1, max_size=3).map(json.dumps))


def _check_problem(p: dict) -> None:
    """What an accepted row must mean: text prompt, chat messages with known roles, text gold answers."""
    from tether.tasks.fields import ROLES

    assert isinstance(p["prompt"], str) and isinstance(p["id"], str)
    for m in p.get("messages") or []:
        assert m["role"] in ROLES and isinstance(m["content"], str)
    golds = p["gold_answers"]
    assert golds and all(isinstance(g, str) and g.strip() for g in golds) and p["answer"] == golds[0]


@settings(max_examples=300, **BOUNDED)
@given(prompt=PROMPT, gold=GOLD, verl=st.booleans())
def test_row_reader(bad_input, prompt, gold, verl):
    """verl rows (`reward_model.ground_truth`) and flat rows (`answer`), any values."""
    from tether.tasks.hf import make_problem

    row = {"prompt": prompt, **({"reward_model": {"ground_truth": gold}} if verl else {"answer": gold})}
    try:
        problem = make_problem(row, "d.parquet: row 3", 3, "prompt", "answer", "d")
    except UserError as err:
        field = "prompt" if "prompt" in str(err).split("row 3: ", 1)[-1][:8] else (
            "reward_model.ground_truth" if verl else "answer")
        bad_input.check(" ".join(str(err).split()), "d.parquet: row 3", field)
        return
    _check_problem(problem)


SCHEMA_ROWS = {  # parquet needs one type per column: one layout per file
    "text gold": st.text(max_size=8), "numeric gold": st.floats(allow_nan=True, allow_infinity=True),
    "list gold": st.lists(st.text(max_size=6), max_size=3),
    "target gold": st.fixed_dictionaries({"target": st.lists(st.text(max_size=6), max_size=3)}),
}


@settings(max_examples=12, **BOUNDED)
@given(kind=st.sampled_from(sorted(SCHEMA_ROWS)), data=st.data(), chat=st.booleans())
def test_parquet_reader(bad_input, kind, data, chat):
    """The same through datasets and pyarrow: a generated parquet file, read whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tether.tasks.hf import load_problems

    golds = data.draw(st.lists(SCHEMA_ROWS[kind], min_size=1, max_size=4))
    texts = data.draw(st.lists(st.text(max_size=10), min_size=len(golds), max_size=len(golds)))
    prompts = [[{"role": "user", "content": t}] for t in texts] if chat else texts
    rows = [{"prompt": p, "reward_model": {"ground_truth": g}} for p, g in zip(prompts, golds)]
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "d.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        try:
            problems = load_problems(path)
        except UserError as err:
            bad_input.check(" ".join(str(err).split()), "d.parquet: row ")
            return
    for p in problems:
        _check_problem(p)


@settings(max_examples=12, **BOUNDED)
@given(rows=st.lists(st.fixed_dictionaries({"prompt": PROMPT, "answer": GOLD}), min_size=1, max_size=2))
def test_jsonl_through_datasets(bad_input, rows):
    """Rows of any JSON through `datasets`' json builder (which may infer no schema at all)."""
    from tether.tasks.hf import load_problems

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            problems = load_problems(str(path))
        except UserError as err:
            bad_input.check(" ".join(str(err).split()), "d.jsonl")
            return
    for p in problems:
        _check_problem(p)
