"""tether vs TRL's GRPOTrainer on the same model and task, measured side by side (`make bench`).

    python benchmarks/vs_trl.py                      # both sizes, curves, prefix sharing (~30 min on 2 cores)
    python benchmarks/vs_trl.py --quick              # one size, 3 runs each, no curves (a smoke run)

What is compared (bench_workers.py holds the two sides):
- the same locally built Llama + byte-level tokenizer, saved to a temp dir and loaded by both;
- the same prompts (tether's `reverse` task), reward, prompts x generations (8 x 8 = 64
  completions), max completion length (64), sampling (temperature 1, no top-k/top-p on either
  side), one optimizer step per generated batch, AdamW, lr, grad clip 1, clip eps, no KL;
- runs alternate (tether, TRL, tether at TRL's precision, again ...) in fresh processes (peak RSS
  per framework); each run does 1 warm-up step then `--steps` timed steps; figures are medians
  over the runs of each run's median; `--warmup-rounds` adds discarded rounds;
- tether runs with bf16 autocast by default (`--precision`), TRL in fp32 (`--trl-precision`, its
  CPU setting in machine.md); the third arm is tether in TRL's precision, so both comparisons show;
  the fourth is tether with `train.compile=true` (its decoder layers through torch.compile; the
  compilation falls in each run's warm-up step, and later processes reuse inductor's on-disk
  cache). The headline ratios are tether's default settings against TRL's defaults.

Accounting (every figure says how far it is from this machine's limit, measured in each run):
- training FLOPs = 6 * params * tokens + 6 * layers * hidden * sum(L^2) (causal attention),
  over (step time - generation time), against the GEMM peak measured in the same process; tokens
  are prompt + completion tokens, counted whether or not they were computed (prefix sharing
  computes fewer, so this can pass 1.0); in brackets the same with the token positions each
  framework actually ran (padding included, shared prefixes once): the hardware's share;
- generation time against a decode-step floor: decode steps x the time of the model's weight
  matmuls for one step at the same batch (attention, sampling, bookkeeping free).

Then: each speed change before/after (ablations.py), the prefix-sharing saving on a multi-turn
group (bench_prefix.py), and learning curves (reward per step, equal samples, 3 seeds, the reverse demo's
task from the reverse demo's SFT start).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIZES = {  # hidden, layers, heads, intermediate
    "small": (256, 4, 4, 688),
    "large": (512, 8, 8, 1376),
}


def machine_description(threads: int) -> dict:
    import torch
    import transformers

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import trl

        trl_v = trl.__version__
    except ImportError:
        trl_v = None
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem, 1), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl_v, "threads": threads,
            "load_avg_start": list(os.getloadavg()), "date": _dt.date.today().isoformat()}


def build_model_dir(size: str, out: Path) -> Path:
    """The reverse demo's byte-level tokenizer (trained on the reverse task) + a tiny Llama of `size`."""
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.recipes.common import setup_problems, tokenizer_corpus

    from bench_workers import load_cfg

    h, layers, heads, inter = SIZES[size]
    cfg = load_cfg(base_spec("tether", out, "fp32", 1, 0))
    train, _ = setup_problems(cfg)
    tok = build_tokenizer(tokenizer_corpus(cfg, train), 256)
    tiny = TinyModelConfig(hidden_size=h, num_layers=layers, num_heads=heads, intermediate_size=inter, vocab_size=256)
    build_tiny_model(tiny, tok, out, seed=0)
    return out


def base_spec(framework: str, model_dir: Path, precision: str, threads: int, seed: int) -> dict:
    return {"framework": framework, "model_dir": str(model_dir), "train_size": 4000, "n": 8, "prompts": 8,
            "max_new": 64, "temperature": 1.0, "lr": 1e-5, "clip_low": 0.2, "clip_high": 0.2, "seed": seed,
            "threads": threads, "reward": "dense", "precision": precision, "warmup": 1, "steps": 3}


def run_worker(spec: dict, work: Path, timeout: float = 3600) -> dict:
    """One framework, one run, in a fresh interpreter; returns its JSON result."""
    tag = f"{spec['framework']}-{time.monotonic_ns()}"
    spec = dict(spec, result=str(work / f"{tag}.json"), out_dir=str(work / tag))
    path = work / f"{tag}.spec.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(HERE / "bench_workers.py"), str(path)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['framework']} worker failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(Path(spec["result"]).read_text())


# ----------------------------------------------------------------------------- summaries


