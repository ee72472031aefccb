"""Pipelines check every stage before the first one runs (tether.preflight_stages): a distillation
teacher with another tokenizer in any stage order, merge shapes and weights, DPO and rs_sft inputs, and
a later stage's data, steps, rewards or LoRA targets. Each refusal leaves no run directory: nothing was
spent (docs/errors.md, "Pipelines", "Distillation", "Merging")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bad_input_helpers import TINY, params, write


def _pipeline(bad_input, t: Path, stages: list[dict], field: str, *fragments: str, **base) -> str:
    cfg = write(t / "p.yaml", yaml.safe_dump({**base, "pipeline": {"stages": stages}}))
    message = bad_input.cli(["pipeline", cfg, "--run-dir", str(t / "run"), *TINY], field, *fragments)
    assert not (t / "run").exists(), "a stage ran before the refusal"
    return message


def _stage(kind: str, name: str, **overrides) -> dict:
    return {"kind": kind, "name": name, **({"overrides": overrides} if overrides else {})}


SFT = _stage("sft", "sft")

# ----------------------------------------------------------------------------- distillation


@pytest.mark.parametrize("order", ["distill first", "distill after sft"])
def test_teacher_with_another_tokenizer_in_either_order(bad_input, tmp_path, models, order):
    """issue 40: refused after the SFT stage had run in one order, accepted (and trained) in the other."""
    distill = _stage("distill", "d", distill={"teacher": models.other_vocab})
    stages = [distill] if order == "distill first" else [SFT, distill]
    _pipeline(bad_input, tmp_path, stages, "distill.teacher", "its tokenizer differs from the student's",
              "the tiny model the first stage builds")


def test_teacher_with_another_tokenizer_from_a_model_path(bad_input, tmp_path, models):
    _pipeline(bad_input, tmp_path, [SFT, _stage("distill", "d", distill={"teacher": models.other_vocab})],
              "distill.teacher", f"model.path={models.chat}", model={"path": models.chat})


DISTILL_CASES = [  # (id, teacher (models substituted), fragment)
    ("no teacher", None, "distill.teacher is not set"),
    ("teacher is previous", "previous", "names the stage's own starting model"),
    ("teacher is a reward model", "{reward}", "is a reward model"),
    ("teacher without config.json", "{empty}", "no config.json"),
]


@pytest.mark.parametrize("teacher, fragment", params(DISTILL_CASES))
def test_distill_teacher(bad_input, tmp_path, models, teacher, fragment):
    (tmp_path / "empty").mkdir()
    if teacher is not None:
        teacher = teacher.format(reward=models.reward if "reward" in teacher else "", empty=tmp_path / "empty")
    _pipeline(bad_input, tmp_path, [SFT, _stage("distill", "d", distill={"teacher": teacher})], "distill.teacher",
              fragment, "pipeline stage 'd' (pipeline.stages.1)")


# ----------------------------------------------------------------------------- merging


MERGE_CASES = [  # (id, merge settings (models substituted), field, fragment)
    ("another size than the stage", {"models": ["sft", "{wider}"]}, "merge.models", "cannot be merged with"),
    ("two directories of different sizes", {"models": ["{chat}", "{wider}"]}, "merge.models", "another size"),
    ("weights count", {"models": ["sft", "previous"], "weights": [1.0]}, "merge.weights", "1 weights for 2"),
    ("weights not summing to 1", {"models": ["sft", "previous"], "weights": [0.7, 0.7]}, "merge.weights", "sum to 1.4"),
    ("one model for a linear merge", {"models": ["sft"]}, "merge.models", "needs at least 2"),
    ("a directory without weights", {"models": ["sft", "{empty}"]}, "merge.models", "no model*.safetensors"),
    ("a damaged safetensors file", {"models": ["sft", "{damaged}"]}, "merge.models", "not a readable safetensors file"),
]


@pytest.mark.parametrize("merge, field, fragment", params(MERGE_CASES))
def test_merge_inputs(bad_input, tmp_path, models, merge, field, fragment):
    (tmp_path / "empty").mkdir()
    write(tmp_path / "damaged" / "model.safetensors", b"\x00" * 64)
    subst = {"empty": tmp_path / "empty", "damaged": tmp_path / "damaged"}
    for name in ("chat", "wider"):
        if any(f"{{{name}}}" in m for m in merge["models"]):
            subst[name] = getattr(models, name)
    merge = {**merge, "models": [m.format(**subst) for m in merge["models"]]}
    _pipeline(bad_input, tmp_path, [SFT, _stage("merge", "m", merge=merge)], field, fragment)


def test_task_arithmetic_first_without_a_model(bad_input, tmp_path, models):
    _pipeline(bad_input, tmp_path, [_stage("merge", "m", merge={"method": "task_arithmetic", "models": [models.chat]})],
              "merge.base=previous", "has no incoming model")


def test_merge_state_dict_reader_names_a_damaged_file(bad_input, tmp_path):
    from tether.recipes.merge import read_state_dict

    write(tmp_path / "m" / "model.safetensors", b"\x00" * 64)
    bad_input.call(read_state_dict, tmp_path / "m", field="merge.models", fragments=["not a readable safetensors"])


# ----------------------------------------------------------------------------- DPO and rejection sampling


DPO_CASES = [  # (id, dpo settings, field, fragment)
    ("unknown loss", {"loss": "orpo"}, "dpo.loss", "'orpo'"),
    ("file without a path", {"pairs": "file"}, "dpo.pairs_path", "dpo.pairs=file needs"),
    ("pairs file missing", {"pairs": "file", "pairs_path": "{missing}"}, "dpo.pairs_path", "file not found"),
    ("pairs line without rejected", {"pairs": "file", "pairs_path": "{pairs}"}, "pairs.jsonl:1", "\"rejected\""),
    ("delta without a strong model", {"pairs": "delta", "weak_model": "sft"}, "dpo.strong_model", "is not set"),
    ("delta weak model with another tokenizer", {"pairs": "delta", "strong_model": "sft", "weak_model": "{other}"},
     "dpo.weak_model", "its tokenizer differs"),
]


@pytest.mark.parametrize("dpo, field, fragment", params(DPO_CASES))
def test_dpo_inputs(bad_input, tmp_path, models, dpo, field, fragment):
    subst = {"missing": tmp_path / "nope.jsonl",
             "pairs": write(tmp_path / "pairs.jsonl", '{"prompt": "1+1=", "chosen": "2"}\n')}
    if "{other}" in str(dpo):
        subst["other"] = models.other_vocab
    dpo = {k: v.format(**subst) if isinstance(v, str) else v for k, v in dpo.items()}
    _pipeline(bad_input, tmp_path, [SFT, _stage("dpo", "dpo", dpo=dpo)], field, fragment)


def test_rs_sft_mix_file_missing(bad_input, tmp_path):
    _pipeline(bad_input, tmp_path, [SFT, _stage("rs_sft", "rs", rs_sft={"mix_path": str(tmp_path / "mix.jsonl")})],
              "rs_sft.mix_path", "file not found")


# ----------------------------------------------------------------------------- a later stage's own inputs


LATER_STAGE_CASES = [  # (id, stage-2 overrides (tmp substituted), field, fragment)
    ("data file missing", {"data": {"task": "jsonl", "path": "{tmp}/none.jsonl"}}, "data.path", "file not found"),
    ("no steps", {"train": {"steps": 0}}, "train.steps=0", "nothing to train"),
    ("reward model missing", {"reward": {"components": [{"name": "reward_model", "kwargs": {"path": "{tmp}/rm"}}]}},
     "kwargs.path", "no such directory"),
    ("LoRA target typo", {"model": {"lora": {"target_modules": ["q_proj", "v_prj"]}}}, "model.lora.target_modules",
     "'v_prj' names no module"),
]


@pytest.mark.parametrize("overrides, field, fragment", params(LATER_STAGE_CASES))
def test_a_later_stage_is_checked_before_the_first_runs(bad_input, tmp_path, overrides, field, fragment):
    text = yaml.safe_dump(overrides).replace("{tmp}", str(tmp_path))
    _pipeline(bad_input, tmp_path, [SFT, {"kind": "rl", "name": "rl", "overrides": yaml.safe_load(text)}], field,
              fragment, "pipeline stage 'rl' (pipeline.stages.1)")
