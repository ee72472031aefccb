"""The composition matrix (docs/design.md, "The run model"): every command on every kind of run, with
LoRA on and off and chat and raw prompts, and every command on moved runs from another folder.

Targets (tests/unit/runs/farm.py, built once per session): sft and rl runs x LoRA on/off x chat/raw
prompts; a pipeline (sft -> rl); a LoRA pipeline through every stage kind, whose stage folders are
runs of kinds sft, rl, rs_sft, dpo, distill, merge and eval; a reward model; a sweep; a context
comparison. Commands: eval, export, show, doctor, report, compare, plan and resume. A cell passes
when the command does the meaningful thing for that kind, or refuses in one line (exit 2) naming what
does work on that kind (REFUSED)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.runs.farm import SWEEP_ARGS, TARGETS, Farm, no_plots
from tests.unit.runs.runs_helpers import tether

COMMANDS = ("eval", "export", "show", "doctor", "report", "compare", "plan", "resume")
MULTI = ("sweep", "compare_context")
# (kind, command) -> what the one-line refusal says (it names what does work)
REFUSED = {
    **{(k, c): "runs with one result each" for k in MULTI for c in ("eval", "export", "plan")},
    **{(k, "compare"): "takes one of them" for k in MULTI},
    ("compare_context", "report"): "takes one of them",
    ("rm", "plan"): "is a reward-model run: a plan samples a policy",
    ("rm", "resume"): "a reward-model run does not resume",
    **{(k, "resume"): f"holds a {k} run: resume it with `tether pipeline (its {k} stage) ... --resume`"
       for k in ("rs_sft", "dpo", "distill", "merge", "eval")},
}
RL_KINDS = ("rl", "distill")


@pytest.fixture(scope="session")
def farm(tmp_path_factory, worker_id):
    # one farm for the whole session: under xdist every worker's basetemp shares this parent
    base = tmp_path_factory.getbasetemp()
    return Farm((base.parent if worker_id != "master" else base) / "tether-matrix")


def _error_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith("tether: error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def _resume_args(target: str, kind: str, run: Path) -> list:
    cfg = run / ("base.yaml" if kind == "sweep" else "config.yaml")
    command = {"sft": "sft", "rm": "rm", "pipeline": "pipeline", "compare_context": "compare-context"}.get(kind, "train")
    if kind == "sweep":
        return ["sweep", cfg, *SWEEP_ARGS, "--out", run]
    extra = ["--builders", "append"] if kind == "compare_context" else []
    return [command, cfg, *extra, "--resume", "--run-dir", run]


def run_cell(farm: Farm, target: str, command: str, tmp: Path, run: Path | None = None):
    """Run `command` on the farm's `target` (or on `run`, a copy of it); returns the click Result."""
    kind = TARGETS[target]
    run = run or farm.get(target)
    if command == "eval":
        return tether("eval", run, "--no-plot", "--out", tmp / "eval")
    if command == "export":
        return tether("export", run, "--out", tmp / "model")
    if command in ("show", "doctor"):
        return tether(command, run)
    if command == "report":
        return tether("report", run, "--out", tmp / "report.html")
    if command == "compare":
        return tether("compare", run, farm.get("train"), "--out", tmp / "compare.html")
    if command == "plan":
        return tether("plan", run, "--budget", "8", "--pilot-problems", "2", "--pilot-samples", "2", "--min-steps", "1")
    copy = tmp / "copy"  # resume changes a run: on a copy
    shutil.copytree(run, copy)
    with no_plots():
        return tether(*_resume_args(target, kind, copy))