def _med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def summarize_run(run: dict, warmup: int) -> dict:
    """Medians over the timed steps of one run, with FLOP and floor accounting."""
    steps = run["steps"][warmup:]
    a = run["arch"]
    flops = [6 * run["params"] * s["train_tokens"] + 6 * a["layers"] * a["hidden"] * s["attn_sq"] for s in steps]
    train_s = [s["step_s"] - s["gen_s"] for s in steps]
    out = {
        "s_per_step": _med([s["step_s"] for s in steps]),
        "gen_s": _med([s["gen_s"] for s in steps]),
        "train_s": _med(train_s),
        "rollout_tokens_per_s": _med([s["gen_tokens"] / s["gen_s"] for s in steps]),
        "train_tokens_per_s": _med([s["train_tokens"] / t for s, t in zip(steps, train_s)]),
        "train_tokens": _med([s["train_tokens"] for s in steps]),
        "gen_tokens": _med([s["gen_tokens"] for s in steps]),
        "peak_rss_mb": run["peak_rss"]["total_mb"],
        "train_gflops_per_s": _med([f / t / 1e9 for f, t in zip(flops, train_s)]),
    }
    if all("positions" in s for s in steps):  # the FLOPs actually run: positions instead of tokens
        hw = [f + 6 * run["params"] * (s["positions"] - s["train_tokens"]) for f, s in zip(flops, steps)]
        out["train_positions"] = _med([s["positions"] for s in steps])
        out["train_run_gflops_per_s"] = _med([f / t / 1e9 for f, t in zip(hw, train_s)])
    if "matmul_peak_gflops" in run:
        pk = run["matmul_peak_gflops"]
        out["matmul_peak_gflops"] = pk
        out["train_frac_of_fp32_peak"] = out["train_gflops_per_s"] / pk["fp32"]
        out["train_frac_of_bf16_peak"] = out["train_gflops_per_s"] / pk["bf16"]
        if "train_run_gflops_per_s" in out:
            for prec in ("fp32", "bf16"):
                out[f"train_run_frac_of_{prec}_peak"] = out["train_run_gflops_per_s"] / pk[prec]
        floor = [s["gen_steps"] * run["decode_floor_s"] for s in steps]
        out["decode_floor_s"] = _med(floor)
        out["gen_over_decode_floor"] = _med([s["gen_s"] / f for s, f in zip(steps, floor)])
    return out


def summarize(runs: list[dict], warmup: int) -> dict:
    per = [summarize_run(r, warmup) for r in runs]
    keys = [k for k, v in per[0].items() if isinstance(v, float)]
    out = {k: _med([p[k] for p in per]) for k in keys}
    if "matmul_peak_gflops" in per[0]:
        out["matmul_peak_gflops"] = {k: _med([p["matmul_peak_gflops"][k] for p in per]) for k in ("fp32", "bf16")}
    out["runs"] = len(per)
    out["s_per_step_each_run"] = [round(p["s_per_step"], 3) for p in per]
    return out


def arms(args) -> list[tuple[str, str, str, list[str]]]:
    """(name, framework, precision, tether overrides): tether as configured, TRL, tether at TRL's
    precision, and tether with its compiled training forward (`train.compile=true`)."""
    out = [("tether", "tether", args.precision, []), ("trl", "trl", args.trl_precision, [])]
    if args.match_precision and args.precision != args.trl_precision:
        out.append((f"tether_{args.trl_precision}", "tether", args.trl_precision, []))
    if args.compiled_arm:
        out.append(("tether_compiled", "tether", args.precision, ["train.compile=true"]))
    return out


def speed_size(size: str, args, work: Path) -> dict:
    """Runs of every arm, alternating (A B C A B C ...), each in a fresh process."""
    model_dir = build_model_dir(size, work / f"model-{size}")
    runs = {name: [] for name, *_ in arms(args)}
    extra = {}
    rounds = args.warmup_rounds + args.runs
    for r in range(rounds):
        for name, fw, prec, overrides in arms(args):
            spec = base_spec(fw, model_dir, prec, args.threads, r)
            spec.update(steps=args.steps, account=True, tether_overrides=overrides)
            res = run_worker(spec, work)
            counted = r >= args.warmup_rounds
            if counted:
                runs[name].append(res)
            if res.get("trl_sampling"):
                extra["trl_sampling"] = res["trl_sampling"]
            s = summarize_run(res, spec["warmup"])
            print(f"  [{size}] run {r + 1}/{rounds}{'' if counted else ' (warm-up)'} {name:12s} {s['s_per_step']:.2f} s/step "
                  f"(gen {s['gen_s']:.2f} s, train {s['train_s']:.2f} s, rss {s['peak_rss_mb']:.0f} MB)", flush=True)
    summ = {name: summarize(rs, 1) for name, rs in runs.items()}
    t, l_ = summ["tether"], summ["trl"]
    out = {"params": runs["tether"][0]["params"], "arch": runs["tether"][0]["arch"], **summ,
           "s_per_step_ratio": t["s_per_step"] / l_["s_per_step"], "peak_rss_ratio": t["peak_rss_mb"] / l_["peak_rss_mb"],
           "rollout_tokens_per_s_ratio": t["rollout_tokens_per_s"] / l_["rollout_tokens_per_s"],
           "train_tokens_per_s_ratio": t["train_tokens_per_s"] / l_["train_tokens_per_s"],
           "tether_precision": args.precision, "trl_precision": args.trl_precision,
           "arm_precision": {name: prec for name, _, prec, _ in arms(args)},
           "arm_overrides": {name: o for name, _, _, o in arms(args)}, **extra}
    for name, *_ in arms(args)[2:]:
        suffix = name.split("_", 1)[1]  # fp32 (TRL's precision) or compiled
        out[f"s_per_step_ratio_{suffix}"] = summ[name]["s_per_step"] / l_["s_per_step"]
        out[f"peak_rss_ratio_{suffix}"] = summ[name]["peak_rss_mb"] / l_["peak_rss_mb"]
    return out


