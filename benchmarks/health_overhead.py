"""The health layer's cost on the demo (`tether demo`, health.mode advise - its default): the share of
the RL step time spent on the monitor and the update's probes.

    python benchmarks/health_overhead.py [--out benchmarks/results/health_overhead.json] [--set key=value ...]
    python benchmarks/health_overhead.py --batch-checks FILE   # add the batch-phase checks' time to FILE (below)

The layer times itself in the run (metrics.jsonl): `time/health` (the monitor after each step: the
trajectory statistics, the fingerprints of the trainer's weights and buffers, every detector, the
diagnosis), `time/probes` (inside the update: the probe rows' forwards and the step statistics) and
`time/fingerprint` (the rollout's weight and buffer fingerprints). The overhead is their sum over
the RL step time without them: sum(health + probes + fingerprint) / sum(step - probes - fingerprint)
over every RL step. Not timed in the run: the checks of the batch phase (advantage alignment, loss-mask
coverage per position, the token agreement of each row with what the sampler drew; a few reductions over
the batch and one comparison per row) and, in the update, where a rollout/trainer log-prob gap sits (a few
elementwise passes over the batch) - `--batch-checks` times them on a batch of the
demo's shape (the run's mean sequences and length), adds them per step, and recomputes the share. A self-timed share, because a paired on/off comparison cannot resolve 2% on a
shared 2-core machine (run-to-run wall time moves more than that); the file also records the CPU
seconds and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

KEYS = ("time/health", "time/probes", "time/fingerprint")


def compute_overhead(rows: list[dict]) -> dict:
    """The layer's share of the step time from an RL run's metrics rows (those with `time/step`)."""
    steps = [r for r in rows if "time/step" in r]
    cost = {k: sum(float(r.get(k, 0.0)) for r in steps) for k in KEYS}
    inside = cost["time/probes"] + cost["time/fingerprint"]  # counted in time/step
    base = sum(float(r["time/step"]) for r in steps) - inside
    per_step = [(sum(float(r.get(k, 0.0)) for k in KEYS)) / (float(r["time/step"]) - float(r.get("time/probes", 0.0))
                                                            - float(r.get("time/fingerprint", 0.0))) for r in steps]
    return {"steps": len(steps), "step_seconds_without_layer": base, "layer_seconds": cost,
            "overhead_frac": sum(cost.values()) / base if base > 0 else None,
            "overhead_frac_per_step_median": sorted(per_step)[len(per_step) // 2] if per_step else None,
            "overhead_frac_per_step_max": max(per_step) if per_step else None}


def time_batch_checks(sequences: int, length: int, group: int = 8, repeats: int = 50) -> float:
    """Seconds per step of the batch phase's health checks on a batch of `sequences` x `length` tokens."""
    import torch

    from tether.health import compute_advantage_alignment, compute_mask_coverage, compute_token_agreement
    from tether.train.probes import compute_logp_shift

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    adv, mask = torch.randn(sequences, length, generator=gen), (torch.rand(sequences, length, generator=gen) > 0.3).float()
    scores, groups, ok = torch.rand(sequences, generator=gen), torch.arange(sequences) // group, torch.ones(sequences, dtype=torch.bool)
    ids, attn = torch.randint(0, 64, (sequences, length), generator=gen), torch.ones(sequences, length, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(repeats):
        compute_advantage_alignment(adv, scores, mask, groups)
        compute_mask_coverage(mask, mask > 0, ok)
        kept_ids, kept_attn = ids.clone(), attn.clone()  # the batch build keeps the engine's ids apart
        compute_token_agreement(ids, attn, kept_ids, kept_attn, mask > 0)
        # in the update, untimed there: where a rollout/trainer log-prob gap sits, once over the batch's rows
        compute_logp_shift(adv, adv + 0.1, mask)
    return (time.perf_counter() - t0) / repeats


def add_batch_checks(path: Path) -> None:
    """Add the batch-phase checks' time (per step, on the run's batch shape) to a result file."""
    res = json.loads(path.read_text())
    if "batch_shape" not in res:  # a file of the first version of this script: the demo config's largest batch
        from tether.config import load_config
        from tether.recipes.demo import demo_config_path

        cfg = load_config(demo_config_path(), [])
        res["batch_shape"] = {"sequences": cfg.rollout.problems_per_step * cfg.rollout.n,
                              "tokens_per_sequence": cfg.model.tiny.max_position_embeddings, "from": "the demo config (an upper bound)"}
    sec = time_batch_checks(int(res["batch_shape"]["sequences"]), int(res["batch_shape"]["tokens_per_sequence"]))
    res["batch_checks_seconds_per_step"] = sec
    total = sum(res["layer_seconds"].values()) + sec * res["steps"]
    res["overhead_frac_with_batch_checks"] = total / res["step_seconds_without_layer"]
    res["command"] += "; python benchmarks/health_overhead.py --batch-checks " + str(path)
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"batch checks {sec * 1e3:.2f} ms per step; overhead with them {res['overhead_frac_with_batch_checks']:.2%}")


def _batch_shape(rows: list[dict]) -> dict:
    steps = [r for r in rows if "batch/sequences" in r]
    seqs = sum(r["batch/sequences"] for r in steps) / max(len(steps), 1)
    toks = sum(r.get("batch/loss_tokens", 0.0) for r in steps) / max(len(steps), 1)
    return {"sequences": round(seqs), "tokens_per_sequence": max(1, round(2 * toks / max(seqs, 1)))}  # prompt ~ response


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/health_overhead.json"))
    ap.add_argument("--set", action="append", default=[], help="config overrides of the demo (key=value)")
    ap.add_argument("--batch-checks", type=Path, default=None, help="only add the batch-phase checks' time to this file")
    args = ap.parse_args()
    if args.batch_checks is not None:
        return add_batch_checks(args.batch_checks)
    from tether.recipes.demo import run_demo

    load0 = open("/proc/loadavg").read().split()[:3]
    t0, c0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_demo(Path(tmp) / "demo", args.set)
        rows = [json.loads(x) for x in (Path(summary["rl_run"]) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    res = {
        "what": "the health layer's share of the demo's RL step time (health.mode advise, self-timed)",
        "command": "python benchmarks/health_overhead.py" + "".join(f" --set {s}" for s in args.set),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **compute_overhead(rows),
        "batch_shape": _batch_shape(rows),
        "demo": {k: summary.get(k) for k in ("baseline_accuracy", "final_accuracy", "rl_steps", "rl_seconds")},
        "wall_seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
        "cores": os.cpu_count(), "loadavg_start": [float(x) for x in load0],
        "loadavg_end": [float(x) for x in open("/proc/loadavg").read().split()[:3]],
        "precision": summary.get("precision"),
    }
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"overhead {res['overhead_frac']:.2%} of the RL step time over {res['steps']} steps; wrote {args.out}")


if __name__ == "__main__":
    main()
