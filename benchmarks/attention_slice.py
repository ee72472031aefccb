"""Batched decode attention over a slice of a longer KV buffer vs over the whole buffer (docs/performance.md, "The sampler").

    python benchmarks/attention_slice.py > benchmarks/results/attention_slice.txt

One thread; batch 64, 4 heads, head dim 64, buffer of 84 positions; microseconds per call (best of 5 x 200)
for matmul attention (what the lean decoder runs), PyTorch SDPA and a multiply-sum form, at 30, 60 and 84
(= the whole buffer) positions, fp32 and bf16.
"""
import torch, time, torch.nn.functional as F
torch.set_num_threads(1)
B, kvh, g, d, cap = 64, 4, 1, 64, 84
def bench(fn, reps=200):
    fn(); ts=[]
    for _ in range(5):
        t0=time.perf_counter()
        for _ in range(reps): fn()
        ts.append((time.perf_counter()-t0)/reps)
    return min(ts)*1e6
for n in (30, 60, 84):
    for dt in (torch.float32, torch.bfloat16):
        K = torch.randn(B, kvh, cap, d).to(dt); V = torch.randn(B, kvh, cap, d).to(dt)
        q = torch.randn(B, kvh, g, d).to(dt); bias = torch.zeros(B, 1, 1, cap)
        k, v = K[:, :, :n], V[:, :, :n]; bb = bias[..., :n]
        def mm():
            s = torch.matmul(q, k.transpose(-1, -2)) * 0.125 + bb
            a = torch.softmax(s, -1).to(dt)
            return torch.matmul(a, v)
        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bb.to(dt), scale=0.125)
        def mulsum():
            s = (q * k).sum(-1, keepdim=True).transpose(-1,-2).float() * 0.125 + bb  # [B,kvh,1,n]
            a = torch.softmax(s, -1).to(dt)
            return (a.transpose(-1,-2) * v).sum(-2, keepdim=True)
        r = {f.__name__: bench(f) for f in (mm, sdpa, mulsum)}
        print(n, dt, {k: f"{v:.0f}us" for k, v in r.items()})
