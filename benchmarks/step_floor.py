"""How close tether's RL step is to this CPU's matmul floor, and what that allows against TRL.

    python benchmarks/step_floor.py [--sizes small,large] [--steps 3] [--trl-runs 2] [--precision auto] [--compile auto]
                                    [--out benchmarks/results/step_floor.json]

The benchmark's step (vs_trl.py: 8 prompts x 8 completions x up to 64 tokens of the reverse task,
one torch thread), run by tether at its fastest (bf16 autocast where the CPU has native bf16,
`train.compile` and `rollout.compile` on; with `--precision fp32` fp32 and eager, as `auto` runs
fp32; `--compile` overrides), in this process: after warm-up steps (the
compilations), steps alternate between timed (the s/step figures) and profiled: under
torch.profiler the sampling and the update are each split into their matrix multiplies
(aten::mm / bmm / addmm / baddbmm and oneDNN's linear: the projections, the MLP, attention, the LM
head, forward and backward) and everything else. The GEMMs' self time is what the step
cannot lose without doing fewer multiply-adds; their FLOP/s is compared with a 1536^3 matmul's in
the same process (matmul_peak.gflops). Then TRL (GRPOTrainer at the same precision; bf16
autocast is its faster setting on a native-bf16 CPU) runs as many steps in fresh processes
(vs_trl.run_worker), and each tether step is set against TRL's step of the same index (both
runs' completions shorten as they train, so later steps are cheaper): the ratios are medians of
tether's s/step and of the matmul-only floor over TRL's.

A second floor adds attention that is not a GEMM op (PyTorch's fused CPU attention, and the compiled
decode step's fused attention kernels: see is_attention): reading the keys and values is work any
implementation does; "with attention" in the output.

The profiler's overhead falls on the many small ops, hardly on a GEMM's own time, so the floor
(GEMM self time as profiled) is close to what the GEMMs take in a timed step; the rest of the
profiled time is not used for any figure but the shares.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# oneDNN's linear (tether.policy.cpu_gemm: the packed decode matmuls, fp32 training projections)
# is a GEMM as much as aten's
GEMM_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "mkldnn::_linear_pointwise")
# attention that is not a GEMM op above: PyTorch's fused CPU attention (the fp32 training forward goes
# through SDPA) and, compiled, inductor's generated kernels that contain the attention products (the
# compiled decode step fuses rotary, the score and value products and the softmax into one kernel
# per layer; named only with cpp.enable_kernel_profile): memory traffic over the keys and values
# that any implementation reads, so it is counted with the floor
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def is_attention(name: str) -> bool:
    return name in ATTENTION_OPS or name.startswith("graph_") and "_bmm" in name


def _gemm_flops(key: str, shapes) -> int:
    """2 x M x K x N of one call, from its recorded input shapes (an out= tensor may follow them;
    addmm and baddbmm take the added tensor first; oneDNN's linear takes x [M, K] and w [N, K])."""
    a, b = (shapes[1], shapes[2]) if key in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    if key == "mkldnn::_linear_pointwise":
        return 2 * a[0] * a[1] * b[0]
    if len(a) == 2:
        return 2 * a[0] * a[1] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


def region_events(prof, regions: tuple[str, ...]) -> dict[str, tuple[float, list]]:
    """Per region found (a torch.profiler.record_function label): (its span in seconds, the ops
    that start inside it, the region markers themselves left out)."""
    events = list(prof.events())
    spans = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in regions}
    return {name: ((b - a) / 1e6, [e for e in events if e.name not in regions and a <= e.time_range.start < b])
            for name, (a, b) in spans.items()}


def split_profile(prof, regions: tuple[str, ...]) -> dict:
    """Per region: seconds in GEMMs, their FLOPs, in attention kernels (is_attention) and in every
    other op (self times)."""
    out = {}
    for name, (_, events) in region_events(prof, regions).items():
        gemm_s = attention_s = other_s = 0.0
        flops = 0
        for e in events:
            t = e.self_cpu_time_total / 1e6
            if e.name in GEMM_OPS:
                gemm_s += t
                shapes = e.input_shapes or []
                if len(shapes) >= 2 + (e.name in ("aten::addmm", "aten::baddbmm")):
                    flops += _gemm_flops(e.name, shapes)
            elif is_attention(e.name):
                attention_s += t
            else:
                other_s += t
        out.update({f"{name}_gemm_s": gemm_s, f"{name}_gemm_flops": flops, f"{name}_attention_s": attention_s,
                    f"{name}_other_s": other_s})
    return out


