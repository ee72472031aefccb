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
default `answer`, a row without it falls back to `reward_model.ground_truth`.

Held-out split: `data.eval_path` (a second source) or `data.eval_split` (a split of the same
source) when given; otherwise `data.eval_size` rows are drawn (seeded) out of the training rows
and never trained on, and a notice says so. `data.streaming=true` reads rows lazily and stops
after `data.train_size` (+ the held-out rows), so a large file is never loaded whole.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from tether.tasks import DataError

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}
_VERL_ANSWER = "reward_model.ground_truth"


def _open_source(path: str, split: str, streaming: bool) -> Iterable[Mapping[str, Any]]:
    """The rows of `path` as a datasets (Iterable)Dataset; errors name the path and the fix."""
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
            return datasets.load_dataset(str(p), split=split, streaming=streaming)
        if p.suffix or str(path).startswith((".", "/", "~")):
            raise DataError(f"{p}: no such file or directory (data.path)")
        return datasets.load_dataset(path, split=split, streaming=streaming)  # a Hub name
    except DataError:
        raise
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"{path}: cannot load as a dataset ({type(err).__name__}: {first[:300]})") from None


def _lookup(row: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) for a dotted key into nested mappings."""
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _as_messages(value: Any, where: str) -> list[dict[str, str]]:
    msgs = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: prompt message {i} must be {{'role': str, 'content': str}}, got {m!r:.120}")
        msgs.append({"role": m["role"], "content": m["content"]})
    if not msgs:
        raise DataError(f"{where}: the prompt is an empty list of messages")
    return msgs


def make_problem(row: Mapping[str, Any], where: str, index: int, prompt_key: str, answer_key: str,
                 default_id: str) -> dict[str, Any]:
    """One dataset row -> a problem dict (see module docstring). `where` names the file and row."""
    found, prompt = _lookup(row, prompt_key)
    if not found:
        raise DataError(f"{where}: no key {prompt_key!r} (available keys: {sorted(row)}); set data.prompt_key")
    found, answer = _lookup(row, answer_key)
    if not found and answer_key == "answer":
        found, answer = _lookup(row, _VERL_ANSWER)
    if not found:
        raise DataError(f"{where}: no key {answer_key!r} (available keys: {sorted(row)}); set data.answer_key")
    if answer is None:
        raise DataError(f"{where}: the answer ({answer_key}) is null")
    problem = {k: v for k, v in row.items() if k not in (prompt_key, "messages")}
    if isinstance(prompt, str):
        if not prompt:
            raise DataError(f"{where}: the prompt ({prompt_key}) is an empty string")
        problem["prompt"] = prompt
    elif isinstance(prompt, (list, tuple)):
        problem["messages"] = _as_messages(prompt, where)
        problem["prompt"] = "\n".join(m["content"] for m in problem["messages"])
    else:
        raise DataError(f"{where}: the prompt ({prompt_key}) must be a string or a list of chat messages, "
                        f"got {type(prompt).__name__}")
    problem["answer"] = str(answer)
    problem["id"] = str(row["id"]) if row.get("id") is not None else f"{default_id}-{index}"
    return problem


def iter_problems(path: str, split: str = "train", prompt_key: str = "prompt", answer_key: str = "answer",
                  streaming: bool = False, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Problems of one source, in file order, at most `limit`."""
    ds = _open_source(path, split, streaming)
    columns = getattr(ds, "column_names", None)
    for key in (prompt_key,):
        if columns and key.split(".")[0] not in columns:
            raise DataError(f"{path}: no column {key.split('.')[0]!r} (available keys: {sorted(columns)}); "
                            "set data.prompt_key")
    stem = Path(path).stem or "row"
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            return
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


def setup_hf_problems(d: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) for `data.task=hf` (or `jsonl`) from the DataConfig `d`."""
    keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key, "streaming": d.streaming}
    separate = d.eval_path is not None or d.eval_split is not None
    limit = d.train_size if separate else d.train_size + d.eval_size
    rows = load_problems(d.path, split=d.split, limit=limit if d.streaming else None, **keys)
    if d.eval_path is not None or d.eval_split is not None:
        src, split = (d.eval_path, d.split) if d.eval_path is not None else (d.path, d.eval_split)
        held = load_problems(src, split=split, limit=d.eval_size if d.streaming else None, **keys)
        return rows, held
    train, held = split_held_out(rows, d.eval_size, d.seed)
    print(f"[tether] data: no data.eval_path; holding out {len(held)} of {len(rows)} rows of {d.path} "
          f"(seed {d.seed}) for evaluation — they are never trained on", flush=True)
    return train, held
