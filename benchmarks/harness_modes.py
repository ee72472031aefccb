"""Episodes per second of the agent harness: one process per episode against persistent agents,
side by side in one run, on the same task, model and agent program.

    python benchmarks/harness_modes.py          # the measurement (default --out benchmarks/results/harness_modes.json)
    python benchmarks/harness_modes.py --smoke  # a quick check (writes runs/harness-modes-smoke.json)

The agent is configs/agents/chat_agent.py, which talks to the endpoint with the official `openai`
client's chat API: a process per episode pays the interpreter's start and the client's import
every episode; a persistent process (`harness.persistent=true`) pays them once and then serves
episodes from stdin (tether.rollout.agent_io). The task is configs/reverse.yaml's problems with
its tiny model (untrained: the rate of episodes, not their success, is measured), one
`HarnessRollout.run` call of `problems x n` episodes per round as in an RL step
(`harness.concurrency` agents at once), the two modes alternating for `--rounds` rounds so that
the machine's load falls on both alike. The persistent mode's first round includes starting its
processes. Reported per mode: episodes, wall seconds and episodes per second (the harness's own
clock), and the CPU seconds of tether's process and of the agent processes (psutil, every
child of this process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from harness_lift import _commit, _cpu_name, _cpu_split, _write_result  # noqa: E402


def _cpu_seconds() -> tuple[float, float]:
    """(this process, its children alive or waited): user + system seconds."""
    import psutil

    return _cpu_split(psutil.Process())


def measure(args: argparse.Namespace) -> dict:
    from tether.config import load_config
    from tether.rollout.agent_io import AgentPool
    from tether.rollout.harness import HarnessRollout
    from tether.rollout import compute_tokenizer_corpus
    from tether.train.setup import configure_process, seed_run, setup_policy, setup_problems

    cfg = load_config(ROOT / "configs/reverse.yaml", [f"data.train_size={args.problems * 4}", "data.eval_size=8"])
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    train, _ = setup_problems(cfg.data)
    policy = setup_policy(cfg.model, cfg.run.seed, Path(args.run_dir), lambda: compute_tokenizer_corpus(cfg.data.task, train))
    problems = train[: args.problems]
    agent = [sys.executable, str(ROOT / "configs/agents/chat_agent.py")]
    modes = {name: HarnessRollout(agent, cfg.reward, timeout_s=120, concurrency=args.concurrency, persistent=persistent,
                                  progress_s=0) for name, persistent in (("process_per_episode", False),
                                                                          ("persistent", True))}
    out = {name: {"episodes": 0, "wall_seconds": 0.0, "cpu_seconds_tether": 0.0, "cpu_seconds_agents": 0.0,
                  "failed": 0, "rounds": []} for name in modes}
    for r in range(args.rounds):
        for name, rollout in modes.items():
            c0 = _cpu_seconds()
            t0 = time.perf_counter()
            groups, m = rollout.run(policy, problems, args.n, cfg.rollout.sampling)
            wall = time.perf_counter() - t0
            c1 = _cpu_seconds()
            eps = sum(len(g.trajectories) for g in groups)
            row = out[name]
            row["episodes"] += eps
            row["wall_seconds"] += wall
            row["cpu_seconds_tether"] += c1[0] - c0[0]
            row["cpu_seconds_agents"] += c1[1] - c0[1]
            row["failed"] += round(m["harness/error_rate"] * eps)
            row["rounds"].append({"episodes": eps, "wall_seconds": wall, "episodes_per_s": eps / wall,
                                  "load_average": os.getloadavg()[0]})
            print(f"[harness-modes] round {r + 1} {name}: {eps} episodes in {wall:.1f}s ({eps / wall:.2f}/s)", flush=True)
    AgentPool.close_all()
    for row in out.values():
        row["episodes_per_s"] = row["episodes"] / row["wall_seconds"]
    ratio = out["persistent"]["episodes_per_s"] / out["process_per_episode"]["episodes_per_s"]
    return {"command": "python benchmarks/harness_modes.py " + " ".join(sys.argv[1:]),
            "agent": "configs/agents/chat_agent.py (the openai client's chat.completions)",
            "task": "configs/reverse.yaml problems, its tiny model (untrained)", "problems_per_round": len(problems),
            "samples_per_problem": args.n, "concurrency": args.concurrency, "rounds": args.rounds, "modes": out,
            "persistent_over_process_per_episode": ratio, "meets_3x": ratio >= 3.0}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16, help="problems per round (configs/reverse.yaml: 16 per step)")
    ap.add_argument("--n", type=int, default=8, help="episodes per problem (configs/reverse.yaml: rollout.n=8)")
    ap.add_argument("--concurrency", type=int, default=8, help="harness.concurrency (the config default)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run-dir", default="runs/harness-modes")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/harness_modes.json"))
    ap.add_argument("--smoke", action="store_true", help="2 problems x 2 episodes, 1 round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.problems, args.n, args.rounds = 2, 2, 1
        if "--out" not in (argv if argv is not None else sys.argv):
            args.out = "runs/harness-modes-smoke.json"
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    load_start, c0, t0 = os.getloadavg(), time.process_time(), time.perf_counter()
    result = measure(args)
    result.update({"total_wall_seconds": time.perf_counter() - t0, "cpus": os.cpu_count(), "cpu": _cpu_name(),
                   "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
                   "note": "the machine is shared: the two modes alternate round by round so that load falls on both; "
                           "wall times are upper bounds, the load averages say how busy it was"})
    _write_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}, indent=2))


if __name__ == "__main__":
    main()
