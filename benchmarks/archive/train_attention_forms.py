"""The training forward's attention under bf16, forward + backward, in four forms (docs/performance.md,
"Tried on 2026-12-04, no gain"): what tether's lean training forward runs (`lean_train._attend`: bf16
matmuls around an fp32 softmax), the same through torch.compile, and PyTorch's
scaled_dot_product_attention with the boolean mask in bf16 and in fp32.

    python benchmarks/archive/train_attention_forms.py [--reps 12] [--out FILE]

Shapes: the suffix bucket of vs_trl.py's benchmark step (64 sequences of up to 80 suffix tokens
attending to a 30-token prefix and causally to themselves), with the small model's 4 heads and the
large model's 8, head dim 64. One thread; milliseconds per forward + backward (median of `--reps`
after 2 discarded), and each form's largest difference from tether's output. Appends to `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--out", default=str(HERE / "results" / "train_attention_forms.txt"))
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from tether.policy.lean_train import _attend

    torch.set_num_threads(1)
    def tether(q, k, v, keep):  # as layer_forward calls it: under bf16 autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _attend(q, k, v, keep, 1)
    forms = {
        "tether (matmul, fp32 softmax)": tether,
        "tether, compiled": torch.compile(tether, dynamic=False),
        "sdpa bf16": lambda q, k, v, keep: F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
        "sdpa fp32": lambda q, k, v, keep: F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=keep).to(v.dtype),
    }
    R, Wq, P, d = 64, 80, 30, 64
    lines = [f"# {dt.date.today()} python benchmarks/archive/train_attention_forms.py {' '.join(argv or sys.argv[1:])}",
             "heads | form | ms fwd+bwd | max |diff| from tether"]
    gen = torch.Generator().manual_seed(0)
    keep = (torch.arange(P + Wq)[None] <= torch.arange(P, P + Wq)[:, None]).expand(R, 1, Wq, P + Wq).contiguous()
    for heads in (4, 8):
        base = [torch.randn(R, heads, n, d, generator=gen).to(torch.bfloat16) for n in (Wq, P + Wq, P + Wq)]
        with torch.no_grad():
            ref = tether(*base, keep).float()
        for name, fn in forms.items():
            times = []
            for _ in range(a.reps + 2):
                q, k, v = (t.clone().requires_grad_() for t in base)
                t0 = time.perf_counter()
                fn(q, k, v, keep).float().square().sum().backward()
                times.append(time.perf_counter() - t0)
            with torch.no_grad():
                diff = (fn(*base, keep).float() - ref).abs().max().item()
            lines.append(f"{heads} | {name} | {statistics.median(times[2:]) * 1e3:.1f} | {diff:.3g}")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    with open(a.out, "a") as f:
        f.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
