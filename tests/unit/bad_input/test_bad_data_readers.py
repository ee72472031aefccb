"""Data readers (tether.tasks.hf, tether.tasks.fields, load_jsonl): rows in the layouts of verl,
Search-R1, ShareGPT and plain JSONL that cannot mean a prompt or a gold answer are refused before a
model is built, naming the file, the row and the field (docs/errors.md, "Data readers")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bad_input_helpers import TINY, params, write

CONFIG = "train:\n  steps: 1\n"


def _parquet(path: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def _jsonl(path: Path, rows: list[dict]) -> str:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def _verl(gt, n: int = 6, prompt=None) -> list[dict]:
    """verl's parquet layout with the given ground truth (and prompt) in every row."""
    return [{"data_source": "toy", "prompt": prompt if prompt is not None else [{"role": "user", "content": f"q{i}"}],
             "reward_model": {"style": "rule", "ground_truth": gt}} for i in range(n)]


def _train(t: Path, path: str, *extra: str, task: str = "hf") -> list[str]:
    return ["train", write(t / "c.yaml", CONFIG), "--run-dir", str(t / "run"), *TINY, f"data.task={task}",
            f"data.path={path}", "data.eval_size=2", *extra]


GROUND_TRUTH_CASES = [  # (id, ground truth, field named, fragment)
    ("test cases dict (prime_code)", {"inputs": ["1"], "outputs": ["2"]}, "reward_model.ground_truth", 'no "target"'),
    ("test cases as a JSON string", json.dumps({"inputs": ["1"], "outputs": ["2"]}), "reward_model.ground_truth",
     'no "target"'),
    ("empty string", "", "reward_model.ground_truth", "is an empty string"),
    ("blank string", "   ", "reward_model.ground_truth", "is an empty string"),
    ("boolean", True, "reward_model.ground_truth", "is a boolean"),
    ("empty target list", {"target": []}, "reward_model.ground_truth.target", "is an empty list"),
    ("nested target", {"target": {"a": "b"}}, "reward_model.ground_truth.target", "is nested"),
    ("target with a null", {"target": ["a", None]}, "reward_model.ground_truth.target[1]", "is null"),
]


@pytest.mark.parametrize("gt, field, fragment", params(GROUND_TRUTH_CASES))
def test_verl_ground_truth_that_is_no_answer(bad_input, tmp_path, gt, field, fragment):
    path = _jsonl(tmp_path / "d.jsonl", _verl(gt))
    bad_input.cli(_train(tmp_path, path), field, fragment, f"{path}: row 0")


def test_non_finite_ground_truth_in_parquet(bad_input, tmp_path):
    path = _parquet(tmp_path / "d.parquet", _verl(1.0, 3) + _verl(math.nan, 1))
    bad_input.cli(_train(tmp_path, path), "reward_model.ground_truth", "is nan", f"{path}: row 3")


def test_empty_list_of_answers_in_parquet(bad_input, tmp_path):
    path = _parquet(tmp_path / "d.parquet", _verl(["a"], 2) + _verl([], 1))
    bad_input.cli(_train(tmp_path, path), "reward_model.ground_truth", "is an empty list", "row 2")


def test_list_of_answers_holding_a_list(bad_input, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": ["a", ["b"]]}] * 3)
    bad_input.cli(_train(tmp_path, path), "answer[1]", "is nested")


PROMPT_CASES = [  # (id, prompt, field, fragment)
    ("role missing", [{"content": "q"}], "prompt message 0", "has role None"),
    ("unknown role", [{"role": "human", "content": "q"}], "prompt message 0", "has role 'human'"),
    ("content missing", [{"role": "user"}], "prompt message 0", "has no text content"),
    ("image part", [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}], "prompt message 0",
     "part 0 is 'image'"),
    ("empty message list", [], "prompt", "is an empty list of messages"),
    ("JSON string of messages without role", json.dumps([{"content": "q"}]), "prompt message 0", "has role None"),
    ("ShareGPT unknown speaker", [{"from": "narrator", "value": "q"}], "prompt message 0", "ShareGPT"),
    ("empty string", "", "prompt", "is an empty string"),
    ("a number", 7, "prompt", "must be a string or a list of chat messages"),
    ("a mapping", {"role": "user", "content": "q"}, "prompt", "must be a string or a list of chat messages"),
]


