"""The demo's rollout sampling time, for comparing two source trees in alternating processes.

    PYTHONPATH=<tree>/src python benchmarks/archive/demo_generate_time.py --model runs/demo-<ts>/sft/final_model
        [--steps 5] [--label <tree>]

Runs the demo's rollout (configs/demo.yaml: 16 problems x 8 episodes of multi-hop QA, up to 4 turns,
fp32, one thread) `steps` times from the same state and seed, and prints one JSON line: each step's
`time/generate` after the first (a warm-up) and their median. Alternate two trees' runs (ABAB...) and
compare medians: a change's effect on sampling without the update's time and noise around it.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (archived one level below)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an SFT checkpoint of the demo (default: a 100-step SFT here)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--label", default="", help="a name for this tree in the output")
    args = ap.parse_args(argv)

    import torch

    import tether
    from demo_update_ab import demo_state
    from tether.recipes.rl import collect_train_groups

    cfg, _, _, st = demo_state(args.model, 1)
    times = []
    for _ in range(args.steps):
        s = copy.deepcopy(st)
        torch.manual_seed(0)
        random.seed(0)
        _, m = collect_train_groups(s, cfg)
        times.append(m["time/generate"])
    out = {"label": args.label, "tether": str(Path(tether.__file__).parent), "generate_s": times[1:],
           "median_s": statistics.median(times[1:])}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
