"""tether's generation of the vs_trl batch (one thread): time against the decode floor, and with a
third argument a torch.profiler table of per-op self CPU time.

    python benchmarks/decode_profile.py small fp32 [prof] [compiled]

`compiled`: with `rollout.compile` (the decode step through torch.compile; warmed up first).
"""
import sys, tempfile, time, statistics
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
from torch.profiler import profile, ProfilerActivity
from bench_workers import measure_decode_floor
from tether.config import SamplingConfig
from tether.policy.hf import load_policy, run_generate
from vs_trl import build_model_dir
WORDS = ["abcdefg", "hgfedcb", "cabbage", "deadbeef", "faced", "bad", "accede", "egg"]
torch.set_num_threads(1)
size = sys.argv[1]; prec = sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    d = build_model_dir(size, Path(tmp) / size)
    pol = load_policy(d, autocast_bf16=prec == "bf16")
    pol.compile_decode = "compiled" in sys.argv[3:]
    print(pol.model.config.num_hidden_layers, pol.model.config.hidden_size, pol.model.config.intermediate_size, pol.model.config.num_attention_heads)
    prompts = [pol.tokenizer.encode("reverse the word: " + w) for w in WORDS for _ in range(8)]
    cfg, g = SamplingConfig(max_new_tokens=64), torch.Generator().manual_seed(0)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); s = run_generate(pol, prompts, cfg, g); ts.append(time.perf_counter() - t0)
    steps = max(len(x.token_ids) for x in s)
    floor = measure_decode_floor(pol.model, len(prompts), prec == "bf16")
    print(f"gen {statistics.median(ts[1:]):.3f}s steps {steps} floor/step {floor*1e3:.3f} ms -> {statistics.median(ts[1:])/(floor*steps):.2f}x; per step {statistics.median(ts[1:])/steps*1e3:.3f} ms")
    if "prof" in sys.argv[3:]:
        with profile(activities=[ProfilerActivity.CPU]) as p:
            run_generate(pol, prompts, cfg, g)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