@pytest.mark.parametrize("prompt, field, fragment", params(PROMPT_CASES))
def test_prompt_that_is_no_prompt(bad_input, tmp_path, prompt, field, fragment):
    path = _jsonl(tmp_path / "d.jsonl", _verl("4", prompt=prompt))
    bad_input.cli(_train(tmp_path, path), field, fragment, f"{path}: row 0")


def test_csv_that_does_not_parse(bad_input, tmp_path):
    path = write(tmp_path / "d.csv", 'prompt,answer\n"1+1=,2\n2+2=,4\n')
    bad_input.cli(_train(tmp_path, path), "d.csv", "cannot read it as a dataset", "ParserError")


def test_streamed_csv_that_does_not_parse_names_the_row(bad_input, tmp_path):
    path = write(tmp_path / "d.csv", 'prompt,answer\n"1+1=,2\n2+2=,4\n')
    bad_input.cli(_train(tmp_path, path, "data.streaming=true"), "d.csv: row 0", "cannot read it as a dataset")


def test_file_that_is_not_parquet(bad_input, tmp_path):
    path = write(tmp_path / "d.parquet", "not a parquet file")
    bad_input.cli(_train(tmp_path, path), "d.parquet", "cannot read it as a dataset")


def test_empty_directory(bad_input, tmp_path):
    (tmp_path / "data").mkdir()
    bad_input.cli(_train(tmp_path, str(tmp_path / "data")), "data.path", "an empty directory")


def test_hub_name_not_in_the_cache(bad_input, tmp_path):
    bad_input.cli(_train(tmp_path, "someone/no-such-dataset"), "data.path", "no Hub dataset of that name in the local cache")


def test_missing_answer_column(bad_input, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "solution": "4"}] * 3)
    bad_input.cli(_train(tmp_path, path, "data.answer_key=gold"), "'gold'", "set data.answer_key", "row 0")


def test_dotted_prompt_key_into_text(bad_input, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "4"}] * 3)
    bad_input.cli(_train(tmp_path, path, "data.prompt_key=prompt.text"), "'prompt.text'", "set data.prompt_key")


JSONL_CASES = [  # data.task=jsonl: the same readers as the datasets sources
    ("answer is a mapping", {"prompt": "1+1=", "answer": {"value": 2}}, '"answer"', 'no "target"'),
    ("answer is an empty list", {"prompt": "1+1=", "answer": []}, '"answer"', "is an empty list"),
    ("answer is a boolean", {"prompt": "1+1=", "answer": False}, '"answer"', "is a boolean"),
    ("messages without role", {"prompt": "1+1=", "answer": "2", "messages": [{"content": "1+1="}]}, '"messages"',
     "has role None"),
    ("messages not a list", {"prompt": "1+1=", "answer": "2", "messages": "1+1="}, '"messages"',
     "must be a list of chat messages"),
]


@pytest.mark.parametrize("row, field, fragment", params(JSONL_CASES))
def test_jsonl_row_that_cannot_mean_what_it_must(bad_input, tmp_path, row, field, fragment):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2=", "answer": "4"}, row])
    bad_input.cli(_train(tmp_path, path, task="jsonl"), field, fragment, f"{path}:2")


def test_readers_refuse_in_a_real_process_with_one_line(bad_input, tmp_path):
    """No datasets/pyarrow log line, no traceback: stderr is the one error line."""
    path = write(tmp_path / "d.parquet", "not a parquet file")
    bad_input.process(_train(tmp_path, path), "d.parquet", "cannot read it as a dataset", cwd=tmp_path)
