"""Paired A/B of two settings on the benchmark's RL step (used by cpu_gemm.py; the decode experiments
of 2026-12-03 pm, docs/performance.md, used it too).

The model and optimizer state is copied before every step and every step starts from the copy with
the same seed, so both settings run the same workload (the same prompts, and the same samples where
the settings round alike). The settings alternate ABBA after one warm-up step each (compilations,
kernel caches), and the medians of `pairs` steps each are compared: B's time over A's.
"""

from __future__ import annotations

import copy
import random
import statistics
from collections.abc import Callable

KEYS = ("step_s", "generate_s", "update_s")


def bench_state(model_dir, precision: str, compiled: bool):
    """(config, RL state) of vs_trl.py's benchmark step for tether at `precision`, both compilations
    on or off."""
    from bench_workers import tether_state
    from vs_trl import base_spec

    flag = str(compiled).lower()
    spec = base_spec("tether", model_dir, precision, 1, 0)
    spec["tether_overrides"] = [f"train.compile={flag}", f"rollout.compile={flag}"]
    return tether_state(spec)


def paired_steps(cfg, st, settings: dict[str, Callable[[], None]], pairs: int, label: str,
                 warm: Callable[[str], None] | None = None) -> dict:
    """`settings`: two names (A first) -> a function that puts the process in that setting.
    `warm(name)`, if given, runs before that setting's warm-up step. Returns every step's times, the
    medians, and B's median time over A's (`b_over_a`)."""
    import torch

    import tether.recipes.rl as rl

    names = tuple(settings)
    if len(names) != 2:
        raise ValueError(f"two settings, A and B; got {names}")

    def step(name: str) -> dict:
        settings[name]()
        s = copy.deepcopy(st)
        torch.manual_seed(0)
        random.seed(0)
        m, _ = rl.run_rl_step(s)
        return {"step_s": m["time/step"], "generate_s": m["time/generate"], "update_s": m["time/update"],
                "positions": m["train/positions"]}

    for name in names:
        if warm is not None:
            warm(name)
        step(name)
    runs: dict = {name: [] for name in names}
    for i in range(2 * pairs):
        name = names[(i + i // 2) % 2]  # ABBA
        runs[name].append(r := step(name))
        print(f"  [{label}] {name:9s} step {r['step_s']:.2f} s (generate {r['generate_s']:.3f}, "
              f"update {r['update_s']:.2f}; {r['positions']:.0f} positions)", flush=True)
    med = {n: {k: statistics.median(r[k] for r in v) for k in KEYS} for n, v in runs.items()}
    ratio = {k: med[names[1]][k] / med[names[0]][k] for k in KEYS}
    print(f"  [{label}] {names[1]} / {names[0]}: step {ratio['step_s']:.3f}, generate {ratio['generate_s']:.3f}, "
          f"update {ratio['update_s']:.3f}", flush=True)
    return {"runs": runs, "median": med, "b_over_a": ratio, "a": names[0], "b": names[1]}
