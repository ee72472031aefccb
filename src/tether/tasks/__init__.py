"""Single-turn verifiable tasks: built-in generators and a JSONL loader.

A problem is a plain dict: {"id": str, "prompt": str, "answer": str, ...}. Built-in tasks also
write demonstrations (the completion an expert would give) for the SFT cold start, and a text
corpus used to train the tiny model's tokenizer. Multi-turn environments live in `tether.envs`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from tether.errors import UserError
from tether.registry import Registry, import_object


class DataError(UserError, ValueError):
    """Malformed task data; the message names the file and line."""


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task: problem generator, expert demonstration and default reward."""

    name: str
    make_problem: Callable[[random.Random, int, dict[str, Any]], dict[str, Any]]
    demonstration: Callable[[dict[str, Any]], str]
    default_reward: str = "exact_match"
    description: str = ""


TASKS: Registry[Callable[[], TaskSpec]] = Registry("task")
# How a `package.module:factory` spec other than a TaskSpec is registered: (name, spec) -> whether it
# was one of theirs. `tether.envs` adds the EnvSpec handler when it is imported (tasks sit below envs).
SPEC_HANDLERS: list[Callable[[str, Any], bool]] = []


def _arith_problem(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    digits = int(kw.get("digits", 2))
    ops = list(kw.get("ops", ["+"]))
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"id": f"arith-{i}", "prompt": f"{a}{op}{b}=", "answer": str(value)}


@TASKS.register("arith")
def arith_task() -> TaskSpec:
    """Integer arithmetic, e.g. prompt "37+48=" -> "85". kwargs: digits (2), ops (["+"])."""
    return TaskSpec("arith", _arith_problem, lambda p: p["answer"], "exact_match", "integer arithmetic")


