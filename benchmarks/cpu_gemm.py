"""oneDNN against PyTorch's default kernels for tether's CPU linear layers (tether.policy.cpu_gemm), as matmuls and as RL steps.

    python benchmarks/cpu_gemm.py [--sizes small,large] [--pairs 4] [--precisions fp32,bf16]
                                  [--out benchmarks/results/cpu_gemm.json]

1. Matmuls, one thread, on the benchmark models' shapes (vs_trl.SIZES: every layer's q/k/v, o,
   gate/up and down weights, cycled through as a step does, so the weights are not all in cache):
   - training rows (3072 tokens), fp32: the forward (F.linear = MKL's sgemm, against oneDNN's
     inner product) and the input gradient (grad @ w: mm against oneDNN with w transposed);
   - decoding rows (64), fp32 and bf16: F.linear against oneDNN with the weight packed once.
   GFLOP/s are medians over rounds in which the variants alternate.
2. RL steps (vs_trl.py's benchmark step: 8 prompts x 8 completions of the reverse task), paired:
   one model and optimizer state is copied before every step and every step starts from it with the
   same seed, so both settings of TETHER_CPU_GEMM (torch: PyTorch's default kernels, F.linear; onednn) run the
   same workload; they alternate (ABBA) and the medians of `--pairs` steps each are compared.
   fp32 eager and bf16 with both compilations on (the two settings `auto` picks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TRAIN_ROWS, DECODE_ROWS = 3072, 64


def _layer_weights(size: str, dtype):
    import torch

    from vs_trl import SIZES

    h, layers, _, inter = SIZES[size]
    shapes = [(3 * h, h), (h, h), (2 * inter, h), (h, inter)]
    return [[torch.randn(n, k, dtype=dtype) for n, k in shapes] for _ in range(layers)]


def _time_pass(fn, weights, reps: int) -> float:
    """Seconds for fn(w) over every layer's weights, once (the mean of `reps` passes)."""
    every = [w for layer in weights for w in layer]
    for w in every:
        fn(w)
    t = time.perf_counter()
    for _ in range(reps):
        for w in every:
            fn(w)
    return (time.perf_counter() - t) / reps


def matmuls(size: str, rounds: int) -> dict:
    """GFLOP/s of each variant over one pass through every layer's weights."""
    import torch
    import torch.nn.functional as F

    lp = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # noqa: E731
    w32 = _layer_weights(size, torch.float32)
    x = {k: torch.randn(TRAIN_ROWS, k) for k in {w.shape[1] for layer in w32 for w in layer}}
    g = {n: torch.randn(TRAIN_ROWS, n) for n in {w.shape[0] for layer in w32 for w in layer}}
    w32_t = [[w.t().contiguous() for w in layer] for layer in w32]  # [in, out]: grad @ w as a linear layer
    cases = [("fp32 train forward", "torch", lambda w: F.linear(x[w.shape[1]], w), w32, TRAIN_ROWS),
             ("fp32 train forward", "onednn", lambda w: lp(x[w.shape[1]], w), w32, TRAIN_ROWS),
             ("fp32 train input grad", "torch", lambda w: g[w.shape[0]].mm(w), w32, TRAIN_ROWS),
             ("fp32 train input grad", "onednn", lambda w: lp(g[w.shape[1]], w), w32_t, TRAIN_ROWS)]
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported() and dt == torch.bfloat16:
            print(f"  [{size}] bf16 decode skipped: this CPU's oneDNN does not do bf16", flush=True)
            continue
        ws = _layer_weights(size, dt)
        xd = {k: torch.randn(DECODE_ROWS, k, dtype=dt) for k in {w.shape[1] for layer in ws for w in layer}}
        packed = [[torch.ops.mkldnn._reorder_linear_weight(w, DECODE_ROWS) for w in layer] for layer in ws]
        in_features = {id(p): w.shape[1] for lp_, lw in zip(packed, ws) for p, w in zip(lp_, lw)}
        cases += [(f"{name} decode", "torch", lambda w, xd=xd: F.linear(xd[w.shape[1]], w), ws, DECODE_ROWS),
                  (f"{name} decode", "onednn packed", lambda w, xd=xd, k=in_features: lp(xd[k[id(w)]], w), packed,
                   DECODE_ROWS)]
    flops = {rows: sum(2 * rows * w.numel() for layer in w32 for w in layer) / 1e9 for rows in (TRAIN_ROWS, DECODE_ROWS)}
    times: dict = {}
    for _ in range(rounds):  # the variants alternate within every round
        for label, variant, fn, ws, rows in cases:
            times.setdefault((label, variant, rows), []).append(_time_pass(fn, ws, 1 if rows > 1000 else 20))
    out: dict = {}
    for (label, variant, rows), ts in times.items():
        out.setdefault(label, {})[variant] = round(flops[rows] / statistics.median(ts), 1)
    for label, row in out.items():
        other = next(v for k, v in row.items() if k != "torch")
        row["onednn_over_torch_speed"] = round(other / row["torch"], 3)
        print(f"  [{size}] {label:22s} GFLOP/s: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return out


def paired_steps(size: str, precision: str, pairs: int, model_dir: Path) -> dict:
    from paired import bench_state, paired_steps as run_pairs
    from tether.policy import cpu_gemm

    compiled = precision == "bf16"
    cfg, st = bench_state(model_dir, precision, compiled)
    prior = os.environ.get(cpu_gemm.ENV)

    def setting(name: str):
        def apply():
            os.environ[cpu_gemm.ENV] = name
            cpu_gemm.reset()
        return apply

    try:
        res = run_pairs(cfg, st, {"torch": setting("torch"), "onednn": setting("onednn")}, pairs, f"{size} {precision}")
    finally:
        if prior is None:
            os.environ.pop(cpu_gemm.ENV, None)
        else:
            os.environ[cpu_gemm.ENV] = prior
        cpu_gemm.reset()
    return {"compiled": compiled, "runs": res["runs"], "median": res["median"], "onednn_over_torch_time": res["b_over_a"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--pairs", type=int, default=4, help="steps per setting (0: matmuls only)")
    ap.add_argument("--rounds", type=int, default=5, help="matmul rounds (medians)")
    ap.add_argument("--out", default=str(HERE / "results" / "cpu_gemm.json"))
    args = ap.parse_args(argv)

    import torch

    from tether.hardware import cpu_native_bf16
    from vs_trl import build_model_dir, machine_description

    torch.set_num_threads(1)
    t0 = time.time()
    out = {"command": "python benchmarks/cpu_gemm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "matmuls": {}, "steps": {}}
    precisions = [p for p in args.precisions.split(",") if p]
    if "bf16" in precisions and not cpu_native_bf16():
        print("  no native bf16 on this CPU: bf16 steps skipped", flush=True)
        precisions.remove("bf16")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            out["matmuls"][size] = matmuls(size, args.rounds)
            if args.pairs:
                md = build_model_dir(size, Path(tmp) / size)
                for precision in precisions:
                    out["steps"][f"{size} {precision}"] = paired_steps(size, precision, args.pairs, md)
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
