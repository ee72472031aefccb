"""A learned reward standing in for a hidden verifier (issue 19): SFT -> reward model -> RL against it.

    python benchmarks/rm_demo.py [--seeds 0] [--out runs/rm-demo] [--quick]

1. SFT on the reverse task's weak-teacher demonstrations (configs/reverse.yaml).
2. A Bradley-Terry reward model (`tether rm`) from the SFT policy's own samples, paired by the
   verifier (correct over incorrect) — the only place the verifier is used for training.
3. RL against the reward model alone: `exact_match` stays in the config with weight 0, so the
   policy never sees it; it is the verified correctness that held-out pass@1 and the health layer
   read (`reward.correctness`).
4. The same RL against a deliberately weak reward model (`rm.steps` tiny, few pairs), to see
   whether the health layer flags the exploitation (the `reward_hacking` detector's findings in
   health.jsonl, and when they came relative to the held-out accuracy).

Writes benchmarks/results/rm_demo.json (every figure, the CPU it ran on, wall times).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from tether.config import load_config

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "configs" / "reverse.yaml"


def _rl_overrides(rm_dir: Path, sft_model: Path, steps: int) -> list[str]:
    comps = ("reward.components=[{name: exact_match, weight: 0.0}, {name: reward_model, "
             f"kwargs: {{path: '{rm_dir}', normalize: none}}}}]")
    return [f"model.path={sft_model}", comps, "reward.correctness=exact_match", f"train.steps={steps}",
            "eval.every=10", "logging.progress=false", "health.mode=advise"]


def _findings(run: Path) -> list[dict]:
    path = run / "health.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == "finding"]


def _eval_curve(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(int(r["step"]), float(r["eval/pass@1"])) for r in rows if "eval/pass@1" in r]


def run_seed(seed: int, out: Path, quick: bool) -> dict:
    from tether.recipes.rl import run_rl
    from tether.recipes.rm import run_rm
    from tether.recipes.sft import run_sft

    base = [f"run.seed={seed}", "logging.progress=false"] + (["sft.steps=60", "train.steps=6"] if quick else [])
    t0 = time.perf_counter()
    cfg = load_config(CONFIG, base)
    run_sft(cfg, out / "sft")
    sft_model = out / "sft" / "final_model"
    t_sft = time.perf_counter() - t0
    rm_steps, weak_steps = (20, 2) if quick else (200, 3)
    res = {"seed": seed, "sft_seconds": t_sft}
    for name, extra in (("rm", [f"rm.steps={rm_steps}"]),
                        ("weak_rm", [f"rm.steps={weak_steps}", "rm.problems=16", "rm.lr=5e-4"])):
        t = time.perf_counter()
        rm = run_rm(load_config(CONFIG, base + [f"model.path={sft_model}"] + extra), out / name)
        res[name] = {"pair_accuracy": rm["final_pair_accuracy"], "pairs": rm["train_pairs"] + rm["eval_pairs"],
                     "baseline_pair_accuracy": rm["baseline_pair_accuracy"], "seconds": time.perf_counter() - t}
        t = time.perf_counter()
        steps = 6 if quick else 60
        rl = run_rl(load_config(CONFIG, base + _rl_overrides(out / name / "final_model", sft_model, steps)), out / f"rl_{name}")
        curve = _eval_curve(out / f"rl_{name}")
        finds = [f for f in _findings(out / f"rl_{name}") if "reward" in str(f.get("detector", f.get("mode", "")))]
        res[f"rl_{name}"] = {"baseline_accuracy": rl["baseline_accuracy"], "final_accuracy": rl["final_accuracy"],
                             "lift_points": 100 * ((rl["final_accuracy"] or 0) - (rl["baseline_accuracy"] or 0)),
                             "eval_curve": curve, "reward_findings": finds[:5],
                             "first_reward_finding_step": min((int(f.get("step", 1 << 30)) for f in finds), default=None),
                             "seconds": time.perf_counter() - t}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default="runs/rm-demo")
    ap.add_argument("--quick", action="store_true", help="a smoke run (minutes): tiny steps, numbers meaningless")
    ap.add_argument("--results", default=str(HERE / "results" / "rm_demo.json"))
    a = ap.parse_args()
    from tether.hardware import cpu_info

    t0 = time.perf_counter()
    seeds = [int(s) for s in a.seeds.split(",")]
    runs = [run_seed(s, Path(a.out) / f"seed-{s}", a.quick) for s in seeds]
    payload = {"command": f"python benchmarks/rm_demo.py --seeds {a.seeds}" + (" --quick" if a.quick else ""),
               "quick": a.quick, "cpu": cpu_info(), "python": platform.python_version(),
               "date": time.strftime("%Y-%m-%d %H:%M"), "wall_seconds": time.perf_counter() - t0, "runs": runs}
    Path(a.results).write_text(json.dumps(payload, indent=1, default=str))
    for r in runs:
        for arm in ("rl_rm", "rl_weak_rm"):
            x = r[arm]
            print(f"seed {r['seed']} {arm}: held-out pass@1 {x['baseline_accuracy']:.3f} -> {x['final_accuracy']:.3f} "
                  f"({x['lift_points']:+.1f} points); RM pair accuracy {r[arm[3:]]['pair_accuracy']:.3f}; "
                  f"first reward finding at step {x['first_reward_finding_step']}")
    print(f"wrote {a.results}")


if __name__ == "__main__":
    main()
