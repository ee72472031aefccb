"""Multi-stage pipelines from one config: `pipeline.stages: [{kind, name, overrides, start_from}]`.

    tether pipeline configs/r1.yaml [--run-dir D] [--resume]

Each stage is one recipe (sft, rl, rs_sft, dpo, distill, merge, eval) run on the base config with
the stage's `overrides` merged in, in its own folder `<run>/<name>/` (a complete run directory:
config, metrics, checkpoints, summary). The model a stage ends with — `final_model/`, or the
latest checkpoint of an RL-style stage — is handed to the next stage as `model.path` (or to the
stage named by `start_from`). After every stage the model is evaluated on the held-out problems
with the base config's `eval` section, and `<run>/summary.json` lists those metrics stage by stage
(pass@1, greedy accuracy, mean answer tokens).

Resume (`--resume`): stages with a `stage.json` are done and skipped; the first unfinished stage
resumes from its latest checkpoint (exact: the stage recipes checkpoint their data order, RNG and
optimiser), and the pipeline carries on. Stage names in `start_from`, `distill.teacher`,
`dpo.strong_model`/`weak_model` and `merge.models`/`merge.base` refer to earlier stages' models.

Deliberate simplifications: stages run one after the other in this process; every stage reloads
its starting model from disk (so a resumed and an uninterrupted pipeline start each stage from
the same bytes); all stages share `run.seed`.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Callable

from tether.config import ConfigError, TetherConfig, build_config
from tether.io.run_dir import make_run_dir
from tether.runs.engine import Interrupted, Member, Outcome, Plan, run_members
from tether.runs.lifecycle import do_finish_run, do_start_record
from tether.runs.record import read_record, update_record
from tether.runs.resume import check_config_resume, is_resumable_change
from tether.config.stages import StageConfig

DEFAULT_STAGES = (StageConfig(kind="sft", name="sft"), StageConfig(kind="rl", name="rl"))
DONE = "stage.json"


def _sft(cfg: TetherConfig, d: Path, resume: bool) -> dict[str, Any]:
    from tether.recipes.sft import run_sft

    return run_sft(cfg, d, resume=resume)[1]


def _rl(cfg: TetherConfig, d: Path, resume: bool) -> dict[str, Any]:
    from tether.recipes.rl import run_rl

    return run_rl(cfg, d, resume=resume)


def _eval(cfg: TetherConfig, d: Path, resume: bool) -> dict[str, Any]:
    """The eval stage: the incoming model on the held-out problems (the pipeline records it)."""
    from tether.runs.lifecycle import do_finish_run, do_start_record

    rd = make_run_dir(d)
    rd.write_config(cfg)
    do_start_record(rd.root, cfg, "eval")
    summary = {"kind": "eval", "model": cfg.model.path}
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, cfg.model.path)  # its result is the model it evaluated
    return summary


def _lazy(module: str, fn: str) -> Callable[[TetherConfig, Path, bool], dict[str, Any]]:
    def run(cfg: TetherConfig, d: Path, resume: bool) -> dict[str, Any]:
        import importlib

        return getattr(importlib.import_module(module), fn)(cfg, d, resume=resume)

    return run


STAGE_RUNNERS: dict[str, Callable[[TetherConfig, Path, bool], dict[str, Any]]] = {
    "sft": _sft, "rl": _rl, "eval": _eval,
    "rs_sft": _lazy("tether.recipes.rs_sft", "run_rs_sft"), "dpo": _lazy("tether.recipes.dpo", "run_dpo"),
    "distill": _lazy("tether.recipes.distill", "run_distill"), "merge": _lazy("tether.recipes.merge", "run_merge"),
}
# settings that may name an earlier stage instead of a directory: (section, field, is a list)
MODEL_REFS = (("distill", "teacher", False), ("dpo", "strong_model", False), ("dpo", "weak_model", False),
              ("merge", "models", True), ("merge", "base", False))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def plan_stages(cfg: TetherConfig) -> list[tuple[StageConfig, dict[str, Any]]]:
    """(stage, its config as data) for every stage, validated: names unique, overrides valid,
    model references naming an earlier stage or an existing directory. Raises ConfigError."""
    stages = list(cfg.pipeline.stages) or list(DEFAULT_STAGES)
    base = cfg.model_dump(mode="json")
    out, seen = [], []
    for i, st in enumerate(stages):
        name = st.name or (st.kind if all(s.kind != st.kind for s in stages[:i]) else f"{st.kind}_{i + 1}")
        if name in seen or "/" in name or name.startswith("."):
            raise ConfigError(f"pipeline.stages.{i}: stage name {name!r} is {'used twice' if name in seen else 'not a folder name'}; "
                              "give each stage a distinct name")
        data = _deep_merge(base, st.overrides)
        where = f"pipeline stage {name!r} (pipeline.stages.{i})"
        build_config(data, where)  # unknown keys, bad values: one line naming the stage
        _check_refs(st, data, seen, where, base["model"].get("path"))
        out.append((st.model_copy(update={"name": name}), data))
        seen.append(name)
    return out


def _check_refs(st: StageConfig, data: dict[str, Any], earlier: list[str], where: str, base_path: str | None) -> None:
    """A stage's own model.path and every model reference must exist (the base config's model.path
    is checked where it is loaded, with the loader's message)."""
    def ok(ref: str | None) -> bool:
        return ref is None or ref == "previous" or ref in earlier or Path(ref).is_dir()

    if st.start_from is not None and st.start_from not in earlier:
        raise ConfigError(f"{where}: start_from={st.start_from!r} is not an earlier stage (earlier: {', '.join(earlier) or 'none'})")
    path = data["model"].get("path")
    if path and path != base_path and not Path(path).is_dir():
        raise ConfigError(f"{where} would start from a missing model: model.path={path} does not exist")
    for section, key, many in MODEL_REFS:
        for ref in (data[section][key] or []) if many else [data[section][key]]:
            if not ok(ref):
                raise ConfigError(f"{where}: {section}.{key}={ref!r} is neither an earlier stage "
                                  f"({', '.join(earlier) or 'none yet'}) nor an existing model directory")


