"""The embedded default (`make demo` / `tether demo`): the whole loop on a laptop CPU.

The default task (`tether/configs/demo.yaml`) is agentic: multi-hop QA with a `search` tool over
a bundled BM25 corpus, several turns per episode; `configs/reverse.yaml` is the single-turn one.

  1. build a tokenizer (trained with `tokenizers` on the task's text) and a small Llama locally;
  2. SFT cold start on the task's (weak-teacher) expert demonstrations (recipes/sft.py);
  3. GRPO from the SFT model (recipes/rl.py), evaluating held-out pass@1 before and after;
  4. PNG plots of reward, accuracy, KL, entropy and length; summary.json with the figures.

Deliberate simplifications: the task is synthetic and verifiable, so the numbers measure the
loop, not a model; the same recipes train any local HF causal-LM directory (`model.path=...`).
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

from tether.config import load_config
from tether.io.plots import plot_metrics
from tether.runs.lifecycle import do_finish_run, do_set_members
from tether.runs.resume import do_open_run
from tether.runs.result import resolve_result
from tether.io.run_dir import read_metrics


def demo_config_path() -> Path:
    return Path(str(resources.files("tether.configs").joinpath("demo.yaml")))


def run_demo(run_dir: str | Path, overrides: list[str] | None = None, overwrite: bool = False) -> dict[str, Any]:
    from tether.recipes.rl import run_rl
    from tether.recipes.sft import run_sft

    t0, c0 = time.perf_counter(), time.process_time()
    cfg = load_config(demo_config_path(), overrides or [])
    rd = do_open_run(run_dir, cfg, "demo", overwrite=overwrite).run_dir  # an existing run is never clobbered
    print(f"[tether demo] task={cfg.data.task} tiny Llama hidden={cfg.model.tiny.hidden_size} layers={cfg.model.tiny.num_layers}; "
          f"SFT {cfg.sft.steps} steps, then {cfg.algo.advantage.name.upper()} {cfg.train.steps} steps "
          f"({cfg.rollout.problems_per_step} problems x {cfg.rollout.n} rollouts)", flush=True)
    policy, sft_summary = run_sft(cfg, rd.root / "sft")
    t_sft = time.perf_counter() - t0
    print(f"[tether demo] SFT done in {t_sft:.0f}s (final loss {sft_summary['final_loss']:.3f}); starting RL", flush=True)
    rl_summary = run_rl(cfg, rd.root / "rl", policy=policy)
    rows = read_metrics(rd.root / "rl" / "metrics.jsonl")
    plots = plot_metrics(rows, rd.plots_dir)
    summary = {
        "kind": "demo",
        "task": cfg.data.task,
        "baseline_accuracy": rl_summary["baseline_accuracy"],
        "final_accuracy": rl_summary["final_accuracy"],
        "accuracy_lift": None if rl_summary["final_accuracy"] is None or rl_summary["baseline_accuracy"] is None
        else rl_summary["final_accuracy"] - rl_summary["baseline_accuracy"],
        "baseline_greedy_accuracy": rl_summary.get("baseline_greedy_accuracy"),
        "final_greedy_accuracy": rl_summary.get("final_greedy_accuracy"),
        "sft_seconds": t_sft,
        "rl_seconds": rl_summary["wall_seconds"],
        "wall_seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,  # all threads of this process: a load-independent figure
        "rl_steps": rl_summary["steps"],
        "precision": rl_summary.get("precision"),
        "plots": [str(p) for p in plots],
        "sft_run": str(rd.root / "sft"),
        "rl_run": str(rd.root / "rl"),
    }
    rd.write_summary(summary)
    do_set_members(rd.root, [{"name": "sft", "kind": "sft", "path": "sft"}, {"name": "rl", "kind": "rl", "path": "rl"}])
    do_finish_run(rd.root, {"interrupted": bool(rl_summary.get("interrupted"))}, resolve_result(rd.root / "rl").path)
    b, f = summary["baseline_accuracy"], summary["final_accuracy"]
    if f is None:
        print(f"[tether demo] interrupted after {summary['rl_steps']} RL steps (SFT start pass@1 {b:.3f}); "
              f"resume with: tether train {demo_config_path()} --resume --run-dir {rd.root / 'rl'}", flush=True)
    else:
        print(f"[tether demo] held-out pass@1: SFT start {b:.3f} -> after RL {f:.3f} "
              f"({100 * (f - b):+.1f} points) in {summary['wall_seconds']:.0f}s total", flush=True)
    return summary
