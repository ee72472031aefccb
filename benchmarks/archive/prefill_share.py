"""How much of the demo's multi-turn sampling is prefill: every turn re-runs its whole context.

    python benchmarks/archive/prefill_share.py [--model runs/demo-<ts>/sft/final_model] [--steps 3]
                                       [--out benchmarks/results/prefill_share_demo.json]

The demo's task (multi-hop QA with a `search` tool, configs/demo.yaml, 16 problems x 8 episodes, up
to 4 turns), fp32, one thread. The sampler keeps no KV cache from one turn to the next: each turn's
`generate` call prefills every live episode's whole context (question, earlier turns, the tool's
passages; left-padded to the longest, distinct contexts once). This times the prefill calls
(`tether.policy.sampling.next_token_logits`) inside the rollout's `time/generate` and counts their
rows, padded positions and real tokens. A measurement for a future change (a cache carried across
turns, or length buckets for the prefill), not of one.
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
    ap.add_argument("--steps", type=int, default=3, help="rollout steps (the first is a warm-up)")
    ap.add_argument("--out", default=str(HERE / "results" / "prefill_share_demo.json"))
    args = ap.parse_args(argv)

    import tether.policy.sampling as sampling
    from demo_update_ab import demo_state
    from tether.recipes.rl import collect_train_groups
    from vs_trl import machine_description

    t0 = time.time()
    cfg, _, _, st = demo_state(args.model, 1)
    original = sampling.next_token_logits
    acc: dict = {}

    def timed(model, ids_BT, mask_BT, *a, **k):
        t = time.perf_counter()
        out = original(model, ids_BT, mask_BT, *a, **k)
        acc["prefill_s"] += time.perf_counter() - t
        acc["calls"] += 1
        acc["rows"] += ids_BT.shape[0]
        acc["positions"] += ids_BT.numel()
        acc["tokens"] += int(mask_BT.sum())
        return out

    steps = []
    sampling.next_token_logits = timed
    try:
        for i in range(args.steps):
            acc.update(prefill_s=0.0, calls=0, rows=0, positions=0, tokens=0)
            _, m = collect_train_groups(st, cfg)
            rec = dict(acc, generate_s=m["time/generate"], gen_tokens=m.get("rollout/gen_tokens"))
            rec["prefill_share"] = rec["prefill_s"] / rec["generate_s"]
            steps.append(rec)
            print(f"  step {i}{' (warm-up)' if i == 0 else ''}: generate {rec['generate_s']:.2f} s, prefill "
                  f"{rec['prefill_s']:.2f} s ({rec['prefill_share']:.0%}) in {rec['calls']} calls, {rec['rows']} rows, "
                  f"{rec['positions']} positions for {rec['tokens']} tokens; {rec['gen_tokens']:.0f} tokens sampled", flush=True)
    finally:
        sampling.next_token_logits = original
    timed_steps = steps[1:] or steps
    out = {"command": "python benchmarks/archive/prefill_share.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "model": args.model or "100-step SFT of the demo here", "steps": steps,
           "prefill_share_mean": sum(s["prefill_share"] for s in timed_steps) / len(timed_steps),
           "padding_share_mean": sum(1 - s["tokens"] / s["positions"] for s in timed_steps) / len(timed_steps),
           "wall_s": time.time() - t0}
    print(f"prefill {out['prefill_share_mean']:.0%} of sampling time; {out['padding_share_mean']:.0%} of the prefilled "
          "positions are padding")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
