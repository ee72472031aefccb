"""Model settings refused before weights load (tether.preflight, tether.policy.checks): LoRA target
modules the model does not have, chat templates that are missing or refuse the data's messages,
reward-model and judge references (docs/errors.md, "LoRA", "Chat templates", "Reward models and judges")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_input_helpers import TINY, params, write


def _train(t: Path, *extra: str) -> list[str]:
    return ["train", write(t / "c.yaml", "train:\n  steps: 1\n"), "--run-dir", str(t / "run"), *TINY, *extra]


# ----------------------------------------------------------------------------- LoRA


LORA_CASES = [  # (id, target_modules, fragment)
    ("a name the model lacks", "[nope]", "'nope' names no module of LlamaForCausalLM"),
    ("a typo among good names", "[q_proj, v_porj]", "'v_porj' names no module"),
    ("a regex that matches nothing", "'.*\\.attn_x'", "(a regular expression) matches no module"),
    ("a norm layer", "[norm]", "peft cannot adapt it"),
    ("an empty list", "[]", "is empty"),
]


@pytest.mark.parametrize("targets, fragment", params(LORA_CASES))
def test_lora_target_modules_of_the_tiny_model(bad_input, tmp_path, targets, fragment):
    bad_input.cli(_train(tmp_path, f"model.lora={{target_modules: {targets}}}"), "model.lora.target_modules", fragment,
                  "q_proj")


def test_lora_target_modules_of_a_model_directory(bad_input, tmp_path, models):
    bad_input.cli(_train(tmp_path, f"model.path={models.chat}", "model.lora={target_modules: [query, value]}"),
                  "model.lora.target_modules", "'query', 'value' names no module")


def test_apply_lora_names_the_setting_not_peft(bad_input):
    """The runtime path (a model built in memory) refuses with the same line, not peft's ValueError."""
    from tether.config import LoraConfig
    from tether.policy.lora import apply_lora
    from tether.policy.checks import build_skeleton

    from tether.config import TinyModelConfig

    model = build_skeleton(None, TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))
    bad_input.call(apply_lora, model, LoraConfig(target_modules=["input_layernorm"]), field="model.lora.target_modules",
                   fragments=["peft cannot adapt it"])


# ----------------------------------------------------------------------------- chat templates


def _verl_parquet(t: Path, system: bool = False) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    msgs = lambda i: ([{"role": "system", "content": "be brief"}] if system else []) + [{"role": "user", "content": f"{i}+1="}]
    rows = [{"prompt": msgs(i), "reward_model": {"ground_truth": str(i + 1)}} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), str(t / "d.parquet"))
    return str(t / "d.parquet")


def test_chat_rows_for_a_model_without_a_template(bad_input, tmp_path, models):
    """issue 40: was "ValueError: Cannot use chat template functions ... (an internal error)", exit 1."""
    argv = _train(tmp_path, f"model.path={models.plain}", "data.task=hf", f"data.path={_verl_parquet(tmp_path)}")
    bad_input.cli(argv, "data.prompt_key=prompt", "the rows are chat messages", "has none")


def test_chat_messages_in_jsonl_for_a_model_without_a_template(bad_input, tmp_path, models):
    path = write(tmp_path / "d.jsonl", "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "messages": [
        {"role": "user", "content": f"{i}+1="}]}) + "\n" for i in range(8)))
    bad_input.cli(_train(tmp_path, f"model.path={models.plain}", "data.task=jsonl", f"data.path={path}"),
                  "data.prompt_key", "has none")


def test_template_that_refuses_the_system_message(bad_input, tmp_path, models):
    argv = _train(tmp_path, f"model.path={models.strict}", "data.task=hf", f"data.path={_verl_parquet(tmp_path, True)}")
    bad_input.cli(argv, "data.prompt_key", "the model's chat template refuses the messages", "System role not supported")


def test_eval_of_chat_rows_without_a_template(bad_input, tmp_path, models):
    """`tether eval CONFIG` meets the template while encoding: a TemplateError naming the setting, exit 2."""
    cfg = write(tmp_path / "e.yaml", f"model: {{path: {models.plain}}}\ndata: {{task: hf, path: {_verl_parquet(tmp_path)}, "
                                     "eval_size: 2}\neval: {samples: 1, problems: 2}\n")
    bad_input.cli(["eval", cfg, "--no-plot", "--out", str(tmp_path / "out")], "data.prompt_key", "has none")


