"""Problems from a Hugging Face `datasets` source: parquet / JSONL / JSON / CSV / arrow files, a
directory written by `Dataset.save_to_disk`, a directory of data files, or a Hub name.

    data.task=hf data.path=train.parquet data.prompt_key=question data.answer_key=solution

Every row becomes a problem dict {"id", "prompt", "answer", ...} and keeps all of its other
columns, so a reward function sees them in its `task` argument (`task["extra_info"]`, ...).

verl's parquet layout is accepted as is: `prompt` is a list of chat messages
([{"role": "user", "content": ...}]), the gold answer is `reward_model.ground_truth`, and
`data_source` / `extra_info` ride along. A messages-format prompt is kept as `messages` (the
rollout renders it with the tokenizer's chat template) and `prompt` is set to its text. Keys
may be dotted paths into nested columns (`data.answer_key=reward_model.ground_truth`); with the
default `answer`, a row without it falls back to `reward_model.ground_truth`. What each stored
form of a prompt or gold answer means (a list or `{"target": [...]}` of acceptable answers, a
JSON string, ShareGPT messages, ...) and what is refused: tether.tasks.fields. The gold answers
are kept as `gold_answers` (any one counts), the first also as `answer`.

Held-out split: `data.eval_path` (a second source) or `data.eval_split` (a split of the same
source) when given; otherwise `data.eval_size` rows are drawn (seeded) out of the training rows
and never trained on, and a notice says so. `data.streaming=true` reads rows lazily and stops
after `data.train_size` (+ the held-out rows), so a large file is never loaded whole.
"""

from __future__ import annotations

import itertools
import logging
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from tether.tasks import DataError
from tether.tasks.fields import read_gold_answers, read_prompt

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}
_VERL_ANSWER = "reward_model.ground_truth"


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """datasets logs a file it cannot read ("Failed to read schema ...") before raising; the DataError
    says it in one line, so the log line would only repeat it (and break the one-line rule)."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _open_source(path: str, split: str, streaming: bool) -> Iterable[Mapping[str, Any]]:
    """The rows of `path` as a datasets (Iterable)Dataset; errors name the path and the fix."""
    with _quiet_datasets():
        return _do_open_source(path, split, streaming)


def _do_open_source(path: str, split: str, streaming: bool) -> Iterable[Mapping[str, Any]]:
    import datasets

    p = Path(path)
    try:
        if p.is_file():
            builder = _BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise DataError(f"{p}: unknown data file type {p.suffix!r}; use one of {sorted(_BUILDERS)}")
            return datasets.load_dataset(builder, data_files=str(p), split="train", streaming=streaming)
        if p.is_dir():
            if (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file():
                ds = datasets.load_from_disk(str(p))
                if isinstance(ds, datasets.DatasetDict):
                    if split not in ds:
                        raise DataError(f"{p}: no split {split!r} (splits: {sorted(ds)}); set data.split")
                    ds = ds[split]
                return ds.to_iterable_dataset() if streaming else ds
            if not any(f.is_file() for f in p.rglob("*")):
                raise DataError(f"{p}: an empty directory (data.path); give a data file ({', '.join(sorted(_BUILDERS))}), "
                                "a directory of them, or one written by Dataset.save_to_disk")
            return datasets.load_dataset(str(p), split=split, streaming=streaming)
        if p.suffix or str(path).startswith((".", "/", "~")):
            raise DataError(f"{p}: no such file or directory (data.path)")
    except DataError:
        raise
    except (ValueError, OSError, ConnectionError, datasets.exceptions.DatasetsError) as err:
        raise _unreadable(path, err) from None
    try:
        return datasets.load_dataset(path, split=split, streaming=streaming)  # a Hub name
    except (ValueError, OSError, ConnectionError, datasets.exceptions.DatasetsError) as err:
        raise DataError(f"{path}: no such file or directory, and no Hub dataset of that name in the local cache "
                        f"(data.path; {type(err).__name__}); give a local file or directory") from None


def _unreadable(path: str, err: BaseException, row: int | None = None) -> DataError:
    """datasets / pyarrow / pandas refusing a file (ArrowInvalid, DatasetGenerationError, ParserError,
    ...) as one line naming the file; the underlying cause is the deepest message in the chain."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__  # DatasetGenerationError wraps the parser's own error
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    at = f": row {row}" if row is not None else ""
    return DataError(f"{path}{at}: cannot read it as a dataset ({type(err).__name__}: {first[:300]}); "
                     f"check the file's format (data.path: {', '.join(sorted(_BUILDERS))} or a dataset directory)")


