"""The demo's SFT step, arms alternating in one process: threads and prefix sharing.

    python benchmarks/archive/sft_step.py [--reps 5] [--out benchmarks/results/sft_step.json]

The demo (`tether demo`, tether/configs/demo.yaml) cold-starts on 1000 multi-turn QA episodes of
~211 tokens, of which the first 100 (the system prompt with the tool schema) are the same in every
episode; 500 steps of 32 episodes. Arms: the padded batch (every episode's prefix run again)
and the prefix-shared batch (`train.share_prefix`: the common prefix once), each with 1 and 2
torch threads. Wall and process CPU time per step (median over `--reps`, after one warm-up
round): on a shared machine the CPU time of a one-thread arm is close to what the wall time
would be on a free core; a two-thread arm's CPU time includes its threads' spin-waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(HERE / "results" / "sft_step.json"))
    a = p.parse_args(argv)
    import torch

    from tether.config import load_config
    from tether.train.setup import precision_summary, seed_run, setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus
    from tether.recipes.demo import demo_config_path
    from tether.recipes.sft import _sft_step, build_demo_records
    from tether.optim import build_optimizer, build_scheduler
    from vs_trl import machine_description

    machine = machine_description(1)
    cfgs = {share: load_config(demo_config_path(), [f"train.share_prefix='{share}'"]) for share in ("off", "auto")}
    cfg = cfgs["auto"]
    seed_run(cfg.run)
    train, _ = setup_problems(cfg.data)
    with tempfile.TemporaryDirectory() as tmp:
        policy = setup_policy(cfg.model, cfg.run.seed, Path(tmp), lambda: compute_tokenizer_corpus(cfg.data.task, train))
    records = build_demo_records(policy, cfg, train)
    policy.model.train()
    opt = build_optimizer(policy.model.parameters(), cfg.sft.lr, cfg.sft.weight_decay)
    sched = build_scheduler(opt, cfg.sft.steps, cfg.sft.warmup_steps, "cosine")
    rng = random.Random(0)
    arms = {f"{'padded' if share == 'off' else 'prefix-shared'}, {t} thread{'s' if t > 1 else ''}": (cfgs[share], t)
            for share in ("off", "auto") for t in (1, 2)}
    times = {k: [] for k in arms}
    for rep in range(1 + a.reps):
        for name, (c, threads) in arms.items():
            torch.set_num_threads(threads)
            batch = rng.sample(records, c.sft.batch_size)
            c0, t0 = time.process_time(), time.perf_counter()
            _sft_step(policy, opt, sched, batch, c)
            if rep:
                times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    res = {name: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
           for name, v in times.items()}
    out = {"machine": machine, "precision": precision_summary(cfg.model, policy), "reps": a.reps,
           "records": len(records), "mean_tokens": statistics.mean(len(r.ids) for r in records),
           "batch_size": cfg.sft.batch_size, "arms": res, "command": " ".join(["python"] + sys.argv)}
    out["machine"]["load_avg_end"] = list(os.getloadavg())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    for name, r in res.items():
        print(f"{name:28s} wall {r['wall_s']:.2f} s  cpu {r['cpu_s']:.3f} s")
    return out


if __name__ == "__main__":
    main()
