"""Which model is a run's result (tether.runs.result): the final model, never a stale periodic
checkpoint; a checkpoint only when asked (--step) or when the run did not finish, said in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.unit.runs.runs_helpers import tether, write_config


def _weights(d):
    return load_file(str(d / "model.safetensors"))


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """`tether sft` with sft.steps=5 and checkpoint.every=2: checkpoints at steps 2 and 4, final model at 5."""
    root = tmp_path_factory.mktemp("result")
    cfg = write_config(root / "c.yaml")
    r = tether("sft", cfg, "--run-dir", root / "sft")
    assert r.exit_code == 0, r.output
    return root / "sft"


def test_eval_and_export_use_the_final_model_not_the_last_periodic_checkpoint(sft_run, tmp_path):
    run = sft_run
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000002", "step_000004"]
    final, stale = _weights(run / "final_model"), _weights(run / "checkpoints" / "step_000004")
    assert not _same(final, stale)  # step 5 moved the weights: evaluating step 4 would be a stale result
    r = tether("export", run, "--out", tmp_path / "plain")
    assert r.exit_code == 0, r.output
    assert _same(_weights(tmp_path / "plain"), final)
    assert "note" not in r.output  # the final model of a finished run: nothing to say
    r = tether("eval", run, "--no-plot", "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["model"].endswith("final_model")


def test_record_says_what_the_run_produced(sft_run):
    from tether.runs.record import read_record

    rec = read_record(sft_run)
    assert (rec.kind, rec.status, rec.result, rec.result_step, rec.steps_planned) == ("sft", "complete", "final_model", 5, 5)
    assert rec.chat_template is False and rec.lora is False


def test_step_chooses_a_checkpoint_and_says_so(sft_run, tmp_path):
    r = tether("export", sft_run, "--out", tmp_path / "s2", "--step", "2")
    assert r.exit_code == 0, r.output
    assert _same(_weights(tmp_path / "s2"), _weights(sft_run / "checkpoints" / "step_000002"))
    assert "note: using checkpoints/step_000002 (--step 2)" in r.output
    r = tether("export", sft_run, "--out", tmp_path / "s3", "--step", "3")
    assert r.exit_code == 2 and "no usable checkpoint at step 3" in r.output and "2, 4" in r.output
    assert not (tmp_path / "s3").exists()


def test_an_interrupted_run_uses_its_last_model_and_says_so(tmp_path):
    from tether.runs.record import update_record
    from tether.runs.result import resolve_result

    run = tmp_path / "run"
    (run / "final_model").mkdir(parents=True)
    (run / "final_model" / "config.json").write_text("{}")
    update_record(run, kind="sft", status="interrupted", result="final_model", result_step=3, steps_planned=5)
    res = resolve_result(run)
    assert res.path == run / "final_model" and "interrupted at step 3 of 5" in res.note


def test_a_killed_run_uses_its_latest_checkpoint_and_says_so(sft_run, tmp_path):
    import shutil

    from tether.runs.record import update_record
    from tether.runs.result import resolve_result

    run = tmp_path / "killed"
    shutil.copytree(sft_run, run)
    shutil.rmtree(run / "final_model")
    (run / "summary.json").unlink()
    update_record(run, status="running", result=None, result_step=None)  # as a kill -9 leaves it
    res = resolve_result(run)
    assert res.path.name == "step_000004" and "did not finish" in res.note


def test_a_failed_export_leaves_no_half_written_folder(sft_run, tmp_path, monkeypatch):
    import tether.api.export as ex

    def broken(model_dir, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # half written, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ex, "_write_plain", broken)
    with pytest.raises(OSError):
        ex.export(sft_run, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    monkeypatch.undo()
    assert ex.export(sft_run, tmp_path / "out") == tmp_path / "out"  # the retry is not blocked
