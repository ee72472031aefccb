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
from tether.runs.resume import do_open_run

BUILDERS = ("sliding_window", "append", "summary")


def run_pipeline(cfg: TetherConfig, run_dir: str | Path, log=print, resume: bool = False,
                 overwrite: bool = False) -> dict[str, Any]:
    """The config's `pipeline.stages` (recipes/multistage.py); without stages, the two-stage
    pipeline `[{kind: sft, name: sft}, {kind: rl, name: rl}]`. Returns the summary it writes.
    Without `resume`, an existing run directory needs `overwrite` (tether.runs.resume)."""
    from tether.recipes.multistage import run_stages

    if not resume:
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
                           seeds: Sequence[int] | None = None, log=print, overwrite: bool = False) -> dict[str, Any]:
    """The pipeline once per builder (and seed) from the same config; writes comparison.json."""
    t0 = time.perf_counter()
    rd = do_open_run(run_dir, cfg, "compare_context", overwrite=overwrite).run_dir
    seeds = list(seeds) if seeds else [cfg.run.seed]
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in builders}
    for seed in seeds:
        for b in builders:
            data = cfg.model_dump(mode="json")
            data["env"]["context"]["builder"] = b
            data["run"]["seed"] = seed
            data["run"]["name"] = f"{cfg.run.name}-{b}-s{seed}"
            results[b].append(run_pipeline(build_config(data, f"compare-context {b}"), rd.root / f"{b}-s{seed}", log))
    final, lift = compute_ordering(results, "final_accuracy"), compute_ordering(results, "accuracy_lift")
    table = {b: {"final_accuracy": statistics.fmean(r["final_accuracy"] for r in runs),
                 "baseline_accuracy": statistics.fmean(r["baseline_accuracy"] for r in runs),
                 "accuracy_lift": statistics.fmean(r["accuracy_lift"] for r in runs),
                 "wall_seconds": statistics.fmean(r["wall_seconds"] for r in runs)} for b, runs in results.items()}
    summary = {"kind": "compare_context", "task": cfg.data.task, "seeds": seeds, "window": cfg.env.context.window,
               "summarizer": cfg.env.context.summarizer, "by_builder": table,
               "ordering_final": [b for b, _ in final], "ordering_lift": [b for b, _ in lift],
               "ordering_text": format_ordering(final), "wall_seconds": time.perf_counter() - t0,
               "runs": {b: [r["rl_run"] for r in runs] for b, runs in results.items()}}
    (rd.root / "comparison.json").write_text(json.dumps(summary, indent=2))
    rd.write_summary(summary)
    log(f"[tether compare-context] {cfg.data.task}, {len(seeds)} seed(s), window={cfg.env.context.window}")
    for b, row in table.items():
        log(f"  {b:15s} SFT start {row['baseline_accuracy']:.3f} -> after RL {row['final_accuracy']:.3f} "
            f"({100 * row['accuracy_lift']:+.1f} points)")
    log(f"[tether compare-context] ordering by final held-out pass@1: {format_ordering(final)}")
    log(f"[tether compare-context] ordering by RL lift: {format_ordering(lift)}")
    return summary
