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
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from tether.config import ConfigError, TetherConfig, build_config
from tether.io.checkpoint import find_latest_checkpoint
from tether.io.run_dir import make_run_dir, write_text_atomic
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
    """Run (or resume) every stage; returns the pipeline summary written to summary.json."""
    from tether.recipes.stage_common import evaluate_policy, load_model_dir

    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_stages(cfg)
    rd = make_run_dir(run_dir)
    rd.write_config(cfg)
    models: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    incoming = cfg.model.path
    for i, (st, data) in enumerate(plan):
        sdir = rd.root / st.name
        start = models[st.start_from] if st.start_from else incoming
        if start and start != cfg.model.path and not Path(start).is_dir():  # an earlier stage's output
            raise ConfigError(f"pipeline stage {st.name!r} would start from a missing model: {start} is gone "
                              "(restore it, or rerun the pipeline into a fresh --run-dir)")
        if resume and (sdir / DONE).is_file():
            row = json.loads((sdir / DONE).read_text())
            log(f"[tether pipeline] stage {i + 1}/{len(plan)} {st.name} ({st.kind}): done, skipped")
        else:
            stage_cfg = build_config(_resolve(data, models, start), f"pipeline stage {st.name!r}")
            log(f"[tether pipeline] stage {i + 1}/{len(plan)} {st.name} ({st.kind}) from {start or 'a new tiny model'}")
            t1 = time.perf_counter()
            resume_stage = resume and find_latest_checkpoint(sdir) is not None
            if resume and sdir.is_dir() and not resume_stage:  # killed before its first checkpoint: start afresh
                shutil.rmtree(sdir)
            summary = STAGE_RUNNERS[st.kind](stage_cfg, sdir, resume_stage)
            if summary.get("interrupted"):
                log(f"[tether pipeline] interrupted in stage {st.name}; resume with --resume --run-dir {rd.root}")
                return _write_summary(rd, cfg, rows, (t0, c0), len(plan), interrupted=st.name)
            model = stage_model(sdir, start)
            heldout = evaluate_policy(stage_cfg, load_model_dir(model, stage_cfg, f"stage {st.name} output"))
            row = {"name": st.name, "kind": st.kind, "model": model, "started_from": start, "heldout": heldout,
                   "seconds": time.perf_counter() - t1, "steps": summary.get("steps"), "precision": summary.get("precision")}
            write_text_atomic(sdir / DONE, json.dumps(row, indent=2))
        models[st.name] = incoming = row["model"]
        rows.append(row)
        h = row["heldout"]
        log(f"[tether pipeline] after {st.name}: held-out pass@1 {h.get('eval/pass@1', float('nan')):.3f}"
            + (f", {h['eval/answer_tokens']:.1f} tokens per answer" if "eval/answer_tokens" in h else ""))
        _write_summary(rd, cfg, rows, (t0, c0), len(plan))
    return _write_summary(rd, cfg, rows, (t0, c0), len(plan))


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
    from tether.runs.lifecycle import do_finish_run, do_set_members

    do_set_members(rd.root, [{"name": r["name"], "kind": r["kind"], "path": r["name"]} for r in rows])
    if summary["complete"] or interrupted:
        do_finish_run(rd.root, {"interrupted": bool(interrupted)}, rows[-1]["model"] if rows else None)
    return summary