def _resolve(data: dict[str, Any], models: dict[str, str], incoming: str | None) -> dict[str, Any]:
    """Stage names -> their model directories; `model.path` <- the incoming model."""
    data = copy.deepcopy(data)
    if incoming:
        data["model"]["path"] = incoming
    for section, key, many in MODEL_REFS:
        val = data[section][key]
        if many:
            data[section][key] = [models.get(v, v) for v in val or []]
        elif val is not None:
            data[section][key] = models.get(val, val)
    return data


def stage_model(sdir: Path, incoming: str | None) -> str | None:
    """The model a finished stage hands on: its result (tether.runs.result: final_model/, or an
    RL-style stage's final checkpoint; never a periodic one), else the model it started from."""
    from tether.runs.result import NoResult, resolve_result

    try:
        return str(resolve_result(sdir).path)
    except NoResult:
        return incoming


def run_stages(cfg: TetherConfig, run_dir: str | Path, resume: bool = False, log=print) -> dict[str, Any]:
    """Run (or resume) every stage through the multi-run engine (tether.runs.engine: a stage with a
    recorded outcome is done; an unfinished one resumes from its checkpoint); returns the pipeline
    summary written to summary.json. A resume checks the config first (`check_pipeline_resume`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_stages(cfg)
    rd = make_run_dir(run_dir)
    if resume:
        check_pipeline_resume(rd, cfg, log)  # refused: nothing below runs, nothing is rewritten
        if read_record(rd.root).kind is None:  # a pipeline written before the record, or none yet
            do_start_record(rd.root, cfg, "pipeline")
        update_record(rd.root, status="running")
    rd.write_config(cfg)
    models: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    state: dict[str, Any] = {"incoming": cfg.model.path, "interrupted": None}
    members = [Member(st.name, rd.root / st.name, st.kind, (i, st, data)) for i, (st, data) in enumerate(plan)]

    def execute(m: Member, resume_stage: bool) -> tuple[dict[str, Any], TetherConfig, str | None]:
        i, st, data = m.data
        start = models[st.start_from] if st.start_from else state["incoming"]
        if start and start != cfg.model.path and not Path(start).is_dir():  # an earlier stage's output
            raise ConfigError(f"pipeline stage {st.name!r} would start from a missing model: {start} is gone "
                              "(restore it, or rerun the pipeline into a fresh --run-dir)")
        stage_cfg = build_config(_resolve(data, models, start), f"pipeline stage {st.name!r}")
        log(f"[tether pipeline] stage {i + 1}/{len(plan)} {st.name} ({st.kind}) from {start or 'a new tiny model'}")
        return STAGE_RUNNERS[st.kind](stage_cfg, m.path, resume_stage), stage_cfg, start

    def collect(m: Member, result: Any) -> dict[str, Any] | Interrupted:
        from tether.recipes.stage_common import evaluate_policy, load_model_dir

        summary, stage_cfg, start = result
        if summary.get("interrupted"):
            return Interrupted(f"interrupted; resume with --resume --run-dir {rd.root}")
        model = stage_model(m.path, start)  # its result: final model or final checkpoint, never a periodic one
        heldout = evaluate_policy(stage_cfg, load_model_dir(model, stage_cfg, f"stage {m.name} output"))
        return {"name": m.name, "kind": m.kind, "model": model, "started_from": start, "heldout": heldout,
                "steps": summary.get("steps"), "precision": summary.get("precision")}

    def on_outcome(o: Outcome) -> None:
        if o.status == "interrupted":
            state["interrupted"] = o.member.name
            return
        if not o.ok:
            return
        row = {**o.value, "seconds": o.value.get("seconds", o.seconds)}
        models[row["name"]] = state["incoming"] = row["model"]
        rows.append(row)
        h = row["heldout"]
        log(f"[tether pipeline] after {row['name']}: held-out pass@1 {h.get('eval/pass@1', float('nan')):.3f}"
            + (f", {h['eval/answer_tokens']:.1f} tokens per answer" if "eval/answer_tokens" in h else ""))
        _write_summary(rd, cfg, rows, (t0, c0), len(plan))

    engine = Plan(execute, collect, describe=lambda v: f"pass@1 {v['heldout'].get('eval/pass@1', float('nan')):.3f}",
                  recorded=_legacy_stage_row, marker=DONE, raise_errors=True, stop_on_failure=True)
    run_members(rd.root, "pipeline", members, engine, log, on_outcome=on_outcome)
    return _write_summary(rd, cfg, rows, (t0, c0), len(plan), interrupted=state["interrupted"])


def _legacy_stage_row(m: Member) -> dict[str, Any] | None:
    """A stage finished before the engine recorded outcomes: its stage.json held the row itself."""
    try:
        row = json.loads((m.path / DONE).read_text())
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) and "heldout" in row else None


def is_pipeline_resumable(key: str, old_stages: int) -> bool:
    """A change a resumed pipeline may make: any of `tether train --resume`'s (steps, learning rates,
    evaluation, logging, ...), the same inside a stage's overrides, or a stage appended at the end."""
    if is_resumable_change(key):
        return True
    parts = key.split(".")
    if parts[:2] != ["pipeline", "stages"] or len(parts) < 4 or not parts[2].isdigit():
        return False
    if int(parts[2]) >= old_stages:
        return True  # appended: the stages before it are unchanged
    return parts[3] == "overrides" and is_resumable_change(".".join(parts[4:]))


