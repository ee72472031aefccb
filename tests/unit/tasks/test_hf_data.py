"""data.task=hf: `datasets` sources (verl parquet, a save_to_disk directory, JSONL), field
mapping, a held-out split by default, streaming, and errors that name the file, row and keys."""

import json
import sys

import datasets
import pytest
from typer.testing import CliRunner

from tether.cli import app
from tether.config import load_config
from tether.train.setup import setup_problems
from tether.tasks import DataError
from tether.tasks.hf import iter_problems, make_problem, split_held_out

runner = CliRunner()
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300", "logging.progress=false",
        "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "train.steps=2", "eval.samples=2",
        "rollout.problems_per_step=2", "rollout.n=2", "rollout.sampling.max_new_tokens=4",
        "eval.sampling.max_new_tokens=4", "reward.isolation=inline", "data.eval_size=3"]

REWARD_MODULE = '''
SEEN = []
def uses_extra(text, task):
    """1 if the completion equals the gold answer; fails loudly if the extra columns are missing."""
    assert task["data_source"] == "toy/add" and task["extra_info"]["index"] >= 0, sorted(task)
    return float(text.strip() == task["answer"])
'''


def _verl_rows(n):
    return [{"data_source": "toy/add", "prompt": [{"role": "user", "content": f"{i}+{i}="}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "byo_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "byo_reward:uses_extra"
    sys.modules.pop("byo_reward", None)


def test_verl_row_is_accepted_as_is():
    p = make_problem(_verl_rows(3)[2], "f.parquet: row 2", 2, "prompt", "answer", "f")
    assert p["messages"] == [{"role": "user", "content": "2+2="}]
    assert p["prompt"] == "2+2=" and p["answer"] == "4" and p["id"] == "f-2"
    assert p["data_source"] == "toy/add" and p["extra_info"] == {"split": "train", "index": 2}


def test_missing_key_names_file_row_and_available_keys():
    with pytest.raises(DataError, match=r"f.jsonl: row 4: no key 'solution' \(available keys: \['prompt', 'q'\]\)"):
        make_problem({"prompt": "x", "q": 1}, "f.jsonl: row 4", 4, "prompt", "solution", "f")
    with pytest.raises(DataError, match=r"row 0: prompt message 0 has no text content"):
        make_problem({"prompt": [{"role": "user"}], "answer": 1}, "row 0", 0, "prompt", "answer", "f")


def test_held_out_split_is_disjoint_and_seeded():
    rows = [{"id": str(i)} for i in range(50)]
    train, held = split_held_out(rows, 8, seed=3)
    assert len(held) == 8 and len(train) == 42
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert split_held_out(rows, 8, seed=3)[1] == held and split_held_out(rows, 8, seed=4)[1] != held
    assert len(split_held_out(rows[:10], 8, seed=3)[1]) == 2  # at most a fifth of a small file


def test_jsonl_without_eval_path_no_longer_evaluates_on_training_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    train, held = setup_problems(load_config(None, ["data.task=jsonl", f"data.path={path}", "data.eval_size=4"]).data)
    assert len(held) == 4 and len(train) == 16
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_streaming_reads_only_what_it_needs(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"q": f"{i}", "a": i}) + "\n" for i in range(500)))
    got = list(iter_problems(str(path), prompt_key="q", answer_key="a", streaming=True, limit=7))
    assert [p["prompt"] for p in got] == [str(i) for i in range(7)] and got[3]["answer"] == "3"
    cfg = load_config(None, ["data.task=hf", f"data.path={path}", "data.prompt_key=q", "data.answer_key=a",
                             "data.streaming=true", "data.train_size=10", "data.eval_size=5"])
    train, held = setup_problems(cfg.data)
    assert len(train) + len(held) == 15  # the first train_size + eval_size rows, no more


