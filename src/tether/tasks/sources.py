"""Data sources: the `data.task` values whose problems are read from `data.path` instead of generated.

    train, held_out = load_split_problems(cfg.data)   # a source's rows, or a built-in task's generator

The one place that knows the source names (`jsonl`: one {prompt, answer, ...} object per line;
`hf`: anything `datasets` reads, tether.tasks.hf). Every other module asks this registry:
`is_file_task` (rows carry their own answers: no generator, no scripted expert),
`find_source_problem` (a config check), `check_source` (preflight reads the rows),
`sample_source_rows` (the first training rows: `auto` settings' statistics, tether.config.fit) and
`load_split_problems` (the recipes' problems). A new source is one registered `DataSource`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tether.registry import Registry
from tether.tasks import load_jsonl, make_splits
from tether.tasks.config import DataConfig

Problems = list[dict[str, Any]]


@dataclass(frozen=True)
class DataSource:
    """Where a `data.task` value reads its rows: `load(d) -> (train, held_out)`, `check(d)` reads
    them as `load` will and returns them, or raises (DataError naming file:line, or file, row and
    field), `needs` the config fix when `data.path` is missing; `sample(d, limit)` reads at most
    `limit` training rows (by default the first of `check`'s)."""

    name: str
    load: Callable[[DataConfig], tuple[Problems, Problems]]
    check: Callable[[DataConfig], Problems]
    needs: str
    sample: Callable[[DataConfig, int], Problems] | None = None


SOURCES: Registry[Callable[[], DataSource]] = Registry("data source")


def _load_jsonl(d: DataConfig) -> tuple[Problems, Problems]:
    from tether.tasks.hf import split_held_out

    rows = load_jsonl(d.path)
    if d.eval_path:
        return rows, load_jsonl(d.eval_path)
    train, held = split_held_out(rows, d.eval_size, d.seed)
    print(f"[tether] data: no data.eval_path; holding out {len(held)} of {len(rows)} rows of {d.path} "
          f"for evaluation — they are never trained on", flush=True)
    return train, held


def _check_jsonl(d: DataConfig) -> Problems:
    return [p for path in (d.path, d.eval_path) if path for p in load_jsonl(path)]


def _check_hf(d: DataConfig) -> Problems:
    from tether.tasks.hf import read_hf_sources

    rows, held = read_hf_sources(d)  # every row as tether.tasks.fields reads it: a bad one costs seconds, not a model
    return rows + (held or [])


def _sample_hf(d: DataConfig, limit: int) -> Problems:
    from tether.tasks.hf import iter_problems

    return list(iter_problems(d.path, d.split, d.prompt_key, d.answer_key, streaming=d.streaming, limit=limit))


def _load_hf(d: DataConfig) -> tuple[Problems, Problems]:
    from tether.tasks.hf import setup_hf_problems

    return setup_hf_problems(d)


@SOURCES.register("jsonl")
def jsonl_source() -> DataSource:
    return DataSource("jsonl", _load_jsonl, _check_jsonl, "data.task=jsonl needs data.path=<file.jsonl>",
                      lambda d, limit: load_jsonl(d.path)[:limit])


@SOURCES.register("hf")
def hf_source() -> DataSource:
    return DataSource("hf", _load_hf, _check_hf,
                      "data.task=hf needs data.path=<file.parquet | dataset directory | hub name>", _sample_hf)


def is_file_task(name: str) -> bool:
    """Problems come from a file or dataset: demonstrations are the rows' `completion` or `answer`."""
    return name in SOURCES


def find_source_problem(d: DataConfig) -> str | None:
    """The config fix a data source needs (its `data.path`), None when the config is complete."""
    return SOURCES[d.task]().needs if d.task in SOURCES and not d.path else None


def check_source(d: DataConfig) -> Problems | None:
    """A source's rows, read as the recipe will (DataError names file:line); None for a generated task."""
    if d.task not in SOURCES:
        return None
    return SOURCES[d.task]().check(d)


def sample_source_rows(d: DataConfig, limit: int) -> Problems | None:
    """At most `limit` training rows of a data source, read as the recipe reads them; None for a generated task."""
    if d.task not in SOURCES:
        return None
    source = SOURCES[d.task]()
    return source.sample(d, limit) if source.sample else source.check(d)[:limit]


def load_split_problems(d: DataConfig) -> tuple[Problems, Problems]:
    """(train, held-out) problems: a data source's rows (without `data.eval_path`, `data.eval_size`
    of them held out), or a built-in task's (or environment's) generated problems."""
    if d.task in SOURCES:
        return SOURCES[d.task]().load(d)
    return make_splits(d.task, d.train_size, d.eval_size, d.seed, d.task_kwargs)


__all__ = ["DataSource", "SOURCES", "check_source", "find_source_problem", "is_file_task", "load_split_problems",
           "sample_source_rows"]
