"""Held-out success of a black-box agent before and after RL through the agent harness.

    python benchmarks/harness_lift.py [--steps 30] [--out benchmarks/results/harness_lift.json]

The task is configs/reverse.yaml (reverse a word; a weak teacher's SFT cold start). The agent is
configs/agents/complete_agent.py, a separate process per episode that only speaks the OpenAI
completions API; tether trains on the tokens its endpoint sampled (tether.envs.harness). Held-out
success is measured through the same harness (every held-out problem, `--eval-samples` agent
runs each) before and after the RL stage; the RL stage's wall time is the figure compared with
the issue's 15-minute budget. SFT is the cold start and is timed separately.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def harness_success(policy, problems, cfg, samples: int) -> float:
    from tether.envs.harness import HarnessRollout

    h = cfg.harness
    rollout = HarnessRollout(h.command, cfg.reward, h.timeout_s, h.concurrency, seed=cfg.run.seed + 17)
    policy.model.eval()
    groups, _ = rollout.run(policy, problems, samples, cfg.eval.sampling)
    policy.model.train()
    flags = [bool(t.reward.correct) for g in groups for t in g.trajectories]
    return sum(flags) / len(flags)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--run-dir", default="runs/harness-lift")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/harness_lift.json"))
    args = ap.parse_args()
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    from tether.config import load_config
    from tether.recipes.common import setup_problems
    from tether.recipes.rl import run_rl
    from tether.recipes.sft import run_sft

    overrides = [f"harness.command=[{sys.executable!r}, {str(ROOT / 'configs/agents/complete_agent.py')!r}]",
                 "harness.concurrency=32", f"train.steps={args.steps}", f"sft.steps={args.sft_steps}",
                 "rollout.problems_per_step=8", f"data.eval_size={args.eval_size}", "eval.every=0", "logging.progress=false",
                 "checkpoint.every=0"]
    cfg = load_config(ROOT / "configs/reverse.yaml", overrides)
    rd = Path(args.run_dir)
    t0 = time.perf_counter()
    policy, _ = run_sft(cfg, rd / "sft")
    t_sft = time.perf_counter() - t0
    _, held_out = setup_problems(cfg)
    before = harness_success(policy, held_out, cfg, args.eval_samples)
    t1 = time.perf_counter()
    summary = run_rl(cfg, rd / "rl", policy=policy)
    t_rl = time.perf_counter() - t1
    after = harness_success(policy, held_out, cfg, args.eval_samples)
    result = {
        "command": "python benchmarks/harness_lift.py " + " ".join(sys.argv[1:]),
        "task": "reverse (configs/reverse.yaml)", "agent": "configs/agents/complete_agent.py",
        "held_out_problems": len(held_out), "agent_runs_per_problem": args.eval_samples,
        "held_out_success_before": before, "held_out_success_after": after, "lift_points": 100 * (after - before),
        "rl_steps": summary["steps"], "episodes_per_step": cfg.rollout.problems_per_step * cfg.rollout.n,
        "rl_wall_seconds": t_rl, "sft_wall_seconds": t_sft, "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "load_average_at_end": os.getloadavg(),
        "note": "timed on a shared development machine with other jobs running: wall times are upper bounds",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