# ----------------------------------------------------------------------------- learning curves


def learning_curves(args, work: Path) -> dict:
    """Reward per step for tether and TRL from the reverse demo's SFT start, equal samples, `--seeds`."""
    sft_dir = work / "sft"
    spec = {"framework": "sft", "out": str(sft_dir), "threads": args.threads, "sft_steps": args.sft_steps}
    run_worker(spec, work)
    model_dir = sft_dir / "final_model"
    curves = {"tether": [], "trl": []}
    for seed in args.seeds:
        for fw in ("tether", "trl"):
            s = base_spec(fw, model_dir, args.precision if fw == "tether" else args.trl_precision, args.threads, seed)
            s.update(prompts=16, n=8, max_new=10, lr=1e-4, clip_high=0.28, reward="exact", warmup=0, steps=args.curve_steps)
            res = run_worker(s, work)
            curves[fw].append([st["reward"] for st in res["steps"]])
            print(f"  [curves] seed {seed} {fw:6s} first-5 {_mean(curves[fw][-1][:5]):.3f} "
                  f"last-10 {_mean(curves[fw][-1][-10:]):.3f}", flush=True)
    return {"steps": args.curve_steps, "samples_per_step": 128, "seeds": list(args.seeds), "curves": curves,
            "summary": compare_curves(curves)}


def _mean(xs):
    return sum(xs) / max(len(xs), 1)


def compare_curves(curves: dict, window: int = 10) -> dict:
    """Mean reward over the last `window` steps per seed; tether >= TRL within noise means
    tether's mean >= TRL's mean - 2 x the standard error of the difference."""
    out = {}
    for fw, cs in curves.items():
        last = [_mean(c[-window:]) for c in cs]
        out[fw] = {"last_window_mean": _mean(last), "per_seed": last,
                   "sd": statistics.stdev(last) if len(last) > 1 else 0.0, "first5_mean": _mean([_mean(c[:5]) for c in cs])}
    n = len(curves["tether"])
    se = ((out["tether"]["sd"] ** 2 + out["trl"]["sd"] ** 2) / max(n, 1)) ** 0.5
    out["difference"] = out["tether"]["last_window_mean"] - out["trl"]["last_window_mean"]
    out["se_difference"] = se
    out["tether_at_least_trl_within_noise"] = out["difference"] >= -2 * se
    return out