@contextlib.contextmanager
def labelled_regions():
    """Inside: `rl.run_update` runs under the profiler label "update"; yields the rollout's
    `collect` function labelled "generate" (to pass to `run_rl_step`)."""
    import torch

    import tether.recipes.rl as rl
    from tether.rollout import collect_groups

    def labelled(name, fn):
        def run(*args, **kwargs):
            with torch.profiler.record_function(name):
                return fn(*args, **kwargs)
        return run

    update = rl.run_update
    rl.run_update = labelled("update", update)
    try:
        yield labelled("generate", collect_groups)
    finally:
        rl.run_update = update


def tether_floor(size: str, model_dir: Path, precision: str, warmup: int, steps: int, compiled: bool) -> dict:
    """Timed steps and profiled steps alternate (the profiler slows what it watches): the step
    times are the unprofiled ones', the GEMM split the profiled ones'."""
    import torch

    import tether.recipes.rl as rl
    from paired import bench_state

    cfg, st = bench_state(model_dir, precision, compiled)
    timed, profiled = [], []
    with labelled_regions() as collect:
        for i in range(warmup + 2 * steps):
            kind = "warm-up" if i < warmup else ("timed" if (i - warmup) % 2 == 0 else "profiled")
            if kind == "profiled":
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
                    metrics, _ = rl.run_rl_step(st, rl.RLVariant(collect=collect))
                profiled.append({"index": i, "positions": metrics["train/positions"],
                                 **split_profile(prof, ("generate", "update"))})
            else:
                metrics, _ = rl.run_rl_step(st, rl.RLVariant(collect=collect))
            if kind == "timed":
                timed.append({"index": i, "step_s": metrics["time/step"], "generate_s": metrics["time/generate"],
                              "update_s": metrics["time/update"], "positions": metrics["train/positions"]})
            st.step += 1
            print(f"  [{size}] step {i}: {metrics['time/step']:.2f} s (generate {metrics['time/generate']:.2f}, "
                  f"update {metrics['time/update']:.2f}) {kind}", flush=True)
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0] if k != "index"}
    prof_med = {k: statistics.median(r[k] for r in profiled) for k in profiled[0] if k != "index"}
    floor = prof_med["generate_gemm_s"] + prof_med["update_gemm_s"]
    attention = prof_med["generate_attention_s"] + prof_med["update_attention_s"]
    return {"precision": precision, "compiled": compiled, "timed_steps": timed, "profiled_steps": profiled,
            "median": med, "profiled_median": prof_med, "gemm_floor_s": floor, "attention_s": attention,
            "gemm_attention_floor_s": floor + attention,
            "update_gemm_share": prof_med["update_gemm_s"] / max(prof_med["update_gemm_s"] + prof_med["update_other_s"], 1e-9),
            "generate_gemm_share": prof_med["generate_gemm_s"] / max(prof_med["generate_gemm_s"] + prof_med["generate_other_s"], 1e-9),
            "update_gemm_gflops_per_s": prof_med["update_gemm_flops"] / max(prof_med["update_gemm_s"], 1e-9) / 1e9,
            "generate_gemm_gflops_per_s": prof_med["generate_gemm_flops"] / max(prof_med["generate_gemm_s"], 1e-9) / 1e9}


def _floor_over(profiled: list[dict], trl_by_index: list[float], parts: tuple[str, ...]) -> float:
    """Median over the profiled steps of (their `parts` seconds, sampling and update) / TRL's step of that index."""
    return statistics.median(sum(r[f"{g}_{c}_s"] for g in ("generate", "update") for c in parts) / trl_by_index[r["index"]]
                             for r in profiled)


