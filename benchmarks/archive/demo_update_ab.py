"""The demo's update before and after one change, on one multi-turn batch, paired.

    python benchmarks/archive/demo_update_ab.py --change head [--model runs/demo-<ts>/sft/final_model] [--reps 10]
                                        [--vocab 32000] [--out benchmarks/results/head_demo.json]
    python benchmarks/archive/demo_update_ab.py --change fp32_sdpa ...

The demo's task (multi-hop QA with a `search` tool, configs/demo.yaml: 16 problems x 8 episodes, up
to 4 turns), fp32 as the demo runs, one thread. The model: the demo's SFT checkpoint when given
(`make demo` leaves one), else a 100-step SFT cold start here. One RL step's batch is collected,
then the update alone runs on it `--reps` times per setting from copies of one state, the settings
alternating ABBA (medians): the update is a third of the step and the sampling's noise would hide
its change. The changes ("before" is the code as it was, patched back in for the run):

- `head` (2026-12-03): the LM head only on the positions the loss reads (`needed_BT`); before,
  every position (the question, the tool's passages, the template) went through it. `--vocab
  32000` pads the model's vocabulary to a hub model's size after the batch is collected (the
  demo's is 600), where the head weighs more. Same results: tests/unit/core/test_needed_positions.py.
- `fp32_sdpa` (2026-12-03): the lean training forward's attention in fp32 through
  `F.scaled_dot_product_attention`; before, matmul, masked fill, softmax, matmul.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
sys.path.insert(0, str(HERE))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--change", required=True, choices=("head", "fp32_sdpa"))
    ap.add_argument("--model", default=None, help="an SFT checkpoint of the demo (default: a 100-step SFT here)")
    ap.add_argument("--reps", type=int, default=10, help="updates per setting")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=0, help="after collecting the batch, pad the model's vocabulary to this "
                                                        "size (new rows random): the LM head of a hub model's vocabulary")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/<change>_demo.json")
    args = ap.parse_args(argv)

    import torch

    import tether.train.update as update
    from tether.train.setup import precision_summary
    from tether.recipes.rl import build_train_batch
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state
    from tether.recipes.rl import collect_train_groups
    from vs_trl import machine_description

    t0 = time.time()
    cfg, policy, train, st = demo_state(args.model, args.threads)

    before, after = _settings(args.change)

    groups, _ = collect_train_groups(st, cfg)
    batch, _ = build_train_batch(st, cfg, groups)
    if args.vocab:
        policy.model.resize_token_embeddings(args.vocab, mean_resizing=False)
        st = build_rl_state(RunSettings(cfg), policy, train)  # an optimizer over the resized parameters
    times = {"before": [], "after": []}
    for i in range(2 * args.reps + 2):  # ABBA; the first two (one each) are warm-up
        name = ("before", "after")[(i + i // 2) % 2]
        (before if name == "before" else after)()
        s = copy.deepcopy(st)
        torch.manual_seed(0)
        t = time.perf_counter()
        update.run_update(update.UpdateContext.from_run(s, cfg.algo, cfg.train, cfg.rollout.sampling), batch)
        dt = time.perf_counter() - t
        after()
        if i >= 2:
            times[name].append(dt)
        print(f"  [update] {name:7s} {dt:.3f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"change": args.change, "command": "python benchmarks/archive/demo_update_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_description(args.threads), "precision": precision_summary(cfg.model, policy),
           "model": args.model or "100-step SFT of the demo here", "vocab": policy.model.config.vocab_size, "sequences": batch.num_seqs,
           "positions": int(batch.attention_mask_BT.sum()), "loss_positions": int((batch.loss_mask_BT > 0).sum()),
           "update_s": times, "median_s": med, "after_over_before": med["after"] / med["before"], "wall_s": time.time() - t0}
    print(f"loss positions: {out['loss_positions']} of {out['positions']} ({out['loss_positions'] / out['positions']:.1%}); "
          f"update after / before ({args.change}): {out['after_over_before']:.3f} (medians of {args.reps})")
    path = args.out or str(HERE / "results" / f"{args.change}_demo.json")
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


def demo_state(model: str | None, threads: int):
    """(config, policy in train mode, problems, RL state) of the demo's RL stage, from its SFT checkpoint
    `model`, or from a 100-step SFT cold start run here when None; seeded, `threads` torch threads."""
    import torch

    from tether.config import load_config
    from tether.policy.hf import load_policy
    from tether.train.setup import seed_everything, setup_problems
    from tether.recipes.demo import demo_config_path
    from tether.recipes.sft import run_sft
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state

    base = [f"run.threads={threads}", "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0",
            "health.mode=off", "sft.steps=100"]
    cfg = load_config(demo_config_path(), base + ([f"model.path={model}"] if model else []))
    seed_everything(cfg.run.seed, False, cfg.run.threads, cfg.run.retain_memory)
    if model:
        policy = load_policy(model, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    else:
        with tempfile.TemporaryDirectory(prefix="tether-demo-") as tmp:
            policy, _ = run_sft(cfg, Path(tmp) / "sft")
    torch.set_num_threads(threads)
    train, _ = setup_problems(cfg.data)
    policy.model.train()
    return cfg, policy, train, build_rl_state(RunSettings(cfg), policy, train)


def _settings(change: str):
    """(put the code as it was before `change`, put it back as it is now)."""
    import torch

    import tether.policy.lean_train as lean_train
    import tether.train.update as update

    if change == "head":
        now = update.compute_sequence_logprobs

        def every_position(*a, needed_BT=None, **k):
            return now(*a, **k)
        return (lambda: setattr(update, "compute_sequence_logprobs", every_position),
                lambda: setattr(update, "compute_sequence_logprobs", now))
    now = lean_train._attend

    def eager(q, k, v, keep, groups):
        if k.dtype != torch.float32:
            return now(q, k, v, keep, groups)
        kk, vv = lean_train._repeat_kv(k, groups), lean_train._repeat_kv(v, groups)
        scores = torch.matmul(q, kk.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
        scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
        return torch.matmul(torch.softmax(scores, dim=-1), vv)
    return (lambda: setattr(lean_train, "_attend", eager), lambda: setattr(lean_train, "_attend", now))


if __name__ == "__main__":
    main()
