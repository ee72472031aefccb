"""Before/after of each tether speed change, in one process, arms alternating (part of vs_trl.py).

    python benchmarks/ablations.py [--sizes small,large] [--reps 5]

On the benchmark's own batch (8 prompts x 8 completions x up to 64 tokens of the reverse task):
- decode: transformers' DynamicCache (a cat per token: the old path) -> preallocated cache ->
  the lean Llama decode step, in fp32 and under bf16 autocast (ms per decode step);
- training forward+backward (the loss's log-probs and entropies): padded fp32 -> bf16 autocast
  with the stock sdpa attention -> bf16 with tether's CPU attention -> + sequence packing;
- pi_old: the separate no-grad scoring pass that the fused path (1 epoch, 1 mini-batch) skips;
- prefix sharing on this single-turn batch (short prompts: little to share), with the suffixes
  run as one padded forward (the old path) and in length buckets (each padded to its own longest),
  through transformers' modules, tether's lean training forward, and that forward compiled
  (`train.compile`; its compilation is in the warm-up call);
- glibc malloc keeping freed memory (`run.retain_memory`, tether.runtime): a process-wide
  setting, so its arms are whole RL runs in fresh processes (bench_workers.py), alternating, and
  the figure is the median update time (forward, backward, optimizer) of their timed steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _alternate(arms: dict, reps: int) -> dict[str, float]:
    for f in arms.values():
        f()  # warm-up
    times = {k: [] for k in arms}
    for _ in range(reps):
        for k, f in arms.items():
            times[k].append(f())
    return {k: statistics.median(v) for k, v in times.items()}


def _batch(model_dir: Path, threads: int):
    from bench_workers import load_cfg
    from vs_trl import base_spec

    from tether.policy.hf import load_policy
    from tether.train.setup import seed_everything, setup_problems
    from tether.recipes.rl import build_train_batch
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state
    from tether.recipes.rl import collect_train_groups

    cfg = load_cfg(base_spec("tether", model_dir, "fp32", threads, 0))
    seed_everything(0, False, threads)
    train, _ = setup_problems(cfg.data)
    policy = load_policy(str(model_dir))
    policy.model.train()
    st = build_rl_state(RunSettings(cfg), policy, train)
    groups, _ = collect_train_groups(st, cfg)
    batch, _ = build_train_batch(st, cfg, groups)
    prompts = [list(t.turns[0].context_ids) for g in groups for t in g.trajectories]
    return policy, batch, prompts, cfg


def decode_arms(policy, prompts, sampling, reps: int) -> dict[str, float]:
    import torch
    from transformers import DynamicCache

    from tether.policy import sampling as hf  # the sampler module: its cache factory is swapped per arm

    own_cache = hf._make_decode_cache

    def arm(bf16: bool, mode: str):
        pol = dataclasses.replace(policy, autocast_bf16=bf16, lean_decode=mode == "lean")

        def run() -> float:
            hf._make_decode_cache = (lambda m, c: DynamicCache(config=m.config)) if mode == "dynamic" else own_cache
            g = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    s = hf._generate_batch(pol, prompts, sampling, g, False)
            finally:
                hf._make_decode_cache = own_cache
            return (time.perf_counter() - t0) / max(len(x.token_ids) for x in s) * 1e3

        return run

    arms = {f"{p}/{m}": arm(p == "bf16", m) for p in ("fp32", "bf16") for m in ("dynamic", "preallocated", "lean")}
    return {k + " ms/decode-step": v for k, v in _alternate(arms, reps).items()}


def train_arms(policy, batch, reps: int) -> dict[str, float]:
    import copy

    from tether.policy.hf import compute_logprobs
    from tether.policy.prefix import compute_logprobs_shared

    sdpa = copy.deepcopy(policy.model)
    sdpa.set_attn_implementation("sdpa")
    fast = copy.deepcopy(policy.model)
    from tether.policy.attention import use_fast_cpu_attention

    use_fast_cpu_attention(fast)

    import tether.policy.prefix as prefix_mod

    min_rows = prefix_mod.MIN_BUCKET_ROWS

    def arm(model, bf16: bool, pack: bool = False, shared: bool = False, buckets: bool = True, lean: str = "off"):
        pol = dataclasses.replace(policy, model=model, autocast_bf16=bf16, lean_train=lean)

        def run() -> float:
            model.zero_grad(set_to_none=True)
            prefix_mod.MIN_BUCKET_ROWS = min_rows if buckets else 1 << 30  # 1 << 30: one suffix forward
            try:
                t0 = time.perf_counter()
                if shared:
                    lp, ent = compute_logprobs_shared(pol, batch.input_ids_BT, batch.attention_mask_BT, batch.seq_group_B,
                                                      with_entropy=True)
                else:
                    lp, ent = compute_logprobs(pol, batch.input_ids_BT, batch.attention_mask_BT, with_entropy=True, pack=pack)
                (lp * batch.loss_mask_BT).sum().backward()
                return time.perf_counter() - t0
            finally:
                prefix_mod.MIN_BUCKET_ROWS = min_rows

        return run

    arms = {"fp32 padded": arm(sdpa, False), "fp32 packed": arm(sdpa, False, pack=True),
            # without native bf16 (AVX2) the fp32 paths are the defaults: does the lean forward pay there too?
            "fp32 prefix-shared, suffix length buckets": arm(sdpa, False, shared=True),
            "fp32 prefix-shared, buckets, lean forward": arm(sdpa, False, shared=True, lean="eager"),
            "bf16 padded, stock sdpa": arm(sdpa, True), "bf16 padded, tether attention": arm(fast, True),
            "bf16 packed, tether attention": arm(fast, True, pack=True),
            "bf16 prefix-shared, one padded suffix forward": arm(fast, True, shared=True, buckets=False),
            "bf16 prefix-shared, suffix length buckets": arm(fast, True, shared=True),
            "bf16 prefix-shared, buckets, lean forward": arm(fast, True, shared=True, lean="eager"),
            "bf16 prefix-shared, buckets, lean forward compiled": arm(fast, True, shared=True, lean="compile")}
    return {k + " s fwd+bwd": v for k, v in _alternate(arms, reps).items()}


GEMM_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "mkldnn::_linear_pointwise")


def gemm_breakdown(policy, batch) -> dict[str, float]:
    """Where the training forward+backward's time goes (bf16, tether's default scoring path), from
    one profiled run: seconds in matrix multiplies vs everything else (self CPU time; the
    profiler's own overhead is in both), and the largest non-GEMM ops."""
    import copy

    import torch

    from tether.policy.attention import use_fast_cpu_attention
    from tether.policy.prefix import compute_sequence_logprobs

    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model), autocast_bf16=True)
    use_fast_cpu_attention(pol.model)  # what load_policy(..., autocast_bf16=True) runs with

    def run():
        pol.model.zero_grad(set_to_none=True)
        lp, ent = compute_sequence_logprobs(pol, batch.input_ids_BT, batch.attention_mask_BT, batch.seq_group_B,
                                            with_entropy=True, pack=True, share="auto")
        (lp * batch.loss_mask_BT).sum().backward()

    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev) / 1e6
    gemm = sum(e.self_cpu_time_total for e in ev if e.key in GEMM_OPS) / 1e6
    other = sorted((e for e in ev if e.key not in GEMM_OPS), key=lambda e: -e.self_cpu_time_total)[:6]
    out = {"profiled fwd+bwd s": total, "of which GEMM s": gemm, "GEMM share": gemm / total}
    out.update({f"non-GEMM {e.key} s": e.self_cpu_time_total / 1e6 for e in other})
    return out


