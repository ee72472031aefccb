"""Prefix sharing saving on a multi-turn group (part of `vs_trl.py`; runnable alone).

    python benchmarks/bench_prefix.py [--size small|large] [--precision bf16|fp32]

The group: 8 trajectories of one agent task that share their context up to the branching turn
(system prompt + tool schemas + task + the first tool call and its result: 256 tokens), then
differ for three more turns (action 24, observation 16, action 24, observation 16, action 16
tokens = 96). Token ids are random (speed does not depend on them). The loss is the training
loss shape: log-probs and entropies of every action token, forward + backward. Shared and
unshared runs alternate; the figure is the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_group(vocab: int, n: int = 8, shared: int = 256, turns=(24, 16, 24, 16, 16), seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(4, vocab, (shared,), generator=g)
    seqs, masks = [], []
    for _ in range(n):
        parts, loss = [prefix], [torch.zeros(shared)]
        for k, t in enumerate(turns):
            parts.append(torch.randint(4, vocab, (t,), generator=g))
            loss.append(torch.full((t,), 1.0 if k % 2 == 0 else 0.0))  # actions are trained, observations not
        seqs.append(torch.cat(parts))
        masks.append(torch.cat(loss))
    ids = torch.stack(seqs)
    return ids, torch.ones_like(ids, dtype=torch.bool), torch.stack(masks), torch.zeros(n, dtype=torch.long)


def run_prefix_bench(threads: int = 1, size: str = "small", precision: str = "bf16", reps: int = 5) -> dict:
    import torch

    from tether.policy.hf import compute_logprobs, load_policy
    from tether.policy.prefix import compute_logprobs_shared, compute_shared_prefix_lengths, count_shared_tokens
    from vs_trl import build_model_dir

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        policy = load_policy(build_model_dir(size, Path(tmp) / size), autocast_bf16=precision == "bf16")
    policy.model.train()
    ids, attn, loss_mask, group = make_group(len(policy.tokenizer))

    def step(shared: bool) -> float:
        policy.model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if shared:
            lp, ent = compute_logprobs_shared(policy, ids, attn, group, with_entropy=True)
        else:
            lp, ent = compute_logprobs(policy, ids, attn, with_entropy=True)
        ((lp - 0.01 * ent) * loss_mask).sum().backward()
        return time.perf_counter() - t0

    step(False), step(True)  # warm-up
    times = {False: [], True: []}
    for _ in range(reps):
        for shared in (False, True):
            times[shared].append(step(shared))
    lengths = attn.sum(-1).tolist()
    key, prefix = compute_shared_prefix_lengths(ids, lengths, group.tolist())
    unshared_tok, shared_tok = count_shared_tokens(lengths, key, prefix)
    u, s = statistics.median(times[False]), statistics.median(times[True])
    return {"description": f"{len(ids)} trajectories x {lengths[0]} tokens, {prefix[0]} shared (multi-turn, {size} model, {precision})",
            "unshared_s": u, "shared_s": s, "saving": 1 - s / u, "speedup": u / s,
            "tokens_unshared": unshared_tok, "tokens_shared": shared_tok, "token_saving": 1 - shared_tok / unshared_tok,
            "unshared_each": times[False], "shared_each": times[True]}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="small")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    print(json.dumps(run_prefix_bench(a.threads, a.size, a.precision), indent=2))