def _count_problem(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    letters = kw.get("alphabet", "abc")
    n = rng.randint(int(kw.get("min_len", 4)), int(kw.get("max_len", 12)))
    word = "".join(rng.choice(letters) for _ in range(n))
    target = rng.choice(letters)
    return {"id": f"count-{i}", "prompt": f"count {target} in {word}:", "answer": str(word.count(target))}


@TASKS.register("count")
def count_task() -> TaskSpec:
    """Count a letter in a random word, e.g. "count a in abca:" -> "2"."""
    return TaskSpec("count", _count_problem, lambda p: p["answer"], "exact_match", "letter counting")


def _reverse_problem(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    letters = kw.get("alphabet", "abcdefgh")
    n = rng.randint(int(kw.get("min_len", 3)), int(kw.get("max_len", 7)))
    word = "".join(rng.choice(letters) for _ in range(n))
    return {"id": f"reverse-{i}", "prompt": f"reverse {word}:", "answer": word[::-1]}


@TASKS.register("reverse")
def reverse_task() -> TaskSpec:
    """Reverse a random word, e.g. "reverse abcd:" -> "dcba". kwargs: alphabet, min_len, max_len."""
    return TaskSpec("reverse", _reverse_problem, lambda p: p["answer"], "exact_match", "string reversal")


def _reverse_think_problem(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    p = _reverse_problem(rng, i, kw)
    lo, hi = int(kw.get("think_min", 1)), int(kw.get("think_max", 3))
    if not 0 <= lo <= hi:
        raise ValueError(f"need 0 <= think_min <= think_max, got {lo}, {hi}")
    u = rng.random()  # one draw whatever the range, so the prompts do not depend on think_min/max
    return p | {"think": lo + min(int(u * (hi - lo + 1)), hi - lo)}


def _reverse_think_demo(p: dict[str, Any]) -> str:
    """`think` restatements of the reversed word, then `#### answer`."""
    return "".join(f"{p['answer']} ; " for _ in range(int(p.get("think", 0)))) + f"#### {p['answer']}"


@TASKS.register("reverse_think")
def reverse_think_task() -> TaskSpec:
    """String reversal with a variable-length "reasoning" trace before the answer, for long2short
    (Kimi k1.5 arXiv 2501.12599 §2.4): "reverse abc:" -> "cba ; cba ; #### cba". The expert restates
    its answer `think` times (drawn per problem from [think_min, think_max], default 1..3: the
    redundant re-checking of an over-long chain of thought) before the final answer after `####`;
    with think_max=0 it answers at once ("#### cba"). The answer is read after `####` (exact_match's
    GSM8K convention), so the trace's length is free and only the final answer is verified."""
    return TaskSpec("reverse_think", _reverse_think_problem, _reverse_think_demo, "exact_match",
                    "string reversal after a variable-length restated trace")


def make_problems(task: str, size: int, seed: int, kwargs: dict[str, Any] | None = None, split: str = "train") -> list[dict[str, Any]]:
    """`size` problems of a built-in task. Train and eval splits use disjoint seeds and the eval
    split drops prompts that also occur in train (held-out means unseen)."""
    spec = TASKS[task]()
    kw = dict(kwargs or {})
    offset = {"train": 0, "eval": 1_000_003, "pilot": 2_000_003}[split]
    rng = random.Random(seed * 7919 + offset)
    try:
        return [spec.make_problem(rng, i, kw) | {"id": f"{split}-{i}"} for i in range(size)]
    except UserError:
        raise
    except (TypeError, ValueError, KeyError, IndexError) as err:  # e.g. digits: abc
        raise DataError(f"data.task_kwargs={kw} do not fit task {task!r} ({type(err).__name__}: {err}); "
                        f"see the task's docstring (tether.tasks) for its kwargs") from None


def make_splits(task: str, train_size: int, eval_size: int, seed: int, kwargs: dict[str, Any] | None = None):
    """(train, eval) problem lists with no eval prompt present in train."""
    train = make_problems(task, train_size, seed, kwargs, "train")
    seen = {p["prompt"] for p in train}
    pool = make_problems(task, eval_size * 4 + 50, seed, kwargs, "eval")
    held_out = [p for p in pool if p["prompt"] not in seen][:eval_size]
    if len(held_out) < eval_size:
        raise DataError(f"task {task!r}: cannot draw {eval_size} held-out problems disjoint from train; shrink data.train_size or widen the task")
    return train, held_out


def load_user_task(name: str) -> None:
    """Register the task or environment of `data.task=package.module:factory` under that name.

    `factory()` returns a `TaskSpec` (single-turn) or a `tether.envs.EnvSpec` (an environment;
    also registered under its own `EnvSpec.name`, the name its problems carry in "env"). The
    module is imported from `sys.path` (PYTHONPATH): no change to tether. Idempotent."""
    if ":" not in name or name in TASKS:
        return
    factory = import_object(name, "data.task", DataError, "package.module:factory")
    if not callable(factory):
        raise DataError(f"data.task={name!r}: {name.partition(':')[2]!r} is not callable")
    try:
        spec = factory()
    except Exception as err:  # noqa: BLE001 - the user's factory (or a name that is no factory): their code
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise DataError(f"data.task={name!r}: calling the factory failed ({type(err).__name__}: {first}); it must "
                        "take no arguments and return a TaskSpec or an EnvSpec") from None
    if isinstance(spec, TaskSpec):
        TASKS.register(name)(lambda: spec)
    elif not any(handle(name, spec) for handle in SPEC_HANDLERS):
        raise DataError(f"data.task={name!r}: the factory returned {type(spec).__name__}, expected a "
                        "tether.tasks.TaskSpec or a tether.envs.EnvSpec")


def find_task_problem(name: str) -> str | None:
    """None when `data.task` names a task (built-in, a data source, package.module:factory, or an
    environment: the caller imports `tether.envs` first, which registers them and their factories)."""
    from tether.tasks.sources import is_file_task  # the data-source registry (it imports this module)

    if is_file_task(name):
        return None
    if ":" in name:
        try:
            load_user_task(name)
        except DataError as err:
            return str(err)
        return None
    return TASKS.check(name, "data.task")  # environments are tasks once tether.envs is imported


def demonstration(task: str, problem: dict[str, Any], noise: float = 0.0, rng: random.Random | None = None) -> str:
    """The scripted expert's completion; with probability `noise` one character of it is
    replaced (a weak teacher whose mistakes SFT imitates and RL on the verifier can undo)."""
    demo = TASKS[task]().demonstration(problem)
    if noise and rng is not None and demo and rng.random() < noise:
        i = rng.randrange(len(demo))
        pool = sorted(set(demo + ("0123456789" if demo[i].isdigit() else "")) - {demo[i]}) or ["x"]
        demo = demo[:i] + rng.choice(pool) + demo[i + 1:]
    return demo


def iter_jsonl(path: str | Path, setting: str = "data.path / data.eval_path") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file. A directory, a missing file,
    bytes that are not UTF-8, a line that is not JSON or not an object: DataError naming the file
    (and line), and `setting`, the config key that names the file."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{p} is a directory; {setting} name a JSONL file")
    if not p.is_file():
        raise DataError(f"{p}: file not found ({setting})")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{p}:{lineno}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}): "
                                "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{p}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl_fields(path: str | Path, fields: Sequence[str], setting: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file that each need the string `fields` (preference pairs, SFT mixes); a bad
    line fails with file:line."""
    rows = []
    for lineno, row in iter_jsonl(path, setting):
        missing = [k for k in fields if not isinstance(row.get(k), str)]
        if missing:
            raise DataError(f"{path}:{lineno}: missing or non-string field(s) {missing}; each line needs string fields "
                            + ", ".join(f'"{k}"' for k in fields))
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no rows found ({setting})")
    return rows


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read problems from JSONL; every line needs "prompt" and "answer". Errors name file:line."""
    p = Path(path)
    rows: list[dict[str, Any]] = []
    first_line: dict[str, int] = {}
    for lineno, row in iter_jsonl(p):
        missing = [k for k in ("prompt", "answer") if k not in row]
        if missing:
            raise DataError(f"{p}:{lineno}: missing key(s) {missing}; each line needs \"prompt\" and \"answer\"")
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DataError(f"{p}:{lineno}: \"prompt\" must be a non-empty string")
        from tether.tasks.fields import read_gold_answers, read_messages  # (imports this module)

        golds = read_gold_answers(row["answer"], f"{p}:{lineno}: \"answer\"")
        row = dict(row, answer=golds[0], gold_answers=golds)  # any one counts (tether.rewards.verifiers)
        if "messages" in row:  # rendered with the chat template instead of "prompt" (tether.policy.chat)
            row["messages"] = read_messages(row["messages"], f"{p}:{lineno}: \"messages\"")
        row.setdefault("id", f"{p.stem}-{lineno}")
        key = str(row["id"])
        if key in first_line:  # evaluation keys results by id: a duplicate would be counted twice
            raise DataError(f"{p}:{lineno}: duplicate id {key!r} (first on line {first_line[key]}); "
                            "give every problem a unique \"id\" or drop the field to number lines")
        first_line[key] = lineno
        rows.append(row)
    if not rows:
        raise DataError(f"{p}: no problems found")
    return rows