def print_curves(lc: dict) -> None:
    steps = lc["steps"]
    marks = sorted({0, *range(4, steps, max(1, steps // 8)), steps - 1})
    print("\nreward per step (mean over seeds; each step = 128 samples, both frameworks)")
    print("step   " + "  ".join(f"{m + 1:>5d}" for m in marks))
    for fw in ("tether", "trl"):
        cs = lc["curves"][fw]
        row = [_mean([c[m] for c in cs]) for m in marks]
        print(f"{fw:6s} " + "  ".join(f"{v:5.3f}" for v in row))
    s = lc["summary"]
    print(f"last 10 steps: tether {s['tether']['last_window_mean']:.3f} ± {s['tether']['sd']:.3f}, "
          f"TRL {s['trl']['last_window_mean']:.3f} ± {s['trl']['sd']:.3f} (sd over seeds); "
          f"tether >= TRL within noise: {s['tether_at_least_trl_within_noise']}")


# ----------------------------------------------------------------------------- report


def table(results: dict) -> str:
    """A markdown table of the headline figures (also pasted into README.md)."""
    lines = ["| size | framework (precision) | s/step | rollout tok/s | train tok/s | peak RSS MB | train FLOP/s / matmul peak (positions run) | gen time / decode floor |",
             "|---|---|---|---|---|---|---|---|"]
    for size, r in results["sizes"].items():
        names = [n for n in r if isinstance(r[n], dict) and "s_per_step" in r[n]]
        for name in names:
            x = r[name]
            prec = r["arm_precision"][name]
            fw = "TRL" if name == "trl" else "tether, train.compile" if name == "tether_compiled" else "tether"
            frac = x.get(f"train_frac_of_{prec}_peak", float("nan"))
            run_frac = x.get(f"train_run_frac_of_{prec}_peak", float("nan"))
            lines.append(f"| {size} ({r['params'] / 1e6:.1f}M) | {fw} ({prec}) | {x['s_per_step']:.2f} | "
                         f"{x['rollout_tokens_per_s']:.0f} | {x['train_tokens_per_s']:.0f} | {x['peak_rss_mb']:.0f} | "
                         f"{frac:.2f} of {prec} ({run_frac:.2f}) | {x.get('gen_over_decode_floor', float('nan')):.1f}x |")
        lines.append(f"| {size} | **tether / TRL** | **{r['s_per_step_ratio']:.2f}** | {r['rollout_tokens_per_s_ratio']:.2f} | "
                     f"{r['train_tokens_per_s_ratio']:.2f} | **{r['peak_rss_ratio']:.2f}** | | |")
        for name in names[2:]:
            suffix, prec = name.split("_", 1)[1], r["arm_precision"][name]
            label = f"tether ({prec}{', train.compile' if suffix == 'compiled' else ''})"
            lines.append(f"| {size} | {label} / TRL ({r['trl_precision']}) | {r[f's_per_step_ratio_{suffix}']:.2f} | | | "
                         f"{r[f'peak_rss_ratio_{suffix}']:.2f} | | |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--runs", type=int, default=5, help="counted runs per arm and size")
    p.add_argument("--warmup-rounds", type=int, default=0, help="extra discarded rounds before the counted ones")
    p.add_argument("--steps", type=int, default=2, help="timed steps per run (each run first does 1 warm-up step)")
    p.add_argument("--no-match-precision", dest="match_precision", action="store_false",
                   help="skip the third arm: tether at TRL's precision")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process, both frameworks")
    p.add_argument("--no-compiled-arm", dest="compiled_arm", action="store_false",
                   help="skip the fourth arm: tether with train.compile=true (torch.compile of the training forward)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16", help="tether: bf16 = model.autocast_bf16")
    p.add_argument("--trl-precision", choices=["fp32", "bf16"], default="fp32", help="TRL: bf16 = GRPOConfig(bf16=True)")
    p.add_argument("--curve-steps", type=int, default=80, help="RL steps per curve (configs/reverse.yaml runs 80)")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--no-prefix", action="store_true")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--quick", action="store_true", help="small only, 3 runs, no curves")
    p.add_argument("--out", default=str(HERE / "results" / "vs_trl.json"))
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.runs, a.no_curves, a.no_ablations = "small", 3, True, True
    return a


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    results = {"machine": machine_description(args.threads), "settings": {
        "completions_per_step": 64, "prompts_per_step": 8, "generations_per_prompt": 8, "max_completion_tokens": 64,
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "runs": args.runs, "timed_steps_per_run": args.steps,
        "warmup_steps_per_run": 1, "arms": [list(a) for a in arms(args)],
        "optimizer_steps_per_batch": 1, "kl_beta": 0.0, "lr": 1e-5, "command": " ".join(["python"] + sys.argv)},
        "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="tether-vs-trl-") as tmp:
        work = Path(tmp)
        for size in args.sizes.split(","):
            print(f"[bench] {size}: alternating tether / TRL runs", flush=True)
            results["sizes"][size] = speed_size(size, args, work)
        if not args.no_ablations:
            from ablations import run_ablations

            print("[bench] ablations: each speed change before/after, in one process", flush=True)
            results["ablations"] = run_ablations(args.sizes.split(","), args.threads, reps=args.runs)
        if not args.no_prefix:
            from bench_prefix import run_prefix_bench

            print("[bench] prefix sharing on a multi-turn group", flush=True)
            results["prefix_sharing"] = run_prefix_bench(args.threads, precision=args.precision)
        if not args.no_curves:
            print("[bench] learning curves (reverse task, SFT start, equal samples)", flush=True)
            results["learning"] = learning_curves(args, work)
    results["machine"]["load_avg_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t0
    results["table_markdown"] = table(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print("\n" + results["table_markdown"])
    if "prefix_sharing" in results:
        p = results["prefix_sharing"]
        print(f"\nprefix sharing ({p['description']}): forward+backward {p['shared_s']:.3f} s vs {p['unshared_s']:.3f} s "
              f"unshared ({p['saving']:.0%} saved; {p['token_saving']:.0%} fewer tokens computed)")
    if "learning" in results:
        print_curves(results["learning"])
    print(f"\n[bench] wrote {args.out} in {results['wall_s'] / 60:.1f} min")
    return results


if __name__ == "__main__":
    main()
