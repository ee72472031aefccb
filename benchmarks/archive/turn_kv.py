"""Keys/values carried across turns (tether.policy.kv_reuse) on the demo's multi-turn RL step: paired A/B.

    python benchmarks/archive/turn_kv.py [--model runs/demo-<ts>/sft/final_model] [--pairs 4] [--threads 1]
                                 [--out benchmarks/results/turn_kv_demo.json]

The demo's task (multi-hop QA with a `search` tool, configs/demo.yaml: 16 problems x 8 episodes, up
to 4 turns, fp32). A: every turn's prefill runs the whole context (`policy.reuse_turn_kv = False`, as
before 2026-12-03); B: the keys/values saved at the end of a turn's sampling are reused by the next
turn's prefill. Both run the same RL steps from the same state and seed (benchmarks/paired.py: ABBA
after a warm-up each); the figures are B's median times over A's, and the share of prompt positions
the prefill reused or ran in B. The sampled tokens can differ between the arms where rounding moves
a draw (fp32: the reused keys/values equal recomputed ones to ~1e-6).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an SFT checkpoint of the demo (default: a 100-step SFT here)")
    ap.add_argument("--pairs", type=int, default=4, help="steps per arm after the warm-up (ABBA)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results" / "turn_kv_demo.json"))
    args = ap.parse_args(argv)

    from demo_update_ab import demo_state
    from paired import paired_steps
    from vs_trl import machine_description

    t0 = time.time()
    cfg, _, _, st = demo_state(args.model, args.threads)
    shares: list = []
    settings = {"whole": lambda: setattr(st.policy, "reuse_turn_kv", False),
                "reuse": lambda: setattr(st.policy, "reuse_turn_kv", True)}
    import tether.policy.kv_reuse as kv_reuse

    plan = kv_reuse.TurnKV.plan

    def counting_plan(self, prompts, width):
        out = plan(self, prompts, width)
        shares.append((len(prompts) * width, len(prompts) * (width if out is None else out[0]),
                       sum(len(p) for p in prompts)))
        return out

    kv_reuse.TurnKV.plan = counting_plan
    try:
        res = paired_steps(cfg, st, settings, args.pairs, "turn kv")
    finally:
        kv_reuse.TurnKV.plan = plan
    padded, run, tokens = (sum(s[i] for s in shares) for i in range(3))
    out = {"command": "python benchmarks/archive/turn_kv.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(args.threads), "model": args.model or "100-step SFT of the demo here",
           **res, "reuse_prefill_positions_run_frac": run / padded, "reuse_prompt_tokens": tokens,
           "reuse_prompt_positions_padded": padded, "wall_s": time.time() - t0}
    print(f"reuse / whole: generate {res['b_over_a']['generate_s']:.3f}, step {res['b_over_a']['step_s']:.3f}; "
          f"with reuse the prefill ran {run / padded:.0%} of the padded prompt positions")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
