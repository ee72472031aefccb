"""The sampler's decode-step options, in one process (docs/performance.md, "Finished rows leave the
batch; a compiled decode step").

    python benchmarks/archive/decode_arms.py [--sizes small,large] [--rounds 7] [--precision bf16]
                                     [--stop-every 0] [--out FILE]

Times generation of the vs_trl benchmark's batch (8 prompts x 8 completions x up to 64 tokens,
one torch thread) with three arms, alternated `--rounds` times, the same seeded generator for all:

- `eager`: the lean decode step, finished rows dropped from the batch (the default);
- `eager_all_rows`: the same step decoding every row to the end (`sampling._COMPACT = 0`, as before
  2026-12-02); `rows_identical_to_all_rows` is the share of rows whose tokens equal `eager`'s (1.0
  unless the matmul kernels round differently at another row count, which then moves a draw);
- `compiled`: `rollout.compile` (the step through torch.compile); its first call, which compiles,
  is reported apart (`compile_first_call_s`; a fresh `TORCHINDUCTOR_CACHE_DIR` measures a cold
  compilation) and left out of the median.

- `compiled_cpp_wrapper` (with `--cpp-wrapper`): the same compiled step with inductor's C++ wrapper
  (`options={"cpp_wrapper": True}`: the graph's calls from C++ instead of Python); tried 2026-12-04.

Medians of all rounds but the first. `--stop-every K` makes every K-th token id a stop id as well
(a synthetic spread of completion lengths: the benchmark's untrained model mostly runs to the
limit, so dropping finished rows has little to drop there). Appends one entry to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--stop-every", type=int, default=0, help="also stop on every K-th token id (0: the model's own stop ids)")
    p.add_argument("--cpp-wrapper", action="store_true", help="add the compiled step with inductor's C++ wrapper")
    p.add_argument("--out", default=str(HERE / "results" / "decode_arms.json"))
    a = p.parse_args(argv)
    import torch

    from bench_workers import measure_decode_floor
    from gen_speed import append_entry, benchmark_policies
    from tether.config import SamplingConfig
    from tether.policy import decode, sampling
    from tether.policy.hf import run_generate

    steps_fn = {"compiled": decode.compiled_step()}
    if a.cpp_wrapper:
        steps_fn["compiled_cpp_wrapper"] = torch.compile(decode.step_math, dynamic=None, options={"cpp_wrapper": True})

    share, rows = sampling._COMPACT, []
    try:
        for size, pol, prompts in benchmark_policies(a.sizes, a.precision, "tether-decode-arms-"):
            if a.stop_every:
                pol = dataclasses.replace(pol, stop_ids=tuple(sorted(set(pol.stop_ids) | set(
                    range(0, pol.model.config.vocab_size, a.stop_every)))))
            cfg = SamplingConfig(max_new_tokens=64)
            arms = {"eager": (share, pol), "eager_all_rows": (0.0, pol),
                    **{k: (share, dataclasses.replace(pol, compile_decode=True)) for k in steps_fn}}
            times: dict[str, list[float]] = {k: [] for k in arms}
            tokens, lengths, same, first_compile = {}, [], [], {}
            for r in range(a.rounds + 1):
                for arm, (compact, policy) in arms.items():
                    sampling._COMPACT = compact
                    decode._COMPILED["step"] = steps_fn.get(arm, steps_fn["compiled"])
                    t0 = time.perf_counter()
                    out = run_generate(policy, prompts, cfg, torch.Generator().manual_seed(r))
                    dt = time.perf_counter() - t0
                    if arm in steps_fn and arm not in first_compile:
                        first_compile[arm] = dt  # the compilation; not a round
                        continue
                    times[arm].append(dt)
                    tokens[arm] = [s.token_ids for s in out]
                    if arm == "eager":
                        lengths.append(sum(len(s.token_ids) for s in out) / len(out))
                same.append(sum(x == y for x, y in zip(tokens["eager"], tokens["eager_all_rows"])) / len(prompts))
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            steps = 64
            floor = measure_decode_floor(pol.model, len(prompts), a.precision == "bf16") * steps
            rows.append({"size": size, "precision": a.precision, "stop_every": a.stop_every,
                         "mean_completion_tokens": round(statistics.mean(lengths), 1),
                         **{f"{k}_s": round(v, 4) for k, v in med.items()},
                         "all_rows_over_eager": round(med["eager_all_rows"] / med["eager"], 3),
                         "rows_identical_to_all_rows": round(statistics.mean(same), 3),
                         "compiled_over_eager": round(med["compiled"] / med["eager"], 3),
                         "compile_first_call_s": round(first_compile["compiled"], 2),
                         **({"cpp_wrapper_over_compiled": round(med["compiled_cpp_wrapper"] / med["compiled"], 3),
                             "cpp_wrapper_first_call_s": round(first_compile["compiled_cpp_wrapper"], 2)}
                            if a.cpp_wrapper else {}),
                         "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default"),
                         "weight_floor_64_steps_s": round(floor, 4),
                         "runs_s": {k: [round(x, 4) for x in v] for k, v in times.items()}})
            x = rows[-1]
            print(f"[decode-arms] {size} {a.precision} (mean completion {x['mean_completion_tokens']} tokens): "
                  f"eager {med['eager']:.3f} s, all rows {med['eager_all_rows']:.3f} s, compiled "
                  f"{med['compiled']:.3f} s (first call {first_compile['compiled']:.1f} s); weight floor of 64 steps "
                  f"{floor:.3f} s", flush=True)
            if a.cpp_wrapper:
                print(f"[decode-arms] {size} {a.precision}: C++ wrapper {med['compiled_cpp_wrapper']:.3f} s, "
                      f"{x['cpp_wrapper_over_compiled']:.3f} of compiled (first call "
                      f"{x['cpp_wrapper_first_call_s']:.1f} s)", flush=True)
    finally:
        sampling._COMPACT = share
        decode._COMPILED["step"] = steps_fn["compiled"]
    return append_entry(a.out, rows)


if __name__ == "__main__":
    main()
