"""Sampling speed of tether's generator on the vs_trl benchmark's batch, for before/after comparisons.

    python benchmarks/archive/gen_speed.py [--sizes small,large] [--precisions bf16,fp32] [--reps 4] [--out FILE]
    PYTHONPATH=/tmp/old/src python benchmarks/archive/gen_speed.py --label old   # another checkout's tether

One process, one torch thread: the vs_trl.py model of each size (the reverse task's byte-level
tokenizer + a tiny Llama), 8 prompts x 8 completions x up to 64 new tokens at temperature 1, the
same seeded generator on every run; `--reps` timed generations after one warm-up, median. The
decode floor is vs_trl.py's (bench_workers.measure_decode_floor: the weight matmuls of one decode
step, times the steps); the floor with KV reads adds the attention over the cache at each step's
length (bench_workers.measure_attention_floor). Appends one entry per invocation to `--out`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = ["abcdefg", "hgfedcb", "cabbage", "deadbeef", "faced", "bad", "accede", "egg"]


def benchmark_prompts(tokenizer) -> list[list[int]]:
    """The vs_trl benchmark batch's prompts: 8 words x 8 samples each."""
    return [tokenizer.encode("reverse the word: " + w) for w in WORDS for _ in range(8)]


def benchmark_policies(sizes: str, precision: str, prefix: str):
    """(size, policy, prompts) for each comma-separated size: the vs_trl.py model built in a
    temporary directory (removed after its turn), loaded at `precision`, with the benchmark batch's
    prompts; one torch thread."""
    import torch

    from tether.policy.hf import load_policy
    from vs_trl import build_model_dir

    torch.set_num_threads(1)
    for size in sizes.split(","):
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            pol = load_policy(build_model_dir(size, Path(tmp) / size), autocast_bf16=precision == "bf16")
            yield size, pol, benchmark_prompts(pol.tokenizer)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--precisions", default="bf16,fp32")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--label", default="")
    p.add_argument("--out", default=str(HERE / "results" / "gen_speed.json"))
    a = p.parse_args(argv)
    import torch

    import tether
    from bench_workers import measure_attention_floor, measure_decode_floor
    from tether.config import SamplingConfig
    from tether.policy.hf import load_policy, run_generate
    from vs_trl import build_model_dir

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tether-gen-speed-") as tmp:
        for size in a.sizes.split(","):
            model_dir = build_model_dir(size, Path(tmp) / size)
            for prec in a.precisions.split(","):
                pol = load_policy(model_dir, autocast_bf16=prec == "bf16")
                prompts = benchmark_prompts(pol.tokenizer)
                cfg, times, g = SamplingConfig(max_new_tokens=64), [], torch.Generator().manual_seed(0)
                for _ in range(a.reps + 1):
                    t0 = time.perf_counter()
                    samples = run_generate(pol, prompts, cfg, g)
                    times.append(time.perf_counter() - t0)
                steps = max(len(s.token_ids) for s in samples)
                floor = measure_decode_floor(pol.model, len(prompts), prec == "bf16") * steps
                att, width = measure_attention_floor(pol.model, len(prompts), prec == "bf16"), max(len(x) for x in prompts)
                kv = floor + sum(att["a"] + att["b"] * (width + t + 1) for t in range(steps))
                med = statistics.median(times[1:])
                rows.append({"size": size, "precision": prec, "gen_s": round(med, 4), "runs_s": [round(t, 4) for t in times[1:]],
                             "decode_steps": steps, "decode_floor_s": round(floor, 4), "gen_over_floor": round(med / floor, 2),
                             "decode_floor_kv_s": round(kv, 4), "gen_over_floor_kv": round(med / kv, 2)})
                print(f"[gen-speed] {a.label or 'this'} {size} {prec}: {med:.3f} s per generation "
                      f"({rows[-1]['gen_over_floor']:.2f}x the decode floor {floor:.3f} s; "
                      f"{rows[-1]['gen_over_floor_kv']:.2f}x with the KV cache's attention, {kv:.3f} s)", flush=True)
    return append_entry(a.out, rows, label=a.label, tether=str(Path(tether.__file__).parent))


def append_entry(out: str | Path, rows: list[dict], **extra) -> dict:
    """Append one invocation's entry (its rows, the CPU, load, date and command) to the JSON list in `out`."""
    from tether import hardware

    entry = {**extra, "date": _dt.datetime.now().isoformat(timespec="minutes"), "cpu": hardware.cpu_info(),
             "load_avg": list(os.getloadavg()), "command": " ".join(["python"] + sys.argv), "rows": rows}
    out = Path(out)
    data = json.loads(out.read_text()) if out.is_file() else []
    data.append(entry)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return entry


if __name__ == "__main__":
    main()
