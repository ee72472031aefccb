"""The multi-run engine (tether.runs.engine): one resume rule, one progress display, one summary
format, one record of which runs belong to a multi-run — and each owner (sweep, pipeline, context
comparison, faultbench) going through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.runs.engine import Interrupted, Member, Plan, members_table, read_marker, run_members
from tether.runs.record import read_record


class Calls:
    """An execute function that records (name, resume) and writes a file into the member's directory."""

    def __init__(self, fail: str | None = None, stop: str | None = None):
        self.calls: list[tuple[str, bool]] = []
        self.fail, self.stop = fail, stop

    def __call__(self, m: Member, resume: bool):
        self.calls.append((m.name, resume))
        m.path.mkdir(parents=True, exist_ok=True)
        (m.path / "out.txt").write_text(m.name)
        if m.name == self.fail:
            raise ValueError(f"{m.name} broke")
        return {"name": m.name, "interrupted": m.name == self.stop}


def collect(m: Member, result):
    if result is not None and result["interrupted"]:
        return Interrupted("stopped by Ctrl-C")
    return {"value": len(m.name)} if (m.path / "out.txt").is_file() else None


def _members(root: Path, names=("a", "bb", "ccc")) -> list[Member]:
    return [Member(n, root / n, "sft") for n in names]


def test_members_run_in_order_are_recorded_and_reused(tmp_path):
    lines: list[str] = []
    calls = Calls()
    out = run_members(tmp_path, "test", _members(tmp_path), Plan(calls, collect, describe=lambda v: f"v={v['value']}"),
                      lines.append)
    assert [c[0] for c in calls.calls] == ["a", "bb", "ccc"] and [o.status for o in out] == ["ran"] * 3
    assert read_marker(out[1].member) == {"member": "bb", "value": {"value": 2}}
    rec = read_record(tmp_path)  # which runs belong to the multi-run
    assert [(m["name"], m["path"], m["status"]) for m in rec.members] == [("a", "a", "ran"), ("bb", "bb", "ran"),
                                                                          ("ccc", "ccc", "ran")]
    assert lines[0] == f"[tether test] 3 runs: 0 done, 3 to run -> {tmp_path}"
    assert any(x.startswith("[tether test] 2/3 bb: v=2 (") and "ETA" in x for x in lines)
    again = Calls()
    out = run_members(tmp_path, "test", _members(tmp_path), Plan(again, collect), lines.append)
    assert again.calls == [] and [o.status for o in out] == ["reused"] * 3 and out[2].value == {"value": 3}
    table = members_table(tmp_path, out)
    assert table[0] == {"name": "a", "kind": "sft", "path": "a", "status": "reused", "seconds": 0.0, "message": ""}


def test_an_unfinished_member_resumes_from_its_checkpoint_else_starts_afresh(tmp_path):
    ms = _members(tmp_path)
    (tmp_path / "a" / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "a" / "checkpoints" / "step_000002" / "trainer_state.pt").write_bytes(b"x")
    (tmp_path / "bb").mkdir()
    (tmp_path / "bb" / "metrics.jsonl").write_text("{}\n")  # killed before its first checkpoint
    calls = Calls()
    run_members(tmp_path, "test", ms, Plan(calls, collect), lambda m: None)
    assert calls.calls == [("a", True), ("bb", False), ("ccc", False)]
    assert (tmp_path / "bb.incomplete-1" / "metrics.jsonl").is_file()  # moved aside, never deleted


def test_a_failed_member_is_listed_and_the_others_run_or_not(tmp_path):
    out = run_members(tmp_path, "t", _members(tmp_path), Plan(Calls(fail="bb"), collect), lambda m: None)
    assert [o.status for o in out] == ["ran", "failed", "ran"] and "bb broke" in out[1].message
    assert read_marker(out[1].member) is None  # not done: run again next time
    out = run_members(tmp_path / "s", "t", _members(tmp_path / "s"), Plan(Calls(fail="a"), collect, stop_on_failure=True),
                      lambda m: None)
    assert [o.status for o in out] == ["failed"]
    with pytest.raises(ValueError, match="a broke"):
        run_members(tmp_path / "r", "t", _members(tmp_path / "r"), Plan(Calls(fail="a"), collect, raise_errors=True),
                    lambda m: None)


def test_an_interrupted_member_stops_the_run_and_is_not_done(tmp_path):
    calls = Calls(stop="bb")
    out = run_members(tmp_path, "t", _members(tmp_path), Plan(calls, collect), lambda m: None)
    assert [o.status for o in out] == ["ran", "interrupted"] and [c[0] for c in calls.calls] == ["a", "bb"]
    assert read_marker(out[1].member) is None


