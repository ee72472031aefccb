"""Per-rank memory of FSDP2 trainer ranks (issue 20): the bytes of parameters, gradients and AdamW
state each rank holds after one update, unsharded vs `fully_shard` over 1, 2 and 4 gloo ranks.

    python benchmarks/fsdp_memory.py                 # -> benchmarks/results/fsdp_memory.json
    python benchmarks/fsdp_memory.py --worlds 2      # one arm

The model is the "large" benchmark model of benchmarks/vs_trl.py (Llama, hidden 512, 8 layers,
tied embeddings, fp32), random init; one update (GRPO loss, 2 mini-batches) on 8 random rows of
32 tokens, so the optimizer state exists. Bytes are exact (`tether.dist.fsdp.compute_local_bytes`);
peak RSS (ru_maxrss) also counts torch/transformers and the full model every rank builds before
sharding it, so it falls by less than the state does. Every rank runs on the same 2 cores here:
the seconds are not a scaling measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, LAYERS, HEADS, INTER, VOCAB = 512, 8, 8, 1376, 256


def _policy():
    from transformers import LlamaConfig, LlamaForCausalLM

    from tether.policy.hf import HFPolicy

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=HEADS, intermediate_size=INTER, tie_word_embeddings=True, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    model.train()
    return HFPolicy(model=model, tokenizer=None, stop_ids=(), pad_id=0)


def _batch():
    from tether.types import TrainBatch

    g = torch.Generator().manual_seed(1)
    B, T = 8, 32
    ids = torch.randint(1, VOCAB, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.bool)
    loss = torch.ones(B, T)
    loss[:, :8] = 0
    adv = torch.randn(B, generator=g)[:, None].expand(B, T) * loss
    return TrainBatch(ids, am, loss, -3.0 * loss, adv.contiguous(), torch.arange(B) // 4, torch.arange(B))


def _rank(rank: int, world: int, port: int, sharded: bool, out: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as tdist

    from tether.config import load_config
    from tether.dist.fsdp import ShardedDataParallel, compute_local_bytes, shard_model
    from tether.dist.trainer import do_init_group
    from tether.optim import build_optimizer
    from tether.train.update import UpdateContext, run_update

    cfg = load_config(None, ["algo.mini_batches=2", "train.micro_batch_tokens=128", "train.share_prefix='off'"])
    policy, dp = _policy(), None
    if sharded:
        do_init_group(rank, world, "127.0.0.1", port, "gloo", 300)
        shard_model(policy.model)
        dp = ShardedDataParallel(rank, world, cfg.train.micro_batch_tokens)
    opt = build_optimizer(list(policy.model.parameters()), cfg.train.lr)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    run_update(UpdateContext(policy, opt, cfg.algo, cfg.train, generator=gen, dp=dp), _batch() if rank == 0 else None)
    row = {"rank": rank, "update_s": round(time.perf_counter() - t0, 2), **compute_local_bytes(policy.model, opt),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    row["total"] = row["params"] + row["grads"] + row["optimizer"]
    Path(out, f"rank{rank}.json").write_text(json.dumps(row))
    if sharded:
        tdist.destroy_process_group()


def run_arm(world: int, sharded: bool, tmp: Path) -> dict:
    import torch.multiprocessing as mp

    from tether.dist.trainer import find_free_port

    d = tmp / f"w{world}_{int(sharded)}"
    d.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(world, find_free_port(), sharded, str(d)), nprocs=world, join=True)
    ranks = [json.loads((d / f"rank{r}.json").read_text()) for r in range(world)]
    return {"world": world, "sharding": "fsdp2" if sharded else "none", "ranks": ranks}


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="1,2,4", help="FSDP2 world sizes (the unsharded arm always runs)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/fsdp_memory.json"))
    args = ap.parse_args()
    n_params = sum(p.numel() for p in _policy().model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        arms = [run_arm(1, False, Path(tmp))] + [run_arm(int(w), True, Path(tmp)) for w in args.worlds.split(",")]
    base = arms[0]["ranks"][0]["total"]
    for arm in arms:
        arm["max_rank_total_over_unsharded"] = round(max(r["total"] for r in arm["ranks"]) / base, 4)
    result = {"command": "python benchmarks/fsdp_memory.py --worlds " + args.worlds, "torch": torch.__version__,
              "model": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "intermediate": INTER, "vocab": VOCAB,
                        "params": n_params, "dtype": "float32", "tied_embeddings": True},
              "arms": arms}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for arm in arms:
        print(arm["sharding"], arm["world"], [(r["total"] >> 20, r["peak_rss_mb"]) for r in arm["ranks"]],
              arm["max_rank_total_over_unsharded"])


if __name__ == "__main__":
    main()
