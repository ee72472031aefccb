"""Held-out accuracy before and after a Tinker RL loop run against `tether serve-tinker` on a CPU.

    python benchmarks/tinker_lift.py            # the measurement -> benchmarks/results/tinker_lift.json
    python benchmarks/tinker_lift.py --smoke    # a two-step check that it runs (writes runs/tinker-lift-smoke.json)

1. A cold start, with tether and outside the timed part: configs/reverse.yaml's SFT (a tiny Llama
   imitating a teacher that corrupts 40% of its answers), saved as a Hugging Face directory.
2. `tether serve-tinker --model reverse-sft=<that directory>` in its own process.
3. Held-out accuracy through the tinker SDK: pass@1 over --eval-samples samples per problem at
   temperature 1, and greedy, on the config's held-out problems.
4. benchmarks/tinker_rl_loop.py (tinker-cookbook's rl_loop.py, ported: see its docstring) in its own
   process, with TINKER_BASE_URL (and an API key) as its only link to the service: LoRA rank 32,
   importance-sampling loss, AdamW, 16 problems x 8 samples per step.
5. The same held-out evaluation on the loop's final sampler weights.

Recorded: the lift, the loop's wall time (the figure compared with "<= 15 minutes"), the CPU seconds
of the service and of the loop processes, the load average before and after, and the CPU model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "reverse-sft"
KEY = "tml-tether-bench"


def _log(msg: str) -> None:
    print(f"[tinker-lift {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="RL loop batches")
    ap.add_argument("--learning-rate", type=float, default=1e-3, help="the loop's Adam learning rate (LoRA)")
    ap.add_argument("--lora-rank", type=int, default=32)
    ap.add_argument("--sft-steps", type=int, default=300, help="cold-start SFT steps (configs/reverse.yaml: 300)")
    ap.add_argument("--eval-size", type=int, default=200, help="held-out problems")
    ap.add_argument("--eval-samples", type=int, default=4, help="samples per held-out problem for pass@1")
    ap.add_argument("--run-dir", default="runs/tinker-lift")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/tinker_lift.json"))
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the cold start and the service (1 on a "
                    "machine shared with other jobs: spinning threads then cost more than they give)")
    ap.add_argument("--fresh", action="store_true", help="redo the cold start even if <run-dir>/sft-model exists")
    ap.add_argument("--smoke", action="store_true", help="2 SFT + 2 RL steps, 8 held-out problems")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.sft_steps, args.eval_size, args.eval_samples = 2, 2, 8, 1
        if "--out" not in (argv if argv is not None else sys.argv):
            args.out = "runs/tinker-lift-smoke.json"
    return args


def cold_start(args: argparse.Namespace, rd: Path) -> tuple[Path, list[dict], list[dict], float | None]:
    """configs/reverse.yaml's SFT with tether -> (model directory, train rows, held-out rows, seconds);
    an SFT model already in the run directory (same command, earlier run) is reused (seconds None)."""
    from tether.config import load_config
    from tether.recipes.sft import run_sft
    from tether.train.setup import setup_problems

    cfg = load_config(ROOT / "configs/reverse.yaml", [f"sft.steps={args.sft_steps}", f"data.eval_size={args.eval_size}",
                                                      "checkpoint.every=0", f"run.threads={args.threads}"])
    t0 = time.perf_counter()
    out = rd / "sft-model"
    seconds = None  # None: the cold start of an earlier run in this directory was reused
    if not (out / "config.json").is_file() or args.fresh:
        policy, _ = run_sft(cfg, rd / "sft", overwrite=True)
        policy.model.save_pretrained(str(out), safe_serialization=True)
        policy.tokenizer.save_pretrained(str(out))
        seconds = time.perf_counter() - t0
    train, held_out = setup_problems(cfg.data)
    return out, [{"prompt": p["prompt"], "answer": p["answer"]} for p in train], \
        [{"prompt": p["prompt"], "answer": p["answer"]} for p in held_out], seconds


def start_service(model_dir: Path, rd: Path, threads: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tether.cli", "serve-tinker", "--model", f"{MODEL}={model_dir}", "--port", "0",
           "--token", KEY, "--state-dir", str(rd / "service-state"), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # type: ignore[union-attr]
        if m := re.search(r"serving the Tinker API at (http://\S+)", line):
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("tether serve-tinker did not start")


def evaluate(base_url: str, tokenizer, rows: list[dict], samples: int, model_path: str | None) -> dict[str, float]:
    """pass@1 (mean exact match over `samples` samples at temperature 1) and greedy accuracy, via the SDK."""
    import tinker
    from tinker import types

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from tinker_rl_loop import decode_response, get_reward

    sc = tinker.ServiceClient(base_url=base_url, api_key=KEY)
    sampler = (sc.create_sampling_client(model_path=model_path) if model_path else
               sc.create_sampling_client(base_model=MODEL)).result()
    prompts = [types.ModelInput.from_ints(tokenizer.encode(r["prompt"])) for r in rows]
    sampled = [sampler.sample(p, samples, types.SamplingParams(max_tokens=10)) for p in prompts]
    greedy = [sampler.sample(p, 1, types.SamplingParams(max_tokens=10, temperature=0.0)) for p in prompts]

    def score(fut, row) -> float:
        seqs = fut.result().sequences
        return sum(get_reward(decode_response(tokenizer, list(s.tokens), s.stop_reason), row["answer"]) for s in seqs) / len(seqs)

    out = {"pass@1": sum(score(f, r) for f, r in zip(sampled, rows)) / len(rows),
           "greedy": sum(score(f, r) for f, r in zip(greedy, rows)) / len(rows)}
    sc.close("success").result()
    return out


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from tether.hardware import cpu_info

    rd = Path(args.run_dir)
    load_start = os.getloadavg()
    _log(f"load average at start {load_start}; cold start: {args.sft_steps} SFT steps with tether (not timed below)")
    model_dir, train, held_out, t_sft = cold_start(args, rd)
    (rd / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    service, url = start_service(model_dir, rd, args.threads)
    try:
        _log(f"service at {url}; held-out evaluation before ({len(held_out)} problems x {args.eval_samples} + greedy)")
        before = evaluate(url, tokenizer, held_out, args.eval_samples, None)
        _log(f"before: {before}; the RL loop: {args.steps} batches of 16 problems x 8 samples")
        env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0"}
        loop = [sys.executable, str(ROOT / "benchmarks/tinker_rl_loop.py"), "--model-name", MODEL,
                "--train-path", str(rd / "train.jsonl"), "--log-path", str(rd / "rl-loop"), "--max-steps", str(args.steps),
                "--learning-rate", str(args.learning_rate), "--lora-rank", str(args.lora_rank)]
        (rd / "rl-loop" / "checkpoints.jsonl").unlink(missing_ok=True)
        service_cpu0, children0 = cpu_seconds(service.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(loop, env=env, check=True, cwd=ROOT)
        t_loop = time.perf_counter() - t0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        service_cpu = cpu_seconds(service.pid) - service_cpu0
        loop_cpu = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        load_end = os.getloadavg()
        final = json.loads((rd / "rl-loop" / "checkpoints.jsonl").read_text().splitlines()[-1])
        after = evaluate(url, tokenizer, held_out, args.eval_samples, final["sampler_path"])
    finally:
        service.terminate()
        service.wait(30)
    lift = 100 * (after["pass@1"] - before["pass@1"])
    _log(f"held-out pass@1 {before['pass@1']:.3f} -> {after['pass@1']:.3f} ({lift:+.1f} points); loop {t_loop:.0f}s wall, "
         f"{service_cpu:.0f}s service CPU + {loop_cpu:.0f}s loop CPU")
    rewards = [json.loads(line)["reward/total"] for line in (rd / "rl-loop" / "metrics.jsonl").read_text().splitlines()]
    return {
        "command": "python benchmarks/tinker_lift.py " + " ".join(sys.argv[1:]),
        "loop": "benchmarks/tinker_rl_loop.py (tinker-cookbook 0.5.8 recipes/rl_loop.py, ported; its docstring says how)",
        "service": "tether serve-tinker (its own process, CPU)", "linked_by": "TINKER_BASE_URL and TINKER_API_KEY only",
        "task": "reverse (configs/reverse.yaml): SFT cold start on a 40%-corrupted teacher, then the Tinker RL loop",
        "loop_settings": {"batches": args.steps, "problems_per_batch": 16, "samples_per_problem": 8,
                          "loss_fn": "importance_sampling", "lora_rank": args.lora_rank, "learning_rate": args.learning_rate,
                          "adam": {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8}, "max_tokens": 10},
        "held_out_problems": len(held_out), "samples_per_problem": args.eval_samples,
        "held_out_pass1_before": before["pass@1"], "held_out_pass1_after": after["pass@1"], "lift_points": lift,
        "greedy_before": before["greedy"], "greedy_after": after["greedy"],
        "train_reward_first_last_5": [sum(rewards[:5]) / max(len(rewards[:5]), 1), sum(rewards[-5:]) / max(len(rewards[-5:]), 1)],
        "loop_wall_seconds": t_loop, "service_cpu_seconds": service_cpu, "loop_cpu_seconds": loop_cpu,
        "sft_wall_seconds": t_sft, "cold_start": "made by this run" if t_sft is not None else
        f"reused: {rd / 'sft-model'} (made by an earlier run of this command; --fresh redoes it)", "threads": args.threads, "meets_issue_42": bool(lift >= 10 and t_loop <= 900),
        "cpus": os.cpu_count(), "cpu": cpu_info(), "load_average_at_start": load_start, "load_average_at_end": load_end,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
        "note": "wall times on a machine shared with other jobs are upper bounds; the load averages and CPU seconds say "
                "how busy it was",
    }


def _commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or None


def main(argv=None) -> None:
    args = parse_args(argv)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    result = measure(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _log(f"wrote {out}")


if __name__ == "__main__":
    main()