def trl_steps(model_dir: Path, precision: str, runs: int, n_steps: int, work: Path) -> dict:
    """TRL's s/step at each step index 0..n_steps-1 (medians over `runs` fresh processes)."""
    from vs_trl import base_spec, run_worker

    per_run = []
    for seed in range(runs):
        spec = base_spec("trl", model_dir, precision, 1, seed)
        spec.update(warmup=0, steps=n_steps)
        res = run_worker(spec, work)
        per_run.append([s["step_s"] for s in res["steps"]])
        print(f"  [trl {precision}] run {seed}: " + ", ".join(f"{x:.2f}" for x in per_run[-1]) + " s/step", flush=True)
    return {"precision": precision, "s_per_step_by_index": [statistics.median(r[i] for r in per_run) for i in range(n_steps)],
            "runs": per_run}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--warmup", type=int, default=1, help="steps before the timed ones (the compilations), as vs_trl.py")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (medians)")
    ap.add_argument("--trl-runs", type=int, default=2, help="fresh TRL processes per size (0: skip TRL)")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="both frameworks' (auto: bf16 autocast where the CPU has native bf16, else fp32)")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                    help="train.compile and rollout.compile (auto: on under bf16, off in fp32, as `auto` chooses for long runs)")
    ap.add_argument("--out", default=str(HERE / "results" / "step_floor.json"))
    args = ap.parse_args(argv)

    import torch

    from matmul_peak import gflops
    from tether.hardware import resolve_autocast
    from vs_trl import build_model_dir, machine_description

    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config
    inductor_config.cpp.enable_kernel_profile = True  # compiled kernels by name (is_attention)
    t0 = time.time()
    precision = args.precision if args.precision != "auto" else "bf16" if resolve_autocast("auto", "cpu") else "fp32"
    peak = {"bf16": gflops(torch.bfloat16, 1536), "fp32": gflops(torch.float32, 1536)}
    print(f"  matmul peak (1536^3, one thread): bf16 {peak['bf16']:.0f}, fp32 {peak['fp32']:.0f} GFLOP/s", flush=True)
    out = {"command": "python benchmarks/step_floor.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "precision": precision, "matmul_peak_gflops_per_s": peak, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            md = build_model_dir(size, Path(tmp) / size)
            compiled = args.compile == "on" or args.compile == "auto" and precision == "bf16"
            res = tether_floor(size, md, precision, args.warmup, args.steps, compiled)
            res["update_gemm_of_peak"] = res["update_gemm_gflops_per_s"] / peak[precision]
            if args.trl_runs:  # step i against TRL's step i: both runs' completions shorten as they train
                trl = trl_steps(md, precision, args.trl_runs, args.warmup + 2 * args.steps, Path(tmp))
                by_i = trl["s_per_step_by_index"]
                res["trl"] = trl
                res["tether_over_trl"] = statistics.median(r["step_s"] / by_i[r["index"]] for r in res["timed_steps"])
                res["gemm_floor_over_trl"] = _floor_over(res["profiled_steps"], by_i, ("gemm",))
                res["gemm_attention_floor_over_trl"] = _floor_over(res["profiled_steps"], by_i, ("gemm", "attention"))
                res["trl"]["s_per_step"] = statistics.median(by_i[r["index"]] for r in res["timed_steps"])
            out["sizes"][size] = res
            med = res["median"]
            print(f"  [{size}] tether {med['step_s']:.2f} s/step: update {med['update_s']:.2f} s "
                  f"({res['update_gemm_share']:.0%} GEMM at {res['update_gemm_gflops_per_s']:.0f} GFLOP/s, "
                  f"{res['update_gemm_of_peak']:.2f} of peak), generate {med['generate_s']:.2f} s "
                  f"({res['generate_gemm_share']:.0%} GEMM); GEMM-only floor {res['gemm_floor_s']:.2f} s/step, "
                  f"with attention {res['gemm_attention_floor_s']:.2f}"
                  + (f"; TRL ({precision}) {res['trl']['s_per_step']:.2f} s/step at the timed steps: tether/TRL "
                     f"{res['tether_over_trl']:.2f}, floor/TRL {res['gemm_floor_over_trl']:.2f}, with attention "
                     f"{res['gemm_attention_floor_over_trl']:.2f}" if args.trl_runs else ""),
                  flush=True)
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
