"""Decode attention at the vs_trl batch, in three forms (docs/performance.md, "Finished rows leave
the batch; a compiled decode step"): what tether's lean decode step does (two batched matmuls over
the whole contiguous window around an fp32 softmax), PyTorch's scaled_dot_product_attention over
the written positions (a slice of the window), and the same over the whole window with the
padding bias. One thread, bf16, 64 rows x 4 heads x 64 dims, microseconds per layer (median of
`--reps` loops over `--layers` layers' caches, so that the caches compete for the cache memory as
in a generation). Appends its table to `--out`.

    python benchmarks/archive/decode_attention_forms.py [--reps 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--out", default=str(HERE / "results" / "decode_attention_forms.txt"))
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from tether import hardware

    torch.set_num_threads(1)
    B, h, d, L, bf = 64, 4, 64, a.layers, torch.bfloat16

    def per_layer_us(fn, loops: int = 20) -> float:
        fn()
        runs = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            runs.append((time.perf_counter() - t0) / loops / L * 1e6)
        return statistics.median(runs)

    lines = [f"# {dt.datetime.now().isoformat(timespec='minutes')} {hardware.cpu_info().get('model')} "
             f"class={hardware.cpu_class()} torch={torch.__version__}; us per layer, {L} layers' caches",
             "| window | written | bmm + softmax over the window (tether) | sdpa over the written slice | sdpa over the window + bias | max abs diff, sdpa vs tether |",
             "|---|---|---|---|---|---|"]
    with torch.inference_mode():
        for W, n in [(64, 40), (64, 60), (96, 70), (96, 90)]:
            ks = [torch.randn(B, h, W, d).to(bf) for _ in range(L)]
            vs = [torch.randn(B, h, W, d).to(bf) for _ in range(L)]
            q = torch.randn(B, h, 1, d).to(bf)
            bias = torch.zeros(B, 1, 1, W)
            bias[..., n:] = float("-inf")

            def tether(k, v):
                s = torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5 + bias
                return torch.matmul(torch.softmax(s, -1).to(bf), v)

            def sdpa_slice(k, v):
                return F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n])

            def sdpa_window(k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(bf))

            times = [per_layer_us(lambda f=f: [f(k, v) for k, v in zip(ks, vs)]) for f in (tether, sdpa_slice, sdpa_window)]
            diff = (sdpa_slice(ks[0], vs[0]).float() - tether(ks[0], vs[0]).float()).abs().max().item()
            lines.append(f"| {W} | {n} | {times[0]:.0f} | {times[1]:.0f} | {times[2]:.0f} | {diff:.4f} |")
            print(lines[-1], flush=True)
    with open(a.out, "a") as f:
        f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
