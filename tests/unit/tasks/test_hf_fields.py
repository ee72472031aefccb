"""What the data readers make of the layouts real datasets use (tether.tasks.fields): the refusals
are in tests/unit/bad_input/test_bad_data_readers.py; here, what is accepted means what it must."""

from __future__ import annotations

import json

import pytest

from tether.rewards.verifiers import exact_match_reward, math_verify_reward, numeric_reward
from tether.tasks import load_jsonl
from tether.tasks.hf import load_problems


def _parquet(tmp_path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def test_a_dict_of_target_answers_scores_every_target(tmp_path):
    """issue 40: verl/Search-R1's {"target": [...]} became its Python repr as the gold answer, so exact
    match could never pass (and the run exited 0)."""
    rows = [{"data_source": "searchR1_nq", "prompt": [{"role": "user", "content": "capital of France?"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris", "City of Paris"]}}}] * 3
    problem = load_problems(_parquet(tmp_path, rows))[0]
    assert problem["answer"] == "Paris" and problem["gold_answers"] == ["Paris", "City of Paris"]
    assert exact_match_reward("<answer>Paris</answer>", problem) == 1.0
    assert exact_match_reward("<answer>City of Paris</answer>", problem) == 1.0
    assert exact_match_reward("<answer>Lyon</answer>", problem) == 0.0
    assert problem["reward_model"]["ground_truth"] == {"target": ["Paris", "City of Paris"]}  # rides along as stored


def test_lists_numbers_and_json_strings(tmp_path):
    from tether.tasks.fields import read_gold_answers

    assert read_gold_answers(3.0, "w") == ["3"] and read_gold_answers(0.5, "w") == ["0.5"]
    assert read_gold_answers(-7, "w") == ["-7"] and read_gold_answers(["12", 13], "w") == ["12", "13"]
    assert read_gold_answers('{"target": ["a", "b"]}', "w") == ["a", "b"]
    assert read_gold_answers('["a", "b"]', "w") == ["a", "b"]
    assert read_gold_answers("[1, 2]", "w") == ["[1, 2]"]  # an interval, not a list of answers
    assert read_gold_answers("{1, 2}", "w") == ["{1, 2}"]  # a set, not JSON
    problem = {"answer": "12", "gold_answers": ["12", "13"]}
    assert numeric_reward("the answer is 13", problem) == 1.0 and numeric_reward("14", problem) == 0.0
    assert math_verify_reward("$\\boxed{13}$", problem) == 1.0


def test_prompt_layouts():
    from tether.tasks.fields import read_prompt

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    assert read_prompt(json.dumps(msgs), "w") == ("be brief\n2+2=", msgs)
    sharegpt = [{"from": "system", "value": "be brief"}, {"from": "human", "value": "2+2="}]
    assert read_prompt(sharegpt, "w")[1] == msgs
    parts = [{"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2="}]}]
    assert read_prompt(parts, "w") == ("2+2=", [{"role": "user", "content": "2+2="}])
    assert read_prompt("[x] marks the spot", "w") == ("[x] marks the spot", None)
    assert read_prompt("[1, 2, 3] sum=", "w") == ("[1, 2, 3] sum=", None)  # JSON, but no messages: text


@pytest.mark.parametrize("answer, golds", [({"target": ["4", "four"]}, ["4", "four"]), (["4"], ["4"]), (4.0, ["4"])])
def test_jsonl_answers_are_read_the_same_way(tmp_path, answer, golds):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "2+2=", "answer": answer}) + "\n")
    row = load_jsonl(path)[0]
    assert row["gold_answers"] == golds and row["answer"] == golds[0]
    assert exact_match_reward(golds[-1], row) == 1.0
