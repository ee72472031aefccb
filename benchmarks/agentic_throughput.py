"""Multi-turn throughput: episodes per second of RL on a built-in tool environment, with the time split.

    python benchmarks/agentic_throughput.py                     # -> benchmarks/results/agentic_throughput.json
    python benchmarks/agentic_throughput.py --steps 3 --problems 8 --sft-steps 100

The task is the demo's (multi-hop QA with a `search` tool over a bundled BM25 corpus, up to 4 turns,
tether/configs/demo.yaml). A short SFT cold start first, so that the policy calls the tool and
episodes have several turns (a random model ends every episode on a parse error). Then RL steps
of two arms, alternating step by step in one process on one model (same load for both):
- `batched`: tether's rollout, every live episode's next turn sampled in one batch
  (`rollout.batch_size`, default 256);
- `naive`: the same loop with `rollout.batch_size=1`: one episode's turn at a time, what a
  single-episode agent loop does.
TRL's environment/tool support is not run here: TRL 1.16's GRPOTrainer has `tools=` and an
experimental `environment_factory=`, which parse tool calls through a response template/schema
that TRL knows for the hub's chat templates, not for the demo's locally built tokenizer; wiring that
up was not done (not a claim that it cannot run on a CPU), so the comparison is with tether's own
naive single-episode loop.

Per step: episodes/s, sampled tokens/s, trained token positions/s, and the split of the step
between sampling (`time/generate`), tools and rewards (`time/env`: the environment's steps,
including the answer check), batching and the update. Precision: tether's default (`auto`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PHASES = ("time/generate", "time/env", "time/batch", "time/update")


def step_record(metrics: dict, episodes: int) -> dict:
    t = metrics["time/step"]
    rec = {"step_s": t, "episodes_per_s": episodes / t,
           "gen_tokens_per_s": metrics.get("rollout/gen_tokens", float("nan")) / t,
           "train_positions_per_s": metrics.get("train/positions", float("nan")) / t,
           "turns_mean": metrics.get("rollout/turns_mean", metrics.get("turns_mean", float("nan")))}
    split = {k.split("/")[1]: metrics.get(k, 0.0) for k in PHASES}
    split["other"] = t - sum(split.values())
    rec["split_s"] = split
    return rec


def summarize(recs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in recs)  # noqa: E731
    out = {k: med(k) for k in ("step_s", "episodes_per_s", "gen_tokens_per_s", "train_positions_per_s")}
    out["split_s"] = {k: statistics.median(r["split_s"][k] for r in recs) for k in recs[0]["split_s"]}
    out["steps"] = len(recs)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="timed RL steps per arm (after one warm-up step each)")
    p.add_argument("--problems", type=int, default=8, help="problems per step (x --n episodes)")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--sft-steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "results" / "agentic_throughput.json"))
    a = p.parse_args(argv)
    import torch

    from tether.config import load_config
    from tether.recipes.demo import demo_config_path
    from tether.recipes.rl import run_rl_step
    from tether.recipes.sft import run_sft
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state
    from tether.train.setup import precision_summary, setup_problems
    from vs_trl import machine_description

    t0 = time.perf_counter()
    machine = machine_description(a.threads)
    base = [f"run.threads={a.threads}", f"sft.steps={a.sft_steps}", "logging.progress=false", "logging.tensorboard=false",
            "checkpoint.every=0", f"rollout.problems_per_step={a.problems}", f"rollout.n={a.n}", "health.mode=off"]
    cfgs = {"batched": load_config(demo_config_path(), base), "naive": load_config(demo_config_path(), base + ["rollout.batch_size=1"])}
    with tempfile.TemporaryDirectory(prefix="tether-agentic-") as tmp:
        policy, _ = run_sft(cfgs["batched"], Path(tmp) / "sft")
    torch.set_num_threads(a.threads)
    train, _ = setup_problems(cfgs["batched"].data)
    policy.model.train()
    st = build_rl_state(RunSettings(cfgs["batched"]), policy, train)
    recs = {k: [] for k in cfgs}
    for i in range(1 + a.steps):
        for name, cfg in cfgs.items():
            metrics, groups = run_rl_step(st)
            st.step += 1
            episodes = sum(len(g.trajectories) for g in groups)
            rec = step_record(metrics, episodes)
            print(f"  [agentic] step {i} {name:8s} {rec['step_s']:.2f} s, {rec['episodes_per_s']:.1f} episodes/s, split "
                  + ", ".join(f"{k} {v:.2f}" for k, v in rec["split_s"].items()), flush=True)
            if i:
                recs[name].append(rec)
    summ = {k: summarize(v) for k, v in recs.items()}
    result = {"machine": machine, "precision": precision_summary(cfgs["batched"], policy),
              "settings": {"task": "qa (demo.yaml)", "problems_per_step": a.problems, "n": a.n, "sft_steps": a.sft_steps,
                           "steps": a.steps, "command": " ".join(["python"] + sys.argv)},
              "arms": summ, "episodes_per_s_ratio": summ["batched"]["episodes_per_s"] / summ["naive"]["episodes_per_s"],
              "peer": "TRL's tools/environment_factory not wired up for the locally built tokenizer (see the module doc); "
                      "naive = tether with rollout.batch_size=1",
              "wall_s": time.perf_counter() - t0}
    result["machine"]["load_avg_end"] = list(__import__("os").getloadavg())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(f"[agentic] batched {summ['batched']['episodes_per_s']:.2f} episodes/s vs naive {summ['naive']['episodes_per_s']:.2f} "
          f"({result['episodes_per_s_ratio']:.1f}x); wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
