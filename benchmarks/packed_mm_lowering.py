"""The compiled decode step's packed matmuls as direct oneDNN calls (cpu_gemm.lower_packed_mm) against
calls back into Python (the custom op run as Python): as matmuls, and as RL steps.

    python benchmarks/packed_mm_lowering.py [--sizes small,large] [--pairs 4]
                                            [--out benchmarks/results/packed_mm_lowering.json]

First the matmuls alone (`calls`): a compiled chain of the small model's decode matmuls at 64 rows,
both ways, alternating; microseconds per matmul. Then the RL steps:

vs_trl.py's benchmark step (8 prompts x 8 completions of the reverse task, one thread) with tether at
its fastest on a native-bf16 CPU (bf16, `train.compile` and `rollout.compile` on). One process holds
two compilations of the decode step: one made before the lowering was registered (each packed matmul
calls `tether::packed_mm`'s Python, which calls oneDNN), one after (the generated code calls oneDNN).
The model and optimizer state is copied before every step and every step starts from it with the
same seed, so both run the same workload; they alternate (ABBA), `--pairs` steps each, and the
medians are compared. Only the sampling differs; the update runs the same code in both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _fresh_compile(fn):
    """torch.compile of a copy of `fn` with its own code object: dynamo keys its cache on the code
    object, so this compiles anew instead of reusing `fn`'s graphs."""
    import types

    import torch

    copy_fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return torch.compile(copy_fn, dynamic=None)


def paired(size: str, pairs: int, model_dir: Path) -> dict:
    import torch

    from paired import bench_state, paired_steps
    from tether.policy import cpu_gemm, decode

    if cpu_gemm._LOWERED:
        raise SystemExit("the lowering is already registered in this process: run this benchmark on its own")
    # inductor's FX graph cache keys on the graph, not on registered lowerings: without this the
    # second compilation would load the first one's code
    torch._inductor.config.fx_graph_cache = False
    cfg, st = bench_state(model_dir, "bf16", True)
    variants = {"python_op": _fresh_compile(decode.step_math)}

    def warm(name: str) -> None:  # before each warm-up step: the lowered variant compiles after the lowering
        if name == "lowered":
            if not cpu_gemm.lower_packed_mm():
                raise SystemExit("this PyTorch's inductor has no hook for the lowering: nothing to compare")
            variants["lowered"] = _fresh_compile(decode.step_math)

    def use(name: str):
        return lambda: decode._COMPILED.__setitem__("step", variants[name])

    prior = decode._COMPILED.get("step")
    try:
        res = paired_steps(cfg, st, {"python_op": use("python_op"), "lowered": use("lowered")}, pairs, size, warm=warm)
    finally:
        decode._COMPILED.pop("step", None)
        if prior is not None:
            decode._COMPILED["step"] = prior
    return {"runs": res["runs"], "median": res["median"], "lowered_over_python_op_time": res["b_over_a"]}


def calls(rounds: int = 7, reps: int = 200) -> dict:
    """Microseconds per packed bf16 matmul in a compiled chain of the small model's decode layers (64
    rows; each layer's qkv, o, gate/up and down weights, the SiLUs and residual between), python op against lowered;
    the two alternate over `rounds` rounds (medians)."""
    import statistics

    import torch
    import torch.nn.functional as F

    from tether.policy import cpu_gemm
    from vs_trl import SIZES

    torch._inductor.config.fx_graph_cache = False
    h, layers, _, inter = SIZES["small"]
    g = torch.Generator().manual_seed(0)
    shapes = [(3 * h, h), (h, h), (2 * inter, h), (h, inter)] * layers
    ws = [cpu_gemm.pack((torch.randn(n, k, generator=g) * k ** -0.5).bfloat16(), 64) for n, k in shapes]

    def chain(x, ws):  # a decode step's matmuls, one layer per 4 weights
        lin = cpu_gemm.packed_linear
        for qkv, o, gu, down in zip(ws[0::4], ws[1::4], ws[2::4], ws[3::4]):
            a = lin(F.silu(lin(x, qkv)[:, :h]), o)
            g, u = lin(a, gu).chunk(2, dim=-1)
            x = x + lin(F.silu(g) * u, down)
        return x

    x = torch.randn(64, h, generator=g).bfloat16()
    fns = {"python_op": _fresh_compile(chain)}
    with torch.inference_mode():
        fns["python_op"](x, ws)
        if not cpu_gemm.lower_packed_mm():
            raise SystemExit("this PyTorch's inductor has no hook for the lowering: nothing to compare")
        fns["lowered"] = _fresh_compile(chain)
        fns["lowered"](x, ws)
        assert torch.equal(fns["lowered"](x, ws), fns["python_op"](x, ws))
        per: dict = {k: [] for k in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                t = time.perf_counter()
                for _ in range(reps):
                    fn(x, ws)
                per[name].append((time.perf_counter() - t) / reps / len(ws) * 1e6)
    med = {k: statistics.median(v) for k, v in per.items()}
    print(f"  [calls] us per packed matmul (with the element-wise work between): python op {med['python_op']:.1f}, lowered {med['lowered']:.1f}",
          flush=True)
    return {"us_per_matmul": med, "rounds": per, "matmuls_per_call": len(ws)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--pairs", type=int, default=4, help="steps per variant")
    ap.add_argument("--out", default=str(HERE / "results" / "packed_mm_lowering.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one size, in this process, JSON to --out
    args = ap.parse_args(argv)

    import torch

    from tether.hardware import cpu_native_bf16
    from tether.policy import cpu_gemm
    from vs_trl import build_model_dir, machine_description

    if not cpu_native_bf16() or not cpu_gemm.can_pack(torch.bfloat16):
        raise SystemExit("needs a CPU with native bf16 and oneDNN (the setting that compiles a packed bf16 decode step)")
    torch.set_num_threads(1)
    if args.one == "calls":
        res = calls()
        Path(args.out).write_text(json.dumps(res) + "\n")
        return res
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            res = paired(args.one, args.pairs, build_model_dir(args.one, Path(tmp) / args.one))
        Path(args.out).write_text(json.dumps(res) + "\n")
        return res
    t0 = time.time()
    out = {"command": "python benchmarks/packed_mm_lowering.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "steps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for part in ["calls", *args.sizes.split(",")]:  # a process each: the lowering is registered process-wide
            path = Path(tmp) / f"{part}.json"
            subprocess.run([sys.executable, __file__, "--one", part, "--pairs", str(args.pairs), "--out", str(path)],
                           check=True)
            res = json.loads(path.read_text())
            if part == "calls":
                out["calls"] = res
            else:
                out["steps"][part] = res
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
