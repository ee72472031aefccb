"""The matmul peak this process gets, fp32 and bf16, and the CPU as tether sees it.

    python benchmarks/archive/matmul_peak.py [--n 1024] [--threads 1] [--out FILE]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/archive/matmul_peak.py

The second form checks an AVX2-only simulation on a newer CPU (docs/performance.md): under the caps
bf16 matmuls lose their native kernels and tether's effective CPU class is `avx2`. Prints one JSON
line; `--out` appends it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def gflops(dtype, n: int, reps: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out")
    a = p.parse_args(argv)
    import torch

    from tether import hardware

    torch.set_num_threads(a.threads)
    info = hardware.cpu_info()
    row = {"cpu": info["model"], "effective_flags": info["flags"], "isa_mask": info.get("isa_mask", {}),
           "cpu_class": hardware.cpu_class(info), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": a.threads, "n": a.n, "fp32_gflops": round(gflops(torch.float32, a.n), 1),
           "bf16_gflops": round(gflops(torch.bfloat16, a.n), 1), "load_avg": list(os.getloadavg())}
    print(json.dumps(row))
    if a.out:
        with Path(a.out).open("a") as fh:
            fh.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