def check_cell(r, target: str, command: str, tmp: Path, run: Path) -> None:
    """The meaningful thing for this kind, or a one-line refusal naming what works."""
    kind = TARGETS[target]
    if (kind, command) in REFUSED:
        assert r.exit_code == 2, r.output
        assert REFUSED[(kind, command)] in _error_line(r.output)
        return
    assert r.exit_code == 0, r.output
    if command == "eval":
        import tether

        ev = json.loads((tmp / "eval" / "eval.json").read_text())
        assert ("rm/eval_pair_accuracy" in ev) if kind == "rm" else (0 <= ev["metrics"]["eval/pass@1"] <= 1)
        # the run's result model (a pipeline's: its last stage's result), wherever the run now lives
        assert Path(ev["model"]).resolve() == tether.open_run(run).result_model().resolve(), ev["model"]
    elif command == "export":
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        cls = AutoModelForSequenceClassification if kind == "rm" else AutoModelForCausalLM
        model = cls.from_pretrained(str(tmp / "model"))  # a plain model: no peft needed
        assert not any("lora" in n for n, _ in model.named_parameters())
    elif command == "show":
        assert f"kind: {kind} (" in r.output
        for m in json.loads((run / "run.json").read_text())["members"]:  # a pipeline's stages, a sweep's runs
            assert f"  {m['path']} " in r.output, (m, r.output)
        # RL settings only for RL runs (and runs with an RL stage), never for an SFT, DPO or reward-model run
        assert ("advantage=" in r.output) == (kind in ("rl", "pipeline", "compare_context")), r.output
    elif command == "doctor":
        status = r.output.splitlines()[1]
        expect = {"merge": "NOTHING TO JUDGE", "eval": "NOTHING TO JUDGE", "sft": "sft/loss", "rs_sft": "sft/loss",
                  "dpo": "dpo/loss", "rm": "pair accuracy", "rl": "step", "distill": "step"}.get(kind, "")
        assert status.startswith("status: ") and expect in status, status
        assert " in 0 steps" not in status  # never HEALTHY over nothing
        if kind in ("pipeline", "sweep", "compare_context"):  # one line per stage / run, after the summary
            members = len(json.loads((run / "run.json").read_text())["members"])
            assert len([x for x in r.output.splitlines() if x.startswith("  ")]) == members >= 1
    elif command == "report":
        assert (tmp / "report.html").read_text().startswith(("<!DOCTYPE html>", "<!doctype html>"))
    elif command == "resume":
        assert "Traceback" not in r.output


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_command_on_every_kind(farm, target, command, tmp_path):
    check_cell(run_cell(farm, target, command, tmp_path), target, command, tmp_path, farm.get(target))


MOVED = ("sft-lora-chat", "train", "pipeline-lora", "rm", "sweep")


@pytest.fixture(scope="module")
def moved(farm, tmp_path_factory):
    """The farm's runs copied to another place (the farm itself stays), and a working directory
    that holds nothing of theirs."""
    dest = tmp_path_factory.mktemp("moved")
    for name in MOVED:
        shutil.copytree(farm.get(name), dest / "runs" / name)
    (dest / "cwd").mkdir()
    return dest


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("target", MOVED)
def test_every_command_on_a_moved_run_from_another_folder(farm, moved, target, command, tmp_path, monkeypatch):
    monkeypatch.chdir(moved / "cwd")
    run = moved / "runs" / target
    check_cell(run_cell(farm, target, command, tmp_path, run=run), target, command, tmp_path, run)


def test_a_lora_pipeline_hands_each_stage_the_previous_result(farm):
    """Every later stage starts from the previous stage's result (never a periodic checkpoint); every
    LoRA stage trains on a full base saved in its own folder (docs/lora.md)."""
    pipe = farm.get("pipeline-lora")
    rows = {r["name"]: r for r in json.loads((pipe / "summary.json").read_text())["stages"]}
    assert rows["rl"]["started_from"].endswith("sft/final_model")  # sft.steps=5, checkpoint.every=2: not step_4
    for stage in ("rl", "rs", "dpo", "distill"):
        base = pipe / stage / "base_model"
        assert (base / "config.json").is_file() and (base / "model.safetensors").is_file(), stage
        assert json.loads((Path(rows[stage]["model"]) / "adapter_config.json").read_text())[
            "base_model_name_or_path"] == str(base.resolve())
    assert rows["merged"]["model"].endswith("merged/final_model") and rows["final"]["model"] == rows["merged"]["model"]


def test_sweep_metric_catalogue_matches_real_summaries(farm):
    """`tether sweep --metric` is checked against tether.sweep.SUMMARY_KEYS before any run: the keys
    the recipes really write must all be there."""
    from tether.sweep import SUMMARY_KEYS

    for name, command in (("sft", "sft"), ("train", "train"), ("pipeline", "pipeline")):
        summary = json.loads((farm.get(name) / "summary.json").read_text())
        stage_seconds = {k for k in summary if k.endswith("_seconds") and k[:-8] in ("sft", "rl")}
        assert set(summary) - set(SUMMARY_KEYS[command]) - stage_seconds == set(), name