def _lookup(row: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) for a dotted key into nested mappings."""
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def make_problem(row: Mapping[str, Any], where: str, index: int, prompt_key: str, answer_key: str,
                 default_id: str) -> dict[str, Any]:
    """One dataset row -> a problem dict (see module docstring). `where` names the file and row; a
    field that does not mean what it must is refused naming it (tether.tasks.fields)."""
    found, prompt = _lookup(row, prompt_key)
    if not found:
        raise DataError(f"{where}: no key {prompt_key!r} (available keys: {sorted(row)}); set data.prompt_key")
    found, answer = _lookup(row, answer_key)
    if found:
        answer_field = answer_key
    elif answer_key == "answer":
        found, answer = _lookup(row, _VERL_ANSWER)
        answer_field = _VERL_ANSWER
    if not found:
        raise DataError(f"{where}: no key {answer_key!r} (available keys: {sorted(row)}); set data.answer_key")
    golds = read_gold_answers(answer, f"{where}: {answer_field}")
    problem = {k: v for k, v in row.items() if k not in (prompt_key, "messages")}
    problem["prompt"], messages = read_prompt(prompt, f"{where}: {prompt_key}")
    if messages is not None:
        problem["messages"] = messages
    problem["answer"], problem["gold_answers"] = golds[0], golds  # any one counts (tether.rewards.verifiers)
    problem["id"] = str(row["id"]) if row.get("id") is not None else f"{default_id}-{index}"
    return problem


def iter_problems(path: str, split: str = "train", prompt_key: str = "prompt", answer_key: str = "answer",
                  streaming: bool = False, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Problems of one source, in file order, at most `limit`."""
    import datasets

    ds = _open_source(path, split, streaming)
    columns = getattr(ds, "column_names", None)
    for key in (prompt_key,):
        if columns and key.split(".")[0] not in columns:
            raise DataError(f"{path}: no column {key.split('.')[0]!r} (available keys: {sorted(columns)}); "
                            "set data.prompt_key")
    stem = Path(path).stem or "row"
    rows = iter(ds)
    for i in itertools.count():
        if limit is not None and i >= limit:
            return
        try:  # a streamed source parses as it goes: a malformed line surfaces here
            with _quiet_datasets():
                row = next(rows)
        except StopIteration:
            return
        except (ValueError, OSError, datasets.exceptions.DatasetsError) as err:
            raise _unreadable(path, err, i) from None
        yield make_problem(row, f"{path}: row {i}", i, prompt_key, answer_key, stem)


def load_problems(path: str, **kwargs: Any) -> list[dict[str, Any]]:
    rows = list(iter_problems(path, **kwargs))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def split_held_out(rows: list[dict[str, Any]], eval_size: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out): `eval_size` rows (at most a fifth, at least one) drawn with `seed` and
    removed from training, so the evaluation is on problems the policy never trained on."""
    if len(rows) < 2:
        raise DataError(f"cannot hold out evaluation problems from {len(rows)} row(s): give data.eval_path")
    k = max(1, min(eval_size, len(rows) // 5))
    held = set(random.Random(seed).sample(range(len(rows)), k))
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def read_hf_sources(d: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(rows of data.path, rows of the held-out source or None) for `data.task=hf` from the DataConfig
    `d`; every row read as tether.tasks.fields says (tether.preflight reads them before a model is built)."""
    keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key, "streaming": d.streaming}
    separate = d.eval_path is not None or d.eval_split is not None
    limit = d.train_size if separate else d.train_size + d.eval_size
    rows = load_problems(d.path, split=d.split, limit=limit if d.streaming else None, **keys)
    if not separate:
        return rows, None
    src, split = (d.eval_path, d.split) if d.eval_path is not None else (d.path, d.eval_split)
    return rows, load_problems(src, split=split, limit=d.eval_size if d.streaming else None, **keys)


def setup_hf_problems(d: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) for `data.task=hf` (or `jsonl`) from the DataConfig `d`."""
    rows, held = read_hf_sources(d)
    if held is not None:
        return rows, held
    train, held = split_held_out(rows, d.eval_size, d.seed)
    print(f"[tether] data: no data.eval_path; holding out {len(held)} of {len(rows)} rows of {d.path} "
          f"(seed {d.seed}) for evaluation — they are never trained on", flush=True)
    return train, held