def test_parallel_members_in_threads_and_recollected_values(tmp_path):
    calls = Calls()
    out = run_members(tmp_path, "t", _members(tmp_path), Plan(calls, collect, workers=2), lambda m: None)
    assert sorted(c[0] for c in calls.calls) == ["a", "bb", "ccc"] and all(o.ok for o in out)
    seen = []
    plan = Plan(Calls(), lambda m, r: seen.append(m.name) or {"value": 7}, recollect=True)
    out = run_members(tmp_path, "t", _members(tmp_path), plan, lambda m: None)
    assert [o.value for o in out] == [{"value": 7}] * 3 and seen == ["a", "bb", "ccc"]  # read from the runs again


def square(m: Member, resume: bool) -> int:  # module level: it runs in a forked worker
    m.path.mkdir(parents=True, exist_ok=True)
    return m.data * m.data


def test_parallel_members_in_forked_processes(tmp_path):
    ms = [Member(f"m{i}", tmp_path / f"m{i}", None, i) for i in range(3)]
    out = run_members(tmp_path, "t", ms, Plan(square, lambda m, r: {"sq": r}, workers=2, pool="process"), lambda m: None)
    assert [o.value["sq"] for o in out] == [0, 1, 4]


# ------------------------------------------------------------------ the owners go through it


def test_a_sweep_records_its_runs_and_reports_progress(tmp_path):
    from tether.sweep import SweepSpec, run_sweep

    def fake(argv, run_dir, log_path):
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
        return 0

    lines: list[str] = []
    run_sweep(SweepSpec(grid={"rollout.n": ["2", "4"]}, seeds=[0]), {}, tmp_path, run_fn=fake, log=lines.append)
    rec = read_record(tmp_path)
    assert rec.kind == "sweep" and rec.status == "complete"
    assert [m["path"] for m in rec.members] == ["rollout.n=2/seed-0", "rollout.n=4/seed-0"]
    assert any(x.startswith("[tether sweep] 2/2 rollout.n=4 seed 0: final_accuracy=0.5") for x in lines)


def test_faultbench_runs_its_cases_through_the_engine(tmp_path, monkeypatch):
    import tether.recipes.faultbench as fb

    ran: list[str] = []

    def fake_case(case, *args):
        ran.append(case.id)
        rec = {"case": {"fault": case.fault, "severity": case.severity, "seed": case.seed, "mode": case.mode,
                        "variant": case.variant}, "id": case.id, "final_train_acc": 0.5}
        if case.seed == 1 and len([r for r in ran if r == case.id]) == 1:
            rec["error"] = "a benchmark bug"  # recorded, and run again next time
        return rec

    monkeypatch.setattr(fb, "run_case", fake_case)
    cases = [fb.Case(None, None, s, "advise") for s in (0, 1)]
    lines: list[str] = []
    recs = fb.run_cases(tmp_path, cases, (), 1, lines.append)
    assert sorted(r["id"] for r in recs) == sorted(c.id for c in cases) and sum("error" in r for r in recs) == 1
    assert any("2/2" in x and "failed: RuntimeError: a benchmark bug" in x for x in lines)
    recs = fb.run_cases(tmp_path, cases, (), 1, lines.append)
    assert ran == [cases[0].id, cases[1].id, cases[1].id]  # only the errored case ran again
    assert all("error" not in r for r in recs) and len(recs) == 2
    assert len((tmp_path / "cases.jsonl").read_text().splitlines()) == 3  # scoring's input keeps every record


def test_a_context_comparison_resumes_through_the_engine(tmp_path, monkeypatch):
    import tether.recipes.pipeline as pl
    from tether.config import load_config

    ran: list[tuple[str, bool]] = []

    def fake_pipeline(cfg, run_dir, log=print, resume=False, overwrite=False):
        ran.append((Path(run_dir).name, resume))
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "run.json").write_text(json.dumps({"kind": "pipeline"}))
        summary = {"complete": cfg.env.context.builder != "summary" or resume, "final_accuracy": 0.5,
                   "baseline_accuracy": 0.25, "accuracy_lift": 0.25, "wall_seconds": 1.0, "rl_run": str(run_dir)}
        (Path(run_dir) / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(pl, "run_pipeline", fake_pipeline)
    cfg = load_config(None, ["data.task=reverse"])
    first = pl.run_context_comparison(cfg, tmp_path / "c", ("append", "summary"), log=lambda m: None)
    assert not first["complete"] and list(first["by_builder"]) == ["append"]
    second = pl.run_context_comparison(cfg, tmp_path / "c", ("append", "summary"), log=lambda m: None, resume=True)
    assert ran == [("append-s0", False), ("summary-s0", False), ("summary-s0", True)]  # the finished one is reused
    assert second["complete"] and [m["status"] for m in second["members"]] == ["reused", "ran"]
    assert read_record(tmp_path / "c").kind == "compare_context"