def test_encode_prompt_without_a_template(bad_input, models):
    from transformers import AutoTokenizer

    from tether.policy.chat import TemplateError, encode_prompt

    tok = AutoTokenizer.from_pretrained(models.plain)
    bad_input.call(encode_prompt, tok, {"id": "q1", "prompt": "1+1="}, True, field="data.chat=true", exc=TemplateError)


# ----------------------------------------------------------------------------- reward models and judges


def _reward(t: Path, component: str, *extra: str) -> list[str]:
    return _train(t, f"reward.components=[{component}]", *extra)


def test_reward_model_path_missing(bad_input, tmp_path):
    bad_input.cli(_reward(tmp_path, f"{{name: reward_model, kwargs: {{path: {tmp_path / 'rm'}}}}}"), "kwargs.path",
                  "reward.components[0] (reward_model)", "no such directory")


def test_reward_model_path_is_a_causal_lm(bad_input, tmp_path, models):
    bad_input.cli(_reward(tmp_path, f"{{name: reward_model, kwargs: {{path: {models.chat}}}}}"), "kwargs.path",
                  "is a causal language model", "tether rm")


def test_reward_model_path_is_a_three_label_classifier(bad_input, tmp_path, models):
    bad_input.cli(_reward(tmp_path, f"{{name: reward_model, kwargs: {{path: {models.classifier}}}}}"), "kwargs.path",
                  "3 labels")


def test_reward_model_path_without_config(bad_input, tmp_path):
    (tmp_path / "rm").mkdir()
    bad_input.cli(_reward(tmp_path, f"{{name: reward_model, kwargs: {{path: {tmp_path / 'rm'}}}}}"), "kwargs.path",
                  "no config.json")


def test_reward_model_normalize_unknown(bad_input, tmp_path, models):
    bad_input.cli(_reward(tmp_path, f"{{name: reward_model, kwargs: {{path: {models.reward}, normalize: zscore}}}}"),
                  "kwargs.normalize", "winrate")


JUDGE_CASES = [  # (id, kwargs (models substituted), field, fragment)
    ("model and base_url", "{{model: policy, base_url: 'http://127.0.0.1:9/v1'}}", "kwargs", "exactly one of"),
    ("neither", "{{rubric: 'ok?'}}", "kwargs", "exactly one of"),
    ("base_url without scheme", "{{base_url: '127.0.0.1:8000/v1'}}", "kwargs.base_url", "not an http(s) URL"),
    ("model missing", "{{model: {missing}}}", "kwargs.model", "no such directory"),
    ("model is a reward model", "{{model: {reward}}}", "kwargs.model", "is a reward model"),
    ("template with an unknown field", "{{model: policy, template: 'Grade {{reply}}'}}", "kwargs.template", "'reply'"),
    ("scale zero", "{{model: policy, scale: 0}}", "kwargs.scale", "a positive number"),
]


@pytest.mark.parametrize("kwargs, field, fragment", params(JUDGE_CASES))
def test_judge_settings(bad_input, tmp_path, models, kwargs, field, fragment):
    paths = {"missing": tmp_path / "nope"}
    if "{reward}" in kwargs:
        paths["reward"] = models.reward
    component = "{name: exact_match}, {name: judge, weight: 0.5, kwargs: " + kwargs.format(**paths) + "}"
    bad_input.cli(_reward(tmp_path, component), field, fragment, "reward.components[1] (judge)")


def test_multi_turn_render_with_a_template_that_refuses_a_role(bad_input, models):
    """Environments render conversations through tether.policy.chat.render_chat: the template's own
    raise_exception is a TemplateError (exit 2), not jinja2's exception (an internal error)."""
    from transformers import AutoTokenizer

    from tether.policy.chat import TemplateError, render_chat

    tok = AutoTokenizer.from_pretrained(models.strict)
    bad_input.call(render_chat, tok, [{"role": "system", "content": "tools: calc"}, {"role": "user", "content": "1+1"}],
                   field="chat template", fragments=["System role not supported"], exc=TemplateError)