def test_malformed_and_missing_keys_through_the_cli(tmp_path):
    bad = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(_verl_rows(4)).to_parquet(str(bad))
    r = runner.invoke(app, ["train", str(_config(tmp_path)), *TINY, "data.task=hf", f"data.path={bad}",
                            "data.prompt_key=question", "--run-dir", str(tmp_path / "r1")])
    assert r.exit_code == 2 and "tether: error" in r.output, r.output
    assert f"{bad}: no column 'question' (available keys: ['ability', 'data_source', 'extra_info', 'prompt', " \
           "'reward_model'])" in r.output
    jl = tmp_path / "bad.jsonl"
    jl.write_text(json.dumps({"prompt": "1+1=", "answer": 2}) + "\n" + json.dumps({"prompt": 5, "answer": 1}) + "\n")
    r = runner.invoke(app, ["train", str(_config(tmp_path)), *TINY, "data.task=hf", f"data.path={jl}",
                            "--run-dir", str(tmp_path / "r2")])
    assert r.exit_code == 2 and f"{jl}: row 1: prompt must be a string or a list of chat messages" \
        in r.output, r.output
    assert "Traceback" not in r.output


def _config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run:\n  name: byo\n")
    return cfg


@pytest.mark.slow
def test_verl_parquet_and_dataset_dir_train_through_the_cli(tmp_path, reward_module):
    parquet = tmp_path / "train.parquet"
    datasets.Dataset.from_list(_verl_rows(24)).to_parquet(str(parquet))
    rows = [{"question": f"{i}+{i}=", "solution": 2 * i, "data_source": "toy/add", "extra_info": {"index": i}}
            for i in range(24)]
    ddir = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:4])}).save_to_disk(str(ddir))
    runs = {
        "verl": [f"data.path={parquet}"],
        "dir": [f"data.path={ddir}", "data.prompt_key=question", "data.answer_key=solution", "data.eval_split=test"],
    }
    outputs = {}
    for name, extra in runs.items():
        rd = tmp_path / name
        r = runner.invoke(app, ["train", str(_config(tmp_path)), *TINY, "data.task=hf", *extra,
                                f"reward.components=[{{name: '{reward_module}'}}]", "--run-dir", str(rd)])
        assert r.exit_code == 0, r.output
        steps = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps if "loss" in s or "reward/mean" in s][-1] == 2, steps
        outputs[name] = r.output
    assert "holding out 3 of 24 rows" in outputs["verl"] and "holding out" not in outputs["dir"]


@pytest.mark.slow
def test_the_docs_one_command_on_a_qwen_directory_and_a_parquet_file(tmp_path):
    """docs/byo.md: `tether train configs/byo.yaml model.path=<Qwen dir> data.path=<file.parquet>`."""
    from pathlib import Path

    from tether.policy.families import build_family_model, family_shape

    config = Path(__file__).resolve().parents[3] / "configs" / "byo.yaml"
    parquet = tmp_path / "train.parquet"
    datasets.Dataset.from_list(_verl_rows(30)).to_parquet(str(parquet))
    qwen = build_family_model("qwen2", tmp_path / "qwen", [f"{i}+{i}= {2 * i}" for i in range(30)],
                              family_shape(hidden_size=32, intermediate_size=64))
    small = ["train.steps=1", "rollout.n=2", "rollout.problems_per_step=2", "rollout.sampling.max_new_tokens=4",
             "eval.sampling.max_new_tokens=4", "eval.samples=1", "eval.problems=2", "reward.isolation=inline",
             "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0", "run.threads=1"]
    rd = tmp_path / "run"
    r = runner.invoke(app, ["train", str(config), f"model.path={qwen}", f"data.path={parquet}", *small,
                            "--run-dir", str(rd)])
    assert r.exit_code == 0, r.output
    assert "holding out 6 of 30 rows" in r.output
    rows = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "pg_loss" in row] == [1]
    sample = (rd / "samples").glob("step_*.jsonl.gz")
    assert next(sample, None) is not None