def old_logprob_pass(policy, batch, cfg, reps: int) -> dict[str, float]:
    import torch

    from tether.train.update import compute_batch_logprobs

    pol = dataclasses.replace(policy, autocast_bf16=True)

    def run() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            compute_batch_logprobs(pol, batch, 1.0, cfg.train.micro_batch_tokens, pack=True)
        return time.perf_counter() - t0

    return {"pi_old scoring pass skipped by the fused path (bf16, packed) s": _alternate({"x": run}, reps)["x"]}


def retain_memory_arms(model_dir: Path, threads: int, reps: int, work: Path) -> dict[str, float]:
    """Median update seconds of whole RL runs (fresh processes, alternating) with glibc's default
    malloc behaviour and with `run.retain_memory`, plus the page faults of each RL step."""
    from vs_trl import base_spec, run_worker

    times: dict[str, list[float]] = {"false": [], "true": []}
    faults: dict[str, list[float]] = {"false": [], "true": []}
    for _ in range(reps):
        for flag in times:
            spec = base_spec("tether", model_dir, "bf16", threads, 0)
            spec.update(steps=3, tether_overrides=[f"run.retain_memory={flag}"])
            res = run_worker(spec, work)
            timed = res["steps"][spec["warmup"]:]
            times[flag].append(statistics.median(s["phases"]["time/update"] for s in timed))
            faults[flag].append(statistics.median(s["step_faults"] for s in timed))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"update s, glibc default malloc": med["false"], "update s, run.retain_memory": med["true"],
            "page faults per RL step, glibc default": statistics.median(faults["false"]),
            "page faults per RL step, run.retain_memory": statistics.median(faults["true"])}


def run_ablations(sizes: list[str], threads: int = 1, reps: int = 5) -> dict:
    import torch

    from tether.config import SamplingConfig
    from vs_trl import build_model_dir

    torch.set_num_threads(threads)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model_dir = build_model_dir(size, Path(tmp) / size)
            policy, batch, prompts, cfg = _batch(model_dir, threads)
            r = reps if size == "small" else max(3, reps - 2)
            res = {"tokens": int(batch.attention_mask_BT.sum()), "padded_tokens": int(batch.attention_mask_BT.numel())}
            res.update(decode_arms(policy, prompts, SamplingConfig(max_new_tokens=64), r))
            res.update(train_arms(policy, batch, r))
            res.update(old_logprob_pass(policy, batch, cfg, r))
            res.update(gemm_breakdown(policy, batch))
            if size == "small":  # whole-run arms: small only (a large run is ~1 min per arm)
                res.update(retain_memory_arms(model_dir, threads, r, Path(tmp)))
            out[size] = res
            print(f"  [ablations] {size}: " + ", ".join(f"{k} {v:.3g}" for k, v in res.items()), flush=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    print(json.dumps(run_ablations(a.sizes.split(","), a.threads, a.reps), indent=2))