def check_pipeline_resume(rd, cfg: TetherConfig, log=print) -> dict[str, tuple[Any, Any]]:
    """Compare the resumed config with the pipeline's stored one: allowed changes are returned and
    recorded (events.jsonl), any other refused (RunDirError naming each key); stages already done keep
    their results either way."""
    import yaml

    stored = yaml.safe_load(rd.config_path.read_text()) if rd.config_path.is_file() else None
    if not isinstance(stored, dict):
        return {}
    old = len((stored.get("pipeline") or {}).get("stages") or [])
    return check_config_resume(rd, stored, cfg.model_dump(mode="json"), lambda k: is_pipeline_resumable(k, old),
                               "its finished stages were trained with the stored config", log)


def _write_summary(rd, cfg: TetherConfig, rows: list[dict[str, Any]], clocks: tuple[float, float], planned: int,
                   interrupted: str | None = None) -> dict[str, Any]:
    """summary.json: the stages side by side, plus the first/last-stage figures the two-stage
    pipeline always reported (baseline = after the first stage, final = after the last)."""
    first, last = (rows[0]["heldout"], rows[-1]["heldout"]) if rows else ({}, {})
    b, f = first.get("eval/pass@1"), last.get("eval/pass@1")
    by_kind = {r["kind"]: r for r in rows}
    summary = {
        "kind": "pipeline", "task": cfg.data.task, "context_builder": cfg.env.context.builder, "seed": cfg.run.seed,
        "stages": rows, "interrupted_in": interrupted,
        "complete": interrupted is None and len(rows) == planned,  # written after every stage: done only when True
        "baseline_accuracy": b, "final_accuracy": f, "accuracy_lift": None if b is None or f is None else f - b,
        "baseline_greedy_accuracy": first.get("eval/greedy_accuracy"), "final_greedy_accuracy": last.get("eval/greedy_accuracy"),
        "final_turns_mean": last.get("eval/turns_mean"), "final_answer_tokens": last.get("eval/answer_tokens"),
        **{f"{r['name']}_seconds": r["seconds"] for r in rows},
        "rl_steps": by_kind["rl"]["steps"] if "rl" in by_kind else None,
        "precision": by_kind["rl"].get("precision") if "rl" in by_kind else None,
        "sft_run": str(rd.root / by_kind["sft"]["name"]) if "sft" in by_kind else None,
        "rl_run": str(rd.root / by_kind["rl"]["name"]) if "rl" in by_kind else None,
        "wall_seconds": time.perf_counter() - clocks[0],
        # CPU time of this process: on a shared machine, the wall time it would take on free cores
        "cpu_seconds": time.process_time() - clocks[1],
    }
    rd.write_summary(summary)
    if summary["complete"] or interrupted:
        do_finish_run(rd.root, {"interrupted": bool(interrupted)}, rows[-1]["model"] if rows else None)
    return summary
