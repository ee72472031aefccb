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
- tether runs with its defaults (`--precision auto`: bf16 autocast only where the CPU does bf16
  natively, tether.hardware); TRL runs in fp32 and in bf16 (`GRPOConfig(bf16=True, use_cpu=True)`:
  autocast through accelerate), and TRL-best is whichever is faster in this run; tether also runs
  at every precision TRL ran at (the same-precision pairs) and compiled (`train.compile=true
  rollout.compile=true`, since 2026-12-02 with the decode step; before, the training forward only;
  the compilation falls in each run's warm-up step; later processes reuse inductor's on-disk cache).
  An arm more than `--slow-factor` x slower than its framework's fastest in the first round (bf16
  without native bf16) runs once. The headline is tether-best / TRL-best; every row names its
  precision, and the machine's CPU model, class and flags are in the result's `machine`.

Accounting (every figure says how far it is from this machine's limit, measured in each run):
- training FLOPs = 6 * params * tokens + 6 * layers * hidden * sum(L^2) (causal attention),
  over (step time - generation time), against the GEMM peak measured in the same process; tokens
  are prompt + completion tokens, counted whether or not they were computed (prefix sharing
  computes fewer, so this can pass 1.0); in brackets the same with the token positions each
  framework actually ran (padding included, shared prefixes once): the hardware's share;
- generation time against a decode-step floor: decode steps x the time of the model's weight
  matmuls for one step at the same batch (attention, sampling, bookkeeping free); and, in
  brackets, against that floor plus the attention over the KV cache at each step's length
  (bench_workers.measure_attention_floor: the cache's memory traffic, which on the small model at
  batch 64 outgrows the weights').

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

    from tether import hardware

    cpu = hardware.cpu_info()
    try:
        import trl

        trl_v = trl.__version__
    except ImportError:
        trl_v = None
    from tether.policy import cpu_gemm

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu["model"], "cpu_class": hardware.cpu_class(cpu), "cpu_generation": hardware.cpu_generation(cpu),
            "cpu_flags": cpu["flags"],
            **({"isa_mask": cpu["isa_mask"]} if "isa_mask" in cpu else {}),
            "native_bf16": hardware.cpu_native_bf16(cpu), "cpu_linear": cpu_gemm.backend(), "cores": os.cpu_count(), "memory_gb": round(mem, 1),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl_v, "threads": threads, "load_avg_start": list(os.getloadavg()),
            "date": _dt.date.today().isoformat()}


def build_model_dir(size: str, out: Path) -> Path:
    """The reverse demo's byte-level tokenizer (trained on the reverse task) + a tiny Llama of `size`."""
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.train.setup import setup_problems
    from tether.rollout import compute_tokenizer_corpus

    from bench_workers import load_cfg

    h, layers, heads, inter = SIZES[size]
    cfg = load_cfg(base_spec("tether", out, "fp32", 1, 0))
    train, _ = setup_problems(cfg.data)
    tok = build_tokenizer(compute_tokenizer_corpus(cfg.data.task, train), 256)
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
        att = run.get("attention_floor")
        if att and all("prompt_width" in s for s in steps):  # + the attention over the cache at every decode step
            kv = [f + sum(att["a"] + att["b"] * (s["prompt_width"] + t + 1) for t in range(int(s["gen_steps"])))
                  for f, s in zip(floor, steps)]
            out["decode_floor_kv_s"] = _med(kv)
            out["gen_over_decode_floor_kv"] = _med([s["gen_s"] / f for s, f in zip(steps, kv)])
    if run.get("compile"):  # what train.compile / rollout.compile resolved to (tether)
        out["compile"] = run["compile"]
    return out


def summarize(runs: list[dict], warmup: int) -> dict:
    per = [summarize_run(r, warmup) for r in runs]
    keys = [k for k, v in per[0].items() if isinstance(v, float)]
    out = {k: _med([p[k] for p in per]) for k in keys}
    if "matmul_peak_gflops" in per[0]:
        out["matmul_peak_gflops"] = {k: _med([p["matmul_peak_gflops"][k] for p in per]) for k in ("fp32", "bf16")}
    if per[0].get("compile"):
        out["compile"] = per[0]["compile"]
    out["runs"] = len(per)
    out["s_per_step_each_run"] = [round(p["s_per_step"], 3) for p in per]
    return out


def default_precision() -> str:
    """What tether's `model.autocast_bf16=auto` picks on this machine (tether.hardware)."""
    from tether.hardware import resolve_autocast

    return "bf16" if resolve_autocast("auto", "cpu") else "fp32"


def arms(args) -> list[tuple[str, str, str, list[str]]]:
    """(name, framework, precision, tether overrides): tether with its defaults (precision `auto`),
    TRL at each precision asked for (TRL-best is the faster of them, chosen in this run), tether at
    every other precision TRL runs at (the same-precision pairs), and tether compiled: the training
    forward (`train.compile=true`) and the decode step (`rollout.compile=true`)."""
    mine = args.precision if args.precision != "auto" else default_precision()
    trl = ["fp32", "bf16"] if args.trl_precision == "both" else [args.trl_precision]
    out = [("tether", "tether", mine, [])] + [(f"trl_{p}", "trl", p, []) for p in trl]
    if args.match_precision:
        out += [(f"tether_{p}", "tether", p, []) for p in trl if p != mine]
    if args.compiled_arm:
        out.append(("tether_compiled", "tether", mine, ["train.compile=true", "rollout.compile=true"]))
    return out


def compare_arms(summ: dict, prec: dict) -> dict:
    """Headline and same-precision ratios from per-arm summaries (`summ[name]["s_per_step"]`) and
    the arms' precisions: tether-best / TRL-best (each framework's fastest arm in this run), tether
    (defaults) / TRL-best, and tether (p) / TRL (p) for every precision both ran."""
    def best(fw):
        names = [n for n in summ if (n == "trl" or n.startswith("trl_")) == (fw == "trl")]
        return min(names, key=lambda n: summ[n]["s_per_step"])

    tb, lb = best("tether"), best("trl")
    ratio = lambda a, b, k="s_per_step": summ[a][k] / summ[b][k]  # noqa: E731
    out = {"tether_best": tb, "trl_best": lb, "tether_best_precision": prec[tb], "trl_best_precision": prec[lb],
           "s_per_step_ratio_best": ratio(tb, lb), "peak_rss_ratio_best": ratio(tb, lb, "peak_rss_mb"),
           "s_per_step_ratio": ratio("tether", lb), "peak_rss_ratio": ratio("tether", lb, "peak_rss_mb"),
           "rollout_tokens_per_s_ratio": ratio("tether", lb, "rollout_tokens_per_s"),
           "train_tokens_per_s_ratio": ratio("tether", lb, "train_tokens_per_s"), "same_precision": {}}
    for p in sorted(set(prec.values())):
        mine = "tether" if prec["tether"] == p else f"tether_{p}"
        if mine in summ and f"trl_{p}" in summ:
            out["same_precision"][p] = {"s_per_step_ratio": ratio(mine, f"trl_{p}"),
                                        "peak_rss_ratio": ratio(mine, f"trl_{p}", "peak_rss_mb"), "arms": [mine, f"trl_{p}"]}
    return out


def _slow_arms(first: dict[str, float], plan, factor: float) -> dict[str, str]:
    """Arms whose first run took more than `factor` x their framework's fastest arm: run once only
    (bf16 autocast on a CPU without native bf16 is ~10x slower than fp32; repeating it buys nothing)."""
    out = {}
    for name, fw, prec, _ in plan:
        fastest = min(v for n, v in first.items() if dict((a[0], a[1]) for a in plan)[n] == fw)
        if first[name] > factor * fastest:
            out[name] = f"{first[name]:.1f} s/step in its first run, > {factor:g}x {fw}'s fastest arm ({fastest:.1f}): run once"
    return out


def speed_size(size: str, args, work: Path) -> dict:
    """Runs of every arm, alternating (A B C A B C ...), each in a fresh process."""
    model_dir = build_model_dir(size, work / f"model-{size}")
    plan = arms(args)
    runs = {name: [] for name, *_ in plan}
    extra, once = {}, {}
    rounds = args.warmup_rounds + args.runs
    for r in range(rounds):
        first = {}
        for name, fw, prec, overrides in plan:
            if name in once:
                continue
            spec = base_spec(fw, model_dir, prec, args.threads, r)
            spec.update(steps=args.steps, account=args.account, tether_overrides=overrides, slowdown_s=args.slowdown)
            res = run_worker(spec, work)
            counted = r >= args.warmup_rounds or r == 0 and args.slow_factor > 0
            if counted:
                runs[name].append(res)
            if res.get("trl_sampling"):
                extra["trl_sampling"] = res["trl_sampling"]
            s = summarize_run(res, spec["warmup"])
            first[name] = s["s_per_step"]
            print(f"  [{size}] run {r + 1}/{rounds}{'' if counted else ' (warm-up)'} {name:16s} {s['s_per_step']:.2f} s/step "
                  f"(gen {s['gen_s']:.2f} s, train {s['train_s']:.2f} s, rss {s['peak_rss_mb']:.0f} MB)", flush=True)
        if r == 0 and args.slow_factor > 0:
            once = _slow_arms(first, plan, args.slow_factor)
            for name, why in once.items():
                print(f"  [{size}] {name}: {why}", flush=True)
            if args.warmup_rounds:  # round 0 was a warm-up for the others: drop it there
                runs = {n: rs if n in once else rs[1:] for n, rs in runs.items()}
    summ = {name: summarize(rs, 1) for name, rs in runs.items()}
    prec = {name: p for name, _, p, _ in plan}
    return {"params": runs["tether"][0]["params"], "arch": runs["tether"][0]["arch"], **summ,
            **compare_arms(summ, prec), "arm_precision": prec, "arm_overrides": {name: o for name, _, _, o in plan},
            "run_once": once, **extra}


# ----------------------------------------------------------------------------- learning curves


def learning_curves(args, work: Path) -> dict:
    """Reward per step for tether and TRL from the reverse demo's SFT start, equal samples, `--seeds`."""
    sft_dir = work / "sft"
    spec = {"framework": "sft", "out": str(sft_dir), "threads": args.threads, "sft_steps": args.sft_steps}
    run_worker(spec, work)
    model_dir = sft_dir / "final_model"
    curves = {"tether": [], "trl": []}
    precision = {"tether": arms(args)[0][2], "trl": "fp32" if args.trl_precision == "both" else args.trl_precision}
    for seed in args.seeds:
        for fw in ("tether", "trl"):
            s = base_spec(fw, model_dir, precision[fw], args.threads, seed)
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


def _label(name: str, prec: str, arm: dict | None = None) -> str:
    """The row's name; tether's defaults say when `auto` compiled them (train.compile / rollout.compile)."""
    fw = "TRL" if name.startswith("trl") else "tether, compiled" if name == "tether_compiled" else \
        "tether, defaults" if name == "tether" else "tether"
    comp = (arm or {}).get("compile") or {}
    if name == "tether" and (comp.get("train") or comp.get("rollout")):
        fw += ", compiled by auto"
    return f"{fw} ({prec})"


def kv_floor(x: dict) -> str:
    """' (1.6x)': generation time over the decode floor with the KV cache's attention, where measured."""
    return f" ({x['gen_over_decode_floor_kv']:.1f}x)" if "gen_over_decode_floor_kv" in x else ""


def accounting_cells(x: dict, p: str) -> str:
    """The table's last two cells: training FLOP/s over the matmul peak at precision `p`, and the
    generation time over its decode floor; "not measured" for both under --no-account."""
    if f"train_frac_of_{p}_peak" not in x:
        return "not measured | not measured"
    run = x.get(f"train_run_frac_of_{p}_peak")
    return (f"{x[f'train_frac_of_{p}_peak']:.2f} of {p}{'' if run is None else f' ({run:.2f})'} | "
            f"{x['gen_over_decode_floor']:.1f}x{kv_floor(x)}")


def table(results: dict) -> str:
    """A markdown table of the headline figures (also pasted into README.md); every row names its precision."""
    lines = ["| size | framework (precision) | s/step | rollout tok/s | train tok/s | peak RSS MB | train FLOP/s / matmul peak (positions run) | gen time / decode floor (with KV reads) |",
             "|---|---|---|---|---|---|---|---|"]
    for size, r in results["sizes"].items():
        names, prec = [n for n in r if isinstance(r[n], dict) and "s_per_step" in r[n]], r["arm_precision"]
        for name in names:
            x, p = r[name], prec[name]
            once = " (1 run: slow)" if name in r.get("run_once", {}) else ""
            lines.append(f"| {size} ({r['params'] / 1e6:.1f}M) | {_label(name, p, x)}{once} | {x['s_per_step']:.2f} | "
                         f"{x['rollout_tokens_per_s']:.0f} | {x['train_tokens_per_s']:.0f} | {x['peak_rss_mb']:.0f} | "
                         f"{accounting_cells(x, p)} |")
        tb, lb = r["tether_best"], r["trl_best"]
        lines.append(f"| {size} | **tether-best {_label(tb, prec[tb], r[tb])} / TRL-best {_label(lb, prec[lb])}** | "
                     f"**{r['s_per_step_ratio_best']:.2f}** | | | **{r['peak_rss_ratio_best']:.2f}** | | |")
        if tb != "tether":
            lines.append(f"| {size} | {_label('tether', prec['tether'], r['tether'])} / TRL-best {_label(lb, prec[lb])} | "
                         f"{r['s_per_step_ratio']:.2f} | {r['rollout_tokens_per_s_ratio']:.2f} | "
                         f"{r['train_tokens_per_s_ratio']:.2f} | {r['peak_rss_ratio']:.2f} | | |")
        for p, pair in r["same_precision"].items():
            lines.append(f"| {size} | same precision: {_label(pair['arms'][0], p, r[pair['arms'][0]])} / TRL ({p}) | "
                         f"{pair['s_per_step_ratio']:.2f} | | | {pair['peak_rss_ratio']:.2f} | | |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--runs", type=int, default=5, help="counted runs per arm and size")
    p.add_argument("--warmup-rounds", type=int, default=0, help="extra discarded rounds before the counted ones")
    p.add_argument("--steps", type=int, default=2, help="timed steps per run (each run first does 1 warm-up step)")
    p.add_argument("--no-match-precision", dest="match_precision", action="store_false",
                   help="skip tether at TRL's other precisions (the same-precision pairs)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process, both frameworks")
    p.add_argument("--no-compiled-arm", dest="compiled_arm", action="store_false",
                   help="skip the arm of tether compiled (train.compile=true rollout.compile=true)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="tether's default arm: model.autocast_bf16 (auto: bf16 only with native bf16, tether.hardware)")
    p.add_argument("--trl-precision", choices=["both", "fp32", "bf16"], default="both",
                   help="TRL: bf16 = GRPOConfig(bf16=True, use_cpu=True); both: each, TRL-best = the faster")
    p.add_argument("--slow-factor", type=float, default=2.0,
                   help="an arm slower than this x its framework's fastest in the first round runs once (0: never)")
    p.add_argument("--curve-steps", type=int, default=80, help="RL steps per curve (configs/reverse.yaml runs 80)")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--no-prefix", action="store_true")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--quick", action="store_true", help="small only, 3 runs, no curves")
    p.add_argument("--out", default=str(HERE / "results" / "vs_trl.json"))
    p.add_argument("--slowdown", type=float, default=0.0, help=argparse.SUPPRESS)  # bench_quick.py's demonstration
    p.add_argument("--no-account", dest="account", action="store_false",
                   help="skip the matmul-peak and decode-floor measurements after each run (bench_quick: s/step only)")
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.runs, a.no_curves, a.no_ablations = "small", 3, True, True
    return a


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from tether.hardware import choose_precision

    results = {"machine": machine_description(args.threads), "settings": {
        "tether_auto_precision": choose_precision("auto", "cpu").reason,
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
            results["prefix_sharing"] = run_prefix_bench(args.threads, precision=arms(args)[0][2])
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
