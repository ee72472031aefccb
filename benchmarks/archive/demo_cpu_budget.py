"""CPU-time budget of `tether demo` (its defaults) from a shortened run: per SFT step, per RL step, per eval.

    python benchmarks/archive/demo_cpu_budget.py SFT_STEPS RL_STEPS [key=value ...]     # e.g. 30 4

Process CPU time around the SFT and the RL stage, and around every RL step and evaluation. With one
torch thread (the demo's setting) CPU time stays close to the wall time of a free core on a
busy machine; the full demo's budget is extrapolated from these parts
(benchmarks/results/demo_cpu_budget_avx2.json)."""
import time, sys, json, os, tempfile
import tether.recipes.rl as rl
from tether.config import load_config
from tether.recipes.demo import demo_config_path
from tether.recipes.sft import run_sft
acc = {"eval": [], "rl_step": []}
ev, st = rl._evaluate, rl.run_rl_step
def timed(name, fn):
    def w(*a, **k):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn(*a, **k)
        acc[name].append((time.process_time() - c0, time.perf_counter() - t0))
        return out
    return w
rl._evaluate = timed("eval", ev); rl.run_rl_step = timed("rl_step", st)
sft_steps, rl_steps = int(sys.argv[1]), int(sys.argv[2])
extra = sys.argv[3:]
cfg = load_config(demo_config_path(), [f"sft.steps={sft_steps}", f"train.steps={rl_steps}", "logging.progress=false", "checkpoint.every=0"] + extra)
tmp = tempfile.mkdtemp(prefix="tether-demo-budget-")
c0, t0 = time.process_time(), time.perf_counter()
policy, s = run_sft(cfg, f"{tmp}/sft")
c_sft, w_sft = time.process_time() - c0, time.perf_counter() - t0
c1 = time.process_time()
summary = rl.run_rl(cfg, f"{tmp}/rl", policy=policy)
c_rl = time.process_time() - c1
out = {"sft_cpu_s": c_sft, "sft_wall_s": w_sft, "sft_steps": sft_steps, "rl_cpu_s": c_rl, "evals": acc["eval"], "rl_steps": acc["rl_step"],
       "load": os.getloadavg(), "precision": summary["precision"]["precision"], "extra": extra}
print(json.dumps(out))
