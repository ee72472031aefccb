"""Where one RL step's time goes, op by op: the top ops by self CPU time in the sampling and in the update.

    python benchmarks/step_ops.py [--size small] [--precision bf16] [--compile true] [--rows 35] [--kernels]

vs_trl.py's benchmark step (8 prompts x 8 completions of the reverse task, one thread) after two
unprofiled steps (the compilations), then one step under torch.profiler. `--kernels` names inductor's
generated kernels in the table (torch._inductor.config.cpp.enable_kernel_profile) instead of one
"Call CompiledFxGraph" row per graph. step_floor.py gives the GEMM / everything-else split and the
comparison with TRL; this script the detail behind it.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--compile", default="true", choices=["true", "false"])
    ap.add_argument("--rows", type=int, default=35)
    ap.add_argument("--kernels", action="store_true")
    args = ap.parse_args(argv)

    import tempfile

    import torch

    import tether.recipes.rl as rl
    from paired import bench_state
    from step_floor import labelled_regions, region_events
    from vs_trl import build_model_dir, machine_description

    torch.set_num_threads(1)
    if args.kernels:
        import torch._inductor.config as inductor_config
        inductor_config.cpp.enable_kernel_profile = True
    m = machine_description(1)
    print(f"# {m['date']} {m['cpu']} ({m['cpu_class']}), python benchmarks/step_ops.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    with tempfile.TemporaryDirectory() as tmp, labelled_regions() as collect:
        cfg, st = bench_state(build_model_dir(args.size, Path(tmp) / args.size), args.precision, args.compile == "true")
        for i in range(2):
            met, _ = rl.run_rl_step(st, rl.RLVariant(collect=collect))
            st.step += 1
            print(f"step {i}: {met['time/step']:.3f} s (generate {met['time/generate']:.3f}, update {met['time/update']:.3f})")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            met, _ = rl.run_rl_step(st, rl.RLVariant(collect=collect))
        print(f"profiled step: {met['time/step']:.3f} s (the profiler slows the many small ops)")
    for region, (span_s, events) in region_events(prof, ("generate", "update")).items():
        agg: dict = defaultdict(lambda: [0.0, 0])
        for e in events:
            agg[e.name][0] += e.self_cpu_time_total / 1e6
            agg[e.name][1] += 1
        print(f"== {region}: {span_s:.3f} s; self times sum to {sum(v[0] for v in agg.values()):.3f} s")
        print(f"  {'ms':>8} {'calls':>6}  op")
        for name, (t, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[: args.rows]:
            print(f"  {t * 1000:8.1f} {n:6d}  {name[:100]}")

if __name__ == "__main__":
    main()
