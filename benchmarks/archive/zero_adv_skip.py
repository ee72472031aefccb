"""Zero-advantage sequences forward only (`train.skip_zero_advantage`), against every sequence through
the backward, on the benchmark's RL step.

    python benchmarks/archive/zero_adv_skip.py [--size small] [--precision fp32] [--fractions 0,0.25,0.5,0.75]
                                       [--pairs 3] [--out benchmarks/results/zero_adv_skip.json]

vs_trl.py's benchmark step (8 prompts x 8 completions of the reverse task, dense reward) with the
advantages of the first k of its 8 groups set to 0 after the credit assignment, as GRPO gives a
group whose rewards are all equal (`frac_zero_variance_groups` of a run); k = fraction x 8. At each
fraction the two settings run paired (paired.py: the same state and seed before every step, ABBA,
medians of `--pairs` steps each). Expected: the update shrinks by about 2/3 of the zero-advantage
share (a forward is ~1/3 of forward + backward), the sampling not at all. The same update in
both settings is tests/unit/core/test_update_inert.py's.

    python benchmarks/archive/zero_adv_skip.py --first-step [--size small] [--precision bf16]
                                       [--out benchmarks/results/zero_adv_first_step.json]

The one-time cost of the first zero-advantage step under `train.compile` (bf16; the compiled
training forward): each arm in a fresh process with an empty inductor cache runs 2 steps without
zero-advantage groups (the compilation, a warm step), then 3 steps with 4/8; reported: the first of
those 3 updates minus the median of the other 2. Arms: "one-graph" (tether: the rows without
gradients run the graph compiled with them, detached: lean_train.LeanShared) and "two-graphs"
(the same rows through a second, no-grad graph, as before 2026-12-04). Then, in one process with
both graphs compiled, the two arms per call, paired (paired.py, `--pairs`): at 4/8 zero-advantage
groups, and with `algo.epochs=2` (a scoring pass without gradients before the update).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))


def zeroing_build(k: int):
    """build_train_batch, then the first k groups' advantages set to 0."""
    from tether.recipes.rl import build_train_batch

    def build(st, cfg, groups):
        batch, bm = build_train_batch(st, cfg, groups)
        batch.advantages_BT[batch.seq_group_B < k] = 0.0
        return batch, bm
    return build


def at_fraction(cfg, st, k: int, pairs: int, label: str) -> dict:
    import tether.recipes.rl as rl
    from paired import paired_steps

    def setting(on: bool):
        def apply():
            cfg.train.skip_zero_advantage = on
        return apply

    original = rl.run_rl_step
    rl.run_rl_step = functools.partial(original, variant=rl.RLVariant(build=zeroing_build(k)))
    try:
        return paired_steps(cfg, st, {"full": setting(False), "skip": setting(True)}, pairs, label)
    finally:
        rl.run_rl_step = original
        cfg.train.skip_zero_advantage = True


def first_step_child(arm: str, size: str, precision: str) -> dict:
    """One arm of --first-step, in this (fresh) process."""
    import copy
    import random

    import torch

    import tether.recipes.rl as rl
    from paired import bench_state
    from tether.policy import lean_train
    from vs_trl import build_model_dir

    if arm == "two-graphs":  # the rows without gradients through a no-grad graph of their own
        lean_train.LeanShared.__call__ = lean_train.LeanShared._forward
    torch.set_num_threads(1)
    original, updates = rl.run_rl_step, []
    with tempfile.TemporaryDirectory() as tmp:
        cfg, st = bench_state(build_model_dir(size, Path(tmp) / size), precision, True)
        for k in (0, 0, 4, 4, 4):
            s = copy.deepcopy(st)
            torch.manual_seed(0)
            random.seed(0)
            m, _ = functools.partial(original, variant=rl.RLVariant(build=zeroing_build(k)))(s)
            updates.append(m["time/update"])
            print(f"  [{arm}] {k}/8 zero-advantage groups: update {m['time/update']:.2f} s", file=sys.stderr, flush=True)
    first, later = updates[2], sorted(updates[3:])
    return {"arm": arm, "updates_s": updates, "first_zero_adv_extra_s": first - sum(later) / len(later)}


