"""Stage recipes without training: selective masking of error turns, which samples rejection
sampling keeps, how DPO pairs are built and read, merging files, the teacher-tokenizer check, and
the pipeline's one-line errors (unknown stage kind, missing model, bad pairs file)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from tether.train.batching import build_sequences
from tether.cli import app
from tether.config import ConfigError, TetherConfig, load_config
from tether.recipes.dpo import _accepted_vs_failed, _short_vs_long, load_pair_rows
from tether.recipes.merge import read_state_dict, write_model
from tether.recipes.multistage import plan_stages
from tether.recipes.rs_sft import build_rs_records, select_accepted
from tether.recipes.stage_common import find_error_turns, mask_error_turns
from tether.tasks import DataError
from tether.types import RewardResult, StopReason, Trajectory, TrajectoryGroup, Turn

runner = CliRunner()


def _traj(n_tokens: int, correct: bool, stop=StopReason.EOS, tid="t") -> Trajectory:
    turn = Turn(context_ids=(1, 2), action_ids=tuple(range(10, 10 + n_tokens)), action_logprobs=(0.0,) * n_tokens, finish=stop)
    return Trajectory(tid, (turn,), RewardResult(1.0 if correct else 0.0, correct=correct), stop)


def test_error_turn_is_masked_and_the_others_kept():
    # an episode: turn 0 acts (ids 5, 6), the env appends 7; turn 1 is a malformed tool call (8, 9);
    # turn 2 answers (11)
    turns = (Turn((1, 2), (5, 6), (0.0, 0.0)),
             Turn((1, 2, 5, 6, 7), (8, 9), (0.0, 0.0), info={"parse_errors": 1}),
             Turn((1, 2, 5, 6, 7, 8, 9, 7), (11,), (0.0,)))
    traj = Trajectory("e", turns, RewardResult(1.0, correct=True), StopReason.DONE)
    (rec,) = build_sequences(traj, 0, 0, True)
    assert rec.loss_mask == (0, 0, 1, 1, 0, 1, 1, 0, 1)
    assert find_error_turns(traj) == {1}
    masked = mask_error_turns(rec, find_error_turns(traj))
    assert masked.loss_mask == (0, 0, 1, 1, 0, 0, 0, 0, 1) and masked.ids == rec.ids
    assert mask_error_turns(rec, set()) is rec


def test_failed_tool_call_counts_as_an_error_turn():
    class Tr:  # an environment transition whose tool call failed (rollout.runner: res.info)
        info = {"tool_errors": 1}

    traj = Trajectory("e", (Turn((1,), (2,), (0.0,)), Turn((1, 2), (3,), (0.0,))), RewardResult(1.0, correct=True),
                      StopReason.DONE, info={"transitions": (object(), Tr())})
    assert find_error_turns(traj) == {1}


def test_rejection_sampling_selection_options():
    trajs = [_traj(5, True), _traj(3, True), _traj(2, False), _traj(9, True, StopReason.LENGTH), _traj(3, True)]
    assert [t.num_action_tokens for t in select_accepted(trajs, "all", 0)] == [5, 3, 3]  # wrong and truncated dropped
    assert [t.num_action_tokens for t in select_accepted(trajs, "shortest", 0)] == [3]
    assert [t.num_action_tokens for t in select_accepted(trajs, "at_most", 2)] == [5, 3]
    assert select_accepted([_traj(2, False)], "shortest", 1) == []
    cfg = TetherConfig.model_validate({"rs_sft": {"keep": "shortest"}})
    groups = [TrajectoryGroup("a", tuple(trajs)), TrajectoryGroup("b", (_traj(4, False),))]
    records, stats = build_rs_records(groups, cfg)
    assert len(records) == 1 and sum(records[0].loss_mask) == 3
    assert stats["rs/accepted"] == 4 and stats["rs/kept"] == 1 and stats["rs/problems_with_accepted"] == 1


def test_dpo_pairs_from_samples_and_short_long():
    g = TrajectoryGroup("a", (_traj(6, True), _traj(2, False), _traj(3, True), _traj(8, False)))
    c, r = _accepted_vs_failed(g, TetherConfig())
    assert (c.num_action_tokens, r.num_action_tokens) == (6, 2)
    c, r = _short_vs_long(g, TetherConfig())
    assert (c.num_action_tokens, r.num_action_tokens) == (3, 8)  # shortest correct vs the longest
    strict = TetherConfig.model_validate({"dpo": {"long_ratio": 3.0}})
    assert _short_vs_long(g, strict) is None  # nothing at least 9 tokens long
    assert _accepted_vs_failed(TrajectoryGroup("b", (_traj(2, True),)), TetherConfig()) is None


def test_pairs_file_with_a_missing_field_names_file_and_line(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n\n{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:3: missing or non-string field\(s\) \['rejected'\]"):
        load_pair_rows(p)
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    assert load_pair_rows(p) == [{"prompt": "a", "chosen": "b", "rejected": "c"}]


def test_merge_files_round_trip(tmp_path):
    from safetensors.torch import save_file

    for name, v in (("a", 1.0), ("b", 3.0)):
        (tmp_path / name).mkdir()
        save_file({"w": torch.full((2,), v)}, str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text("{}")
    from tether.algos.merge import compute_linear_merge

    merged = compute_linear_merge([read_state_dict(tmp_path / "a"), read_state_dict(tmp_path / "b")])
    out = write_model(tmp_path / "a", merged, tmp_path / "m")
    assert read_state_dict(out)["w"].tolist() == [2.0, 2.0] and (out / "config.json").is_file()
    with pytest.raises(ConfigError, match="no model\\*.safetensors"):
        read_state_dict(tmp_path / "m" / "nope")


def test_teacher_with_another_tokenizer_is_refused():
    from tether.policy.tiny import build_tokenizer

    a = build_tokenizer(["abc abc abd"] * 20, 300)
    b = build_tokenizer(["xyz xyz hello"] * 20, 300)
    from tether.errors import InputError
    from tether.policy.checks import check_same_vocab

    check_same_vocab(a, a, "distill.teacher=same", "model.path=s")
    with pytest.raises(InputError, match="distill.teacher=other: its tokenizer differs.*same base model"):
        check_same_vocab(a, b, "distill.teacher=other", "model.path=s")


def _write(tmp_path, text: str):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_unknown_stage_kind_exits_2_with_the_nearest_name(tmp_path):
    cfg = _write(tmp_path, "pipeline:\n  stages: [{kind: sft}, {kind: dpp}]\n")
    r = runner.invoke(app, ["pipeline", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2 and "unknown stage kind 'dpp' — did you mean 'dpo'?" in r.output
    assert not (tmp_path / "run").exists()


def test_stage_from_a_missing_model_or_stage_is_one_line(tmp_path):
    cases = {
        "pipeline:\n  stages: [{kind: rl, overrides: {model: {path: /nonexistent/m}}}]\n":
            "would start from a missing model: model.path=/nonexistent/m does not exist",
        "pipeline:\n  stages: [{kind: sft}, {kind: rl, start_from: rll}]\n": "start_from='rll' is not an earlier stage",
        "pipeline:\n  stages: [{kind: sft}, {kind: distill, overrides: {distill: {teacher: later}}}, {kind: rl, name: later}]\n":
            "distill.teacher='later' is neither an earlier stage (sft) nor an existing model directory",
        "pipeline:\n  stages: [{kind: sft, overrides: {sft: {stepz: 3}}}]\n": "pipeline stage 'sft' (pipeline.stages.0): unknown key 'sft.stepz'",
        "pipeline:\n  stages: [{kind: sft}, {kind: sft, name: sft}]\n": "stage name 'sft' is used twice",
    }
    for text, message in cases.items():
        r = runner.invoke(app, ["pipeline", str(_write(tmp_path, text)), "--run-dir", str(tmp_path / "run")])
        lines = [x for x in r.output.splitlines() if x.startswith("tether: error")]
        assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], (text, r.output)
    assert not (tmp_path / "run").exists()


def test_two_stage_default_and_stage_names():
    plan = plan_stages(TetherConfig())
    assert [(s.kind, s.name) for s, _ in plan] == [("sft", "sft"), ("rl", "rl")]
    cfg = TetherConfig.model_validate({"pipeline": {"stages": [{"kind": "rl"}, {"kind": "rl"}, {"kind": "eval"}]},
                                       "train": {"steps": 7}})
    plan = plan_stages(cfg)
    assert [s.name for s, _ in plan] == ["rl", "rl_2", "eval"] and plan[1][1]["train"]["steps"] == 7


def test_r1_config_has_the_five_r1_stages():
    cfg = load_config("configs/r1.yaml")
    kinds = [(s.name, s.kind) for s, _ in plan_stages(cfg)]
    assert kinds[1:] == [("rl_zero", "rl"), ("cold_start", "sft"), ("rl", "rl"), ("rs_sft", "rs_sft"), ("rl_final", "rl")]
    assert json.loads(json.dumps(cfg.model_dump(mode="json")))["pipeline"]["stages"][0]["kind"] == "sft"


def test_comparison_configs_plan_their_stages():
    plan = plan_stages(load_config("configs/distill_vs_rl.yaml"))
    assert [(s.name, s.kind, s.start_from) for s, _ in plan] == [
        ("base", "sft", None), ("teacher", "rl", None), ("distilled", "distill", "base"), ("rl_alone", "rl", "base")]
    assert plan[1][1]["train"]["steps"] == 80 and plan[2][1]["train"]["steps"] == plan[3][1]["train"]["steps"] == 20
    plan = plan_stages(load_config("configs/dpo_then_rl.yaml"))
    assert [s.start_from for s, _ in plan] == [None, None, None, "sft"] and plan[2][1]["algo"]["kl"]["coef"] == 0.0


def test_long2short_config_branches_every_method_from_the_long_start():
    plan = plan_stages(load_config("configs/long2short.yaml"))
    assert [(s.name, s.kind) for s, _ in plan] == [
        ("long", "sft"), ("rl_long", "rl"), ("short", "sft"), ("merged", "merge"), ("rs_short", "rs_sft"),
        ("dpo_short", "dpo"), ("rl_short", "rl")]
    start = {s.name: s.start_from for s, _ in plan}
    assert all(start[n] == "long" for n in ("short", "rs_short", "dpo_short", "rl_short"))
    data = {s.name: d for s, d in plan}
    assert data["short"]["data"]["task_kwargs"]["think_max"] == 0 and data["long"]["data"]["task_kwargs"]["think_min"] == 1
    assert data["merged"]["merge"]["models"] == ["long", "short"]
    assert data["rl_short"]["algo"]["shaping"]["length_penalty_coef"] > 0
    assert data["rl_long"]["algo"]["shaping"]["length_penalty_coef"] == 0
    assert data["rs_short"]["rs_sft"]["keep"] == "shortest" and data["dpo_short"]["dpo"]["pairs"] == "short_long"
