"""Re-rootable references (tether.runs.refs): a run's data, reward-model and agent-script paths, given
relative to the folder the run started in, still resolve from any working directory and after the
project (or only the run directory) is moved; never against the current working directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from tests.unit.runs.runs_helpers import tether, write_config
from tether.runs.refs import compute_refs, resolve_refs


def test_refs_keep_a_relative_and_an_absolute_form(tmp_path):
    (tmp_path / "proj" / "data").mkdir(parents=True)
    (tmp_path / "proj" / "data" / "t.jsonl").write_text("{}\n")
    (tmp_path / "proj" / "agent.py").write_text("print(1)\n")
    cfg = {"data": {"path": "data/t.jsonl"}, "harness": {"command": ["python", "agent.py", "--fast"]},
           "model": {"path": None}, "distill": {"teacher": "rl"}, "reward": {"components": [{"name": "exact_match"}]}}
    refs = compute_refs(cfg, tmp_path / "proj" / "runs" / "r", cwd=tmp_path / "proj", names=("rl",))
    assert set(refs) == {"data.path", "harness.command.1"}  # 'python', '--fast' and the stage name are not files
    assert refs["data.path"]["rel"] == "../../data/t.jsonl"
    assert refs["data.path"]["abs"] == str(tmp_path / "proj" / "data" / "t.jsonl")
    # the project moved as a whole: the relative form wins
    shutil.move(str(tmp_path / "proj"), tmp_path / "moved")
    out, problems = resolve_refs(json.loads(json.dumps(cfg)), refs, tmp_path / "moved" / "runs" / "r")
    assert problems == [] and out["data"]["path"] == str(tmp_path / "moved" / "data" / "t.jsonl")
    assert out["harness"]["command"] == ["python", str(tmp_path / "moved" / "agent.py"), "--fast"]
    # found nowhere: one line naming the key, both places and the fix
    out, problems = resolve_refs(json.loads(json.dumps(cfg)), refs, tmp_path / "elsewhere" / "r")
    assert len(problems) == 2 and problems[0].startswith("data.path='data/t.jsonl' is gone: neither ")
    assert "pass data.path=NEW_PATH" in problems[0]
    # a key the caller overrides is left alone
    out, problems = resolve_refs(json.loads(json.dumps(cfg)), refs, tmp_path / "elsewhere" / "r", skip=("data.path",))
    assert len(problems) == 1 and out["data"]["path"] == "data/t.jsonl"


def _project(root: Path) -> Path:
    """A project folder with its own data file and config, as a user keeps one."""
    (root / "data").mkdir(parents=True)
    rows = [{"prompt": w, "answer": w[::-1]} for w in ("abc", "hello", "tether", "model", "cat", "dog", "sun", "run")]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    write_config(root / "c.yaml", data={"task": "jsonl", "path": "data/train.jsonl", "train_size": 28, "eval_size": 4})
    return root


def test_eval_export_and_show_of_a_moved_run_from_another_folder(tmp_path, monkeypatch):
    proj = _project(tmp_path / "proj")
    monkeypatch.chdir(proj)
    r = tether("sft", "c.yaml", "--run-dir", "runs/s")  # every path relative to the project folder
    assert r.exit_code == 0, r.output
    pairs = [{"prompt": w, "chosen": w[::-1], "rejected": w} for w in ("abc", "hello", "tether", "model", "cat", "dog")]
    (proj / "data" / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    r = tether("rm", "c.yaml", "model.path=runs/s/final_model", "rm.pairs=data/pairs.jsonl", "rm.steps=2",
               "rm.batch_size=2", "--run-dir", "runs/rm")
    assert r.exit_code == 0, r.output
    r = tether("train", "c.yaml", "train.steps=1",
               "reward.components=[{name: exact_match}, {name: reward_model, weight: 0.1, kwargs: {path: runs/rm/final_model}}]",
               "model.path=runs/s/final_model", "--run-dir", "runs/rl")
    assert r.exit_code == 0, r.output
    rec = json.loads((proj / "runs" / "rl" / "run.json").read_text())
    assert set(rec["refs"]) == {"data.path", "model.path", "reward.components.1.kwargs.path"} and rec["parents"] == ["../s"]
    shutil.move(str(proj), tmp_path / "moved")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # nothing of the project is here
    for run in ("s", "rl"):
        target = tmp_path / "moved" / "runs" / run
        r = tether("eval", target, "--no-plot")
        assert r.exit_code == 0, r.output
        assert json.loads((target / "eval.json").read_text())["metrics"]["eval/problems"] == 2
        r = tether("export", target, "--out", tmp_path / "cwd" / f"x-{run}")
        assert r.exit_code == 0, r.output
        r = tether("show", target)
        assert r.exit_code == 0, r.output
        if run == "rl":  # its model is the moved SFT run's result, found from here
            assert f"model={tmp_path / 'moved' / 'runs' / 's' / 'final_model'}" in r.output
    stored = yaml.safe_load((tmp_path / "moved" / "runs" / "rl" / "config.yaml").read_text())
    assert stored["data"]["path"] == "data/train.jsonl"  # the record is never rewritten: resolved when read


def test_an_agent_script_given_relative_is_found_after_a_move(tmp_path, monkeypatch):
    from tether.api.run import load_run_config
    from tether.config import load_config
    from tether.runs.lifecycle import do_start_record

    proj = tmp_path / "proj"
    (proj / "agents").mkdir(parents=True)
    (proj / "agents" / "agent.py").write_text("print('hi')\n")
    monkeypatch.chdir(proj)
    cfg = load_config(None, ["harness.command=[python, agents/agent.py]"])
    run = proj / "runs" / "h"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    do_start_record(run, cfg, "rl")
    shutil.move(str(proj), tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    again = load_run_config(tmp_path / "moved" / "runs" / "h")
    assert again.harness.command == ["python", str(tmp_path / "moved" / "agents" / "agent.py")]
