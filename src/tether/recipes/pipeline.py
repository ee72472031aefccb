"""SFT cold start -> RL in one run directory, and the context-management comparison.

    tether pipeline configs/qa.yaml            # <run>/sft, <run>/rl, <run>/summary.json (the lift)
    tether pipeline configs/r1.yaml            # any `pipeline.stages` (recipes/multistage.py)
    tether compare-context configs/qa.yaml     # the pipeline once per context builder, ranked

`run_pipeline` runs the config's `pipeline.stages`; without any it is the demo's two stages
(recipes/demo.py) as a two-stage pipeline: SFT on the task's scripted demonstrations
(`sft.demo_noise`: a weak teacher), then RL from that model, with the held-out success of the
SFT model and of the final policy in `summary.json`.

`run_context_comparison` reproduces Agent-R1's context-management experiment (arXiv 2511.14460
v2, "flexible context management": sliding window > append-only > LLM summary on multi-hop QA):
the same config, seeds and problems are run once per `env.context.builder`; each pipeline's SFT
demonstrations are cut with that builder too (`tether.rollout.demos`), so every stage trains
on the contexts it will act on. The ordering by final held-out pass@1 is printed whatever it is.

Deliberate simplifications: stages run in one process, one after the other; the comparison
runs builders sequentially (2-core CPU) with one seed unless `seeds` asks for more.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from tether.config import TetherConfig, build_config
from tether.io.run_dir import make_run_dir
from tether.runs.engine import Interrupted, Member, Plan, members_table, run_members
from tether.runs.lifecycle import do_finish_run, do_start_record
from tether.runs.record import read_record
from tether.runs.resume import check_kind, do_open_run

BUILDERS = ("sliding_window", "append", "summary")


def run_pipeline(cfg: TetherConfig, run_dir: str | Path, log=print, resume: bool = False,
                 overwrite: bool = False) -> dict[str, Any]:
    """The config's `pipeline.stages` (recipes/multistage.py); without stages, the two-stage
    pipeline `[{kind: sft, name: sft}, {kind: rl, name: rl}]`. Returns the summary it writes.
    Without `resume`, an existing run directory needs `overwrite` (tether.runs.resume)."""
    from tether.recipes.multistage import run_stages

    if resume:
        check_kind(run_dir, "pipeline")  # another kind of run is refused, naming the command that resumes it
    else:
        do_open_run(run_dir, cfg, "pipeline", overwrite=overwrite)  # an existing run is never clobbered
    summary = run_stages(cfg, run_dir, resume=resume, log=log)
    b, f = summary["baseline_accuracy"], summary["final_accuracy"]
    if b is not None and f is not None and len(summary["stages"]) > 1:
        log(f"[tether pipeline] held-out pass@1: after {summary['stages'][0]['name']} {b:.3f} -> after "
            f"{summary['stages'][-1]['name']} {f:.3f} ({100 * (f - b):+.1f} points) in {summary['wall_seconds']:.0f}s "
            f"total ({summary['cpu_seconds']:.0f} CPU seconds)")
    return summary


def compute_ordering(results: dict[str, list[dict[str, Any]]], key: str = "final_accuracy") -> list[tuple[str, float]]:
    """(builder, mean of `key` over seeds), best first; ties keep the given builder order."""
    means = [(b, statistics.fmean(r[key] for r in runs)) for b, runs in results.items() if runs]
    return sorted(means, key=lambda x: -x[1])


def format_ordering(ordering: Sequence[tuple[str, float]]) -> str:
    """e.g. 'sliding_window (0.62) > append (0.55) = summary (0.55)'."""
    out = ""
    for i, (b, v) in enumerate(ordering):
        if i:
            out += " = " if abs(v - ordering[i - 1][1]) < 1e-9 else " > "
        out += f"{b} ({v:.3f})"
    return out


def run_context_comparison(cfg: TetherConfig, run_dir: str | Path, builders: Sequence[str] = BUILDERS,
                           seeds: Sequence[int] | None = None, log=print, overwrite: bool = False,
                           resume: bool = False) -> dict[str, Any]:
    """The pipeline once per builder (and seed) from the same config, through the multi-run engine
    (tether.runs.engine: finished pipelines are reused on `resume`, an unfinished one resumes its
    stages); writes comparison.json. A resume checks the config like a pipeline's
    (`check_pipeline_resume`); other builders or seeds only add or leave out member pipelines."""
    from tether.recipes.multistage import check_pipeline_resume

    t0 = time.perf_counter()
    if resume:
        check_kind(run_dir, "compare_context")
        rd = make_run_dir(run_dir)
        check_pipeline_resume(rd, cfg, log)
        rd.write_config(cfg)
        if read_record(rd.root).kind is None:
            do_start_record(rd.root, cfg, "compare_context")
    else:
        rd = do_open_run(run_dir, cfg, "compare_context", overwrite=overwrite).run_dir
    seeds = list(seeds) if seeds else [cfg.run.seed]
    members = [Member(f"{b}-s{seed}", rd.root / f"{b}-s{seed}", "pipeline", (b, seed)) for seed in seeds for b in builders]

    def execute(m: Member, resume_member: bool) -> dict[str, Any]:
        b, seed = m.data
        data = cfg.model_dump(mode="json")
        data["env"]["context"]["builder"] = b
        data["run"]["seed"] = seed
        data["run"]["name"] = f"{cfg.run.name}-{b}-s{seed}"
        return run_pipeline(build_config(data, f"compare-context {b}"), m.path, log, resume=resume_member)

    def collect(m: Member, summary: Any) -> dict[str, Any] | Interrupted | None:
        summary = summary if summary is not None else _summary(m.path)
        if summary is None or not summary.get("complete"):
            return Interrupted(f"{m.name} did not finish; resume with --resume --run-dir {rd.root}") if summary else None
        return {k: summary[k] for k in ("final_accuracy", "baseline_accuracy", "accuracy_lift", "wall_seconds", "rl_run")}

    plan = Plan(execute, collect, describe=lambda v: f"pass@1 {v['baseline_accuracy']:.3f} -> {v['final_accuracy']:.3f}",
                resumable=lambda m: read_record(m.path).kind == "pipeline", recollect=True, raise_errors=True)
    outcomes = run_members(rd.root, "compare-context", members, plan, log)
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in builders}
    for o in outcomes:
        if o.ok:
            results[o.member.data[0]].append(o.value)
    summary = _comparison_summary(cfg, seeds, results, time.perf_counter() - t0, members_table(rd.root, outcomes))
    (rd.root / "comparison.json").write_text(json.dumps(summary, indent=2))
    rd.write_summary(summary)
    if summary["complete"]:
        do_finish_run(rd.root, summary, None)
    _log_comparison(cfg, seeds, summary, log)
    return summary


def _summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _comparison_summary(cfg: TetherConfig, seeds: list[int], results: dict[str, list[dict[str, Any]]], seconds: float,
                        members: list[dict[str, Any]]) -> dict[str, Any]:
    done = {b: runs for b, runs in results.items() if runs}
    final, lift = compute_ordering(done, "final_accuracy"), compute_ordering(done, "accuracy_lift")
    table = {b: {"final_accuracy": statistics.fmean(r["final_accuracy"] for r in runs),
                 "baseline_accuracy": statistics.fmean(r["baseline_accuracy"] for r in runs),
                 "accuracy_lift": statistics.fmean(r["accuracy_lift"] for r in runs),
                 "wall_seconds": statistics.fmean(r["wall_seconds"] for r in runs)} for b, runs in done.items()}
    return {"kind": "compare_context", "task": cfg.data.task, "seeds": seeds, "window": cfg.env.context.window,
            "summarizer": cfg.env.context.summarizer, "by_builder": table,
            "ordering_final": [b for b, _ in final], "ordering_lift": [b for b, _ in lift],
            "ordering_text": format_ordering(final), "wall_seconds": seconds,
            "runs": {b: [r["rl_run"] for r in runs] for b, runs in done.items()},
            "complete": all(m["status"] in ("ran", "reused") for m in members) and len(members) == sum(
                len(r) for r in results.values()), "members": members}


def _log_comparison(cfg: TetherConfig, seeds: list[int], summary: dict[str, Any], log) -> None:
    log(f"[tether compare-context] {cfg.data.task}, {len(seeds)} seed(s), window={cfg.env.context.window}")
    for b, row in summary["by_builder"].items():
        log(f"  {b:15s} SFT start {row['baseline_accuracy']:.3f} -> after RL {row['final_accuracy']:.3f} "
            f"({100 * row['accuracy_lift']:+.1f} points)")
    log(f"[tether compare-context] ordering by final held-out pass@1: {summary['ordering_text']}")
    lift = [(b, summary["by_builder"][b]["accuracy_lift"]) for b in summary["ordering_lift"]]
    log(f"[tether compare-context] ordering by RL lift: {format_ordering(lift)}")
