"""Short probe before a long reward-model run: held-out pair accuracy curves of `tether rm` at a few
learning rates, on the pairs `benchmarks/rm_demo.py` builds (same problems, seeds and held-out pairs).

    python benchmarks/archive/rm_lr_probe.py --sft runs/rm-demo/seed-0/sft/final_model --lrs 1e-4,3e-4 --steps 500

Everything but rm.lr is rm_demo.py's RM recipe (batch 32, constant lr, seed 0). Appends one entry to
benchmarks/results/rm_lr_probe.json: per learning rate, the held-out pair accuracy every
`--eval-every` steps, the last training-batch accuracies, wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))

import rm_demo  # noqa: E402

from tether.config import load_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", required=True, help="the SFT start (final_model) the pairs are sampled from")
    ap.add_argument("--out", default="runs/rm-probe")
    ap.add_argument("--lrs", default="1e-4,3e-4")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=str(HERE / "results" / "rm_lr_probe.json"))
    a = ap.parse_args()
    from tether.train.setup import setup_problems
    from tether.recipes.rm import run_rm

    t0, c0 = time.perf_counter(), rm_demo.cpu_seconds()
    out, sft = Path(a.out), Path(a.sft)
    base = [f"run.seed={a.seed}", "run.threads=1", "logging.progress=false"]
    cfg = load_config(rm_demo.CONFIG, base)
    train, _ = setup_problems(cfg.data)
    # exactly rm_demo.run_seed's pairs
    pairs = rm_demo.build_pairs(cfg, sft, train[:800], (1.0, 1.5), 8, 0, a.seed)
    pairs += rm_demo.build_pairs(cfg, sft, train[:2000], (), 0, 4, a.seed)
    held = rm_demo.build_pairs(cfg, sft, train[800:1000], (1.0,), 8, 0, a.seed + 1)
    p, e = rm_demo.write_jsonl(out / "pairs" / "train.jsonl", pairs), rm_demo.write_jsonl(out / "pairs" / "eval.jsonl", held)
    res = {"pairs": {"train": len(pairs), "eval": len(held), "seconds": time.perf_counter() - t0,
                     "cpu_seconds": rm_demo.cpu_seconds() - c0}, "lrs": {}}
    for lr in [float(x) for x in a.lrs.split(",")]:
        t, c = time.perf_counter(), rm_demo.cpu_seconds()
        over = base + [f"model.path={sft}", f"rm.pairs={p}", f"rm.eval_pairs={e}", f"rm.steps={a.steps}",
                       "rm.batch_size=32", f"rm.lr={lr:g}", f"rm.eval_every={a.eval_every}"]
        run = out / f"rm_lr{lr:g}"
        s = run_rm(load_config(rm_demo.CONFIG, over), run, overwrite=True)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        curve = [(int(r["step"]), r["rm/eval_pair_accuracy"]) for r in rows if "rm/eval_pair_accuracy" in r]
        batch = [r["rm/train_batch_accuracy"] for r in rows if "rm/train_batch_accuracy" in r]
        res["lrs"][f"{lr:g}"] = {"overrides": over, "eval_curve": curve, "final_pair_accuracy": s["final_pair_accuracy"],
                                 "train_batch_accuracy_last_100": sum(batch[-100:]) / max(1, len(batch[-100:])),
                                 "seconds": time.perf_counter() - t, "cpu_seconds": rm_demo.cpu_seconds() - c}
        print(f"lr {lr:g}: held-out pair accuracy " + ", ".join(f"{st}: {acc:.3f}" for st, acc in curve), flush=True)
    from tether.hardware import cpu_info

    payload = {"command": "python benchmarks/archive/rm_lr_probe.py " + " ".join(sys.argv[1:]), "cpu": cpu_info(),
               "date": time.strftime("%Y-%m-%d %H:%M"), "wall_seconds": time.perf_counter() - t0,
               "cpu_seconds": rm_demo.cpu_seconds() - c0, **res}
    path = Path(a.results)
    doc = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    doc["invocations"].append(payload)
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
