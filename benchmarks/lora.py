"""LoRA vs full fine-tuning on CPU (issue 20): peak RSS and s/step on the large benchmark model, and
held-out lift of LoRA-RL vs full-RL at equal steps on two tasks.

    python benchmarks/lora.py                      # both parts -> benchmarks/results/lora.json
    python benchmarks/lora.py --part speed         # or --part quality; --quick for a smoke run

speed: one subprocess per arm (so ru_maxrss is that arm's peak), the "large" model of
benchmarks/vs_trl.py (hidden 512, 8 layers), a few RL steps from a random init; s/step is the
median after the first step, split into rollout and update time.
quality: per task, one full SFT from a random init gives the base (demo_noise leaves headroom),
then RL from that base with full fine-tuning and with LoRA for the same number of steps; the lift
is held-out pass@1 after minus before. One seed per arm (noisy: say so when quoting it).
Timings on a shared, loaded CPU are noisy: compare the arms of one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
COMMON = ["logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0", "run.threads=2",
          "reward.isolation=inline"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in open(run / "metrics.jsonl")]


def speed_arm(arm: str, out: Path, steps: int, problems: int = 4, n: int = 8, tokens: int = 32) -> dict:
    """One RL run on the large model (in this process); returns s/step and peak RSS."""
    from vs_trl import SIZES

    from tether.config import load_config
    from tether.recipes.rl import run_rl

    h, layers, heads, inter = SIZES["large"]
    ov = COMMON + [f"model.tiny.hidden_size={h}", f"model.tiny.num_layers={layers}", f"model.tiny.num_heads={heads}",
                   f"model.tiny.intermediate_size={inter}", "data.task=reverse", "data.train_size=64", "data.eval_size=4",
                   "eval.problems=1", "eval.samples=1", "eval.sampling.max_new_tokens=4", f"train.steps={steps}",
                   f"rollout.problems_per_step={problems}", f"rollout.n={n}", f"rollout.sampling.max_new_tokens={tokens}",
                   "algo.kl.coef=0.01", "model.autocast_bf16=false", "run.threads=1"]
    if arm == "lora":
        ov.append("model.lora={r: 8, alpha: 16}")
    cfg = load_config(None, ov)
    import tether.recipes.rl as rl

    rl.plot_metrics = lambda *a, **k: None  # plots are not what is measured
    run_rl(cfg, out / arm)
    rows = [r for r in _metrics(out / arm) if "time/step" in r][1:]
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {"arm": arm, "steps_timed": len(rows), "rollout": {"problems": problems, "n": n, "max_new_tokens": tokens}, "s_per_step": med("time/step"),
            "s_rollout": med("time/rollout_total"), "s_update": med("time/update"),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def quality_task(task: str, out: Path, sft_steps: int, rl_steps: int, rank: int, base: str | None = None,
                 overrides: list[str] = (), seed: int = 0) -> dict:
    """`base`: an SFT'd model directory to start RL from instead of running the SFT here."""
    given = base is not None
    from tether.config import load_config
    from tether.recipes.rl import run_rl
    from tether.recipes.sft import run_sft
    import tether.recipes.rl as rl

    rl.plot_metrics = lambda *a, **k: None
    tiny = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
            "model.tiny.intermediate_size=192", f"data.task={task}", "data.train_size=400", "data.eval_size=48",
            "eval.problems=32", "eval.samples=2", "model.autocast_bf16=false", "run.threads=1", f"run.seed={seed}",
            *overrides]
    if base is None:
        _, sft = run_sft(load_config(None, COMMON + tiny + [f"sft.steps={sft_steps}", "sft.lr=3e-3", "sft.batch_size=32",
                                                            "sft.demo_noise=0.4", "sft.warmup_steps=5"]), out / task / "sft")
        base = sft["final_model"]
    rl_common = COMMON + tiny + [f"model.path={base}", f"train.steps={rl_steps}", "rollout.problems_per_step=8",
                                 "rollout.n=8", "rollout.sampling.max_new_tokens=24", "eval.sampling.max_new_tokens=24",
                                 "train.warmup_steps=2", "train.grad_clip=1.0"]
    arms = {"full": ["train.lr=3e-4"], f"lora_r{rank}": [f"model.lora={{r: {rank}, alpha: {2 * rank}}}", "train.lr=3e-3"]}
    res = {"task": task, "base": str(base), "sft_steps": None if given else sft_steps,
           "rl_steps": rl_steps, "seed": seed, "overrides": list(overrides)}
    for name, extra in arms.items():
        t0 = time.perf_counter()
        s = run_rl(load_config(None, rl_common + extra), out / task / name)
        res[name] = {"overrides": extra, "before": s["baseline_accuracy"], "after": s["final_accuracy"],
                     "lift": (s["final_accuracy"] or 0) - (s["baseline_accuracy"] or 0), "wall_s": time.perf_counter() - t0}
        print(task, name, res[name], flush=True)
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["speed", "quality", "both"], default="both")
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: one speed arm in a subprocess
    p.add_argument("--work", default="/tmp/tether-bench-lora")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--speed-rollout", default="4,8,32", help="problems,n,max_new_tokens of the speed runs")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--rl-steps", type=int, default=15)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--tasks", default="reverse,arith")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overrides", nargs="*", default=[], help="extra config overrides for every quality run")
    p.add_argument("--bases", default="", help="task=DIR,...: start RL from these SFT'd models (no SFT here)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "lora.json"))
    a = p.parse_args(argv)
    work = Path(a.work)
    if a.arm:
        problems, n, tokens = map(int, a.speed_rollout.split(","))
        print("RESULT " + json.dumps(speed_arm(a.arm, work / "speed", a.steps, problems, n, tokens)), flush=True)
        return {}
    out_path = Path(a.out)
    result = json.loads(out_path.read_text()) if out_path.is_file() else {}
    result["command"] = "python benchmarks/lora.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["cpu_load_at_start"] = os.getloadavg()
    if a.part in ("speed", "both"):
        arms = []
        for arm in ("full", "lora"):
            cmd = [sys.executable, __file__, "--arm", arm, "--work", str(work), "--steps", str(a.steps),
                   "--speed-rollout", a.speed_rollout]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(f"speed arm {arm} failed:\n{proc.stderr[-2000:]}")
            arms.append(json.loads(line[0][7:]))
            print(arms[-1], flush=True)
        result["speed"] = {"model": "large (hidden 512, 8 layers; benchmarks/vs_trl.py)", "arms": arms}
    if a.part in ("quality", "both"):
        bases = dict(kv.split("=", 1) for kv in a.bases.split(",") if kv)
        result["quality"] = [quality_task(t, work / "quality", a.sft_steps, a.rl_steps, a.rank, bases.get(t),
                                          a.overrides, a.seed) for t in a.tasks.split(",")]
    result["cpu_load_at_end"] = os.getloadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