def per_call(size: str, precision: str, pairs: int) -> dict:
    """--first-step's paired per-call comparison of the two arms (both graphs compiled in the warm-up)."""
    import torch

    import tether.recipes.rl as rl
    from paired import bench_state, paired_steps
    from tether.policy import lean_train
    from vs_trl import build_model_dir

    torch.set_num_threads(1)
    one_graph = lean_train.LeanShared.__call__

    def arm(call):
        def apply():
            lean_train.LeanShared.__call__ = call
        return apply
    arms, original, out = {"two-graphs": arm(lean_train.LeanShared._forward), "one-graph": arm(one_graph)}, rl.run_rl_step, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, st = bench_state(build_model_dir(size, Path(tmp) / size), precision, True)
            for name, k, epochs in (("zero-advantage 4/8", 4, 1), ("2 epochs (scoring pass)", 0, 2)):
                cfg.algo.epochs = epochs
                rl.run_rl_step = functools.partial(original, variant=rl.RLVariant(build=zeroing_build(k)))
                out[name] = paired_steps(cfg, st, arms, pairs, f"{size} {precision} {name}")
    finally:
        rl.run_rl_step, lean_train.LeanShared.__call__ = original, one_graph
    return out


def first_step(args, argv) -> dict:
    import os
    import subprocess

    out = {"command": "python benchmarks/archive/zero_adv_skip.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "size": args.size, "precision": args.precision, "arms": {}}
    for arm in ("two-graphs", "one-graph"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--first-step-child", arm, "--size", args.size, "--precision", args.precision]
            res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        out["arms"][arm] = json.loads(res.stdout.strip().splitlines()[-1])
    from vs_trl import machine_description

    out["machine"] = machine_description(1)
    out["per_call"] = per_call(args.size, args.precision, args.pairs)
    rows = [f"{arm:10s} | first zero-advantage update minus a warm one: {r['first_zero_adv_extra_s']:.2f} s"
            for arm, r in out["arms"].items()]
    rows += [f"one-graph / two-graphs, {name}: update {r['b_over_a']['update_s']:.3f}, step {r['b_over_a']['step_s']:.3f}"
             for name, r in out["per_call"].items()]
    return _report(out, "train.compile, rows without gradients: one graph vs two", rows, args.out)


def _report(out: dict, header: str, rows: list[str], path: str) -> dict:
    """Print the summary table, write `out` to `path`."""
    print("\n" + header)
    for row in rows:
        print("  " + row)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=("small", "large"))
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--compiled", action="store_true", help="both compilations on (train.compile, rollout.compile)")
    ap.add_argument("--fractions", default="0,0.25,0.5,0.75")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=None, help="default: results/zero_adv_skip.json (--first-step: "
                                                  "results/zero_adv_first_step.json)")
    ap.add_argument("--first-step", action="store_true", help="the one-time cost of the first zero-advantage step "
                                                              "under train.compile, one graph vs two")
    ap.add_argument("--first-step-child", choices=("one-graph", "two-graphs"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.first_step_child:
        print(json.dumps(first_step_child(args.first_step_child, args.size, args.precision)))
        return {}
    if args.first_step:
        args.out = args.out or str(HERE / "results" / "zero_adv_first_step.json")
        return first_step(args, argv)
    args.out = args.out or str(HERE / "results" / "zero_adv_skip.json")

    import torch

    from paired import bench_state
    from vs_trl import build_model_dir, machine_description

    torch.set_num_threads(1)
    t0 = time.time()
    out = {"command": "python benchmarks/archive/zero_adv_skip.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(1), "size": args.size, "precision": args.precision,
           "compiled": args.compiled, "groups": 8, "fractions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cfg, st = bench_state(build_model_dir(args.size, Path(tmp) / args.size), args.precision, args.compiled)
        for f in (float(x) for x in args.fractions.split(",")):
            k = round(f * 8)
            res = at_fraction(cfg, st, k, args.pairs, f"{args.size} {args.precision} zero-advantage {k}/8")
            res["expected_update_ratio"] = 1 - 2 / 3 * k / 8
            out["fractions"][f"{k}/8"] = res
    out["wall_s"] = time.time() - t0
    return _report(out, "zero-advantage groups | update skip/full (expected ~) | step skip/full",
                   [f"{key:5s} | {r['b_over_a']['update_s']:.3f} ({r['expected_update_ratio']:.3f}) | "
                    f"{r['b_over_a']['step_s']:.3f}" for key, r in out["fractions"].items()], args.out)


if __name__ == "__main__":
    main()
