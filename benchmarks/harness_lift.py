"""Held-out success of a black-box agent before and after RL through the agent harness.

    python benchmarks/harness_lift.py                  # the measurement (writes benchmarks/results/harness_lift.json)
    python benchmarks/harness_lift.py --chat           # the openai client's chat API, persistent agents
                                                       # (default --out benchmarks/results/harness_lift_chat.json)
    python benchmarks/harness_lift.py --smoke          # a two-step check that it runs (writes nothing to results/)

`--chat`: the agent is configs/agents/chat_agent.py (the official `openai` client's
`chat.completions`), the task is trained through the chat template (`data.chat=true`: SFT
demonstrations and the agent's requests in the same format; tether.rollout.prompt_format), and the
agents are persistent processes (`harness.persistent=true`, tether.rollout.agent_io). The same
command line: `tether pipeline configs/reverse.yaml data.chat=true harness.persistent=true
harness.command='[python, configs/agents/chat_agent.py]'`.

The task is configs/reverse.yaml (reverse a word) with only `harness.command` added: the same as
`tether pipeline configs/reverse.yaml harness.command='[python, configs/agents/complete_agent.py]'`.
Its cold start is SFT on a weak teacher's demonstrations (40% corrupted, `sft.demo_noise`), as the
config and docs/byo.md describe; SFT does not involve the harness and is timed separately. The RL
stage's rollouts are episodes of configs/agents/complete_agent.py, a separate process per episode
that only speaks the OpenAI completions API over HTTP; tether trains on the tokens its endpoint
sampled (tether.rollout.harness). Held-out success is the RL recipe's own evaluation, before the first
step and after the last, which goes through the same harness (`make_rollout` is a HarnessRollout
when `harness.command` is set): pass@1 over `eval.samples` agent runs per held-out problem, and the
greedy run. The figure compared with the issue's "15 minutes on 2 cores" is the RL stage's wall
time, evaluations included; the total with SFT is reported too.

40 RL steps instead of the config's 80: the harness costs about a process start per episode
(128 per step), and the in-process learning curves of this config (benchmarks/results/vs_trl*.json,
"learning": 3 seeds, training reward per step) climb from about 0.61 to about 0.83 by step 40 and
0.87 by step 80, so half the steps keep most of the lift at half the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(f"[harness-lift {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="RL steps (configs/reverse.yaml: 80; see the docstring)")
    ap.add_argument("--sft-steps", type=int, default=300, help="SFT cold-start steps (configs/reverse.yaml: 300)")
    ap.add_argument("--eval-size", type=int, default=200, help="held-out problems (configs/reverse.yaml: 200)")
    ap.add_argument("--eval-samples", type=int, default=4, help="agent runs per held-out problem for pass@1")
    ap.add_argument("--concurrency", type=int, default=32, help="agent processes at once (harness.concurrency)")
    ap.add_argument("--agent", default=str(ROOT / "configs/agents/complete_agent.py"), help="the agent program")
    ap.add_argument("--run-dir", default="runs/harness-lift")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/harness_lift.json"))
    ap.add_argument("--chat", action="store_true", help="configs/agents/chat_agent.py, data.chat=true, persistent agents; "
                    "--out is then benchmarks/results/harness_lift_chat.json unless given")
    ap.add_argument("--smoke", action="store_true", help="2 SFT + 2 RL steps on 8 held-out problems; --out is "
                    "then runs/harness-lift-smoke.json unless given")
    ap.add_argument("extra", nargs="*", help="further config overrides (key=value)")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv
    if args.chat:
        if "--agent" not in given:
            args.agent = str(ROOT / "configs/agents/chat_agent.py")
        if "--out" not in given:
            args.out = str(ROOT / "benchmarks/results/harness_lift_chat.json")
        args.extra = ["data.chat=true", "harness.persistent=true", *args.extra]
    if args.smoke:
        args.steps, args.sft_steps, args.eval_size, args.eval_samples = 2, 2, 8, 1
        if "--out" not in given:
            args.out = "runs/harness-lift-smoke.json"
    return args


def build_config(args: argparse.Namespace):
    from tether.config import load_config

    overrides = [f"harness.command=[{sys.executable!r}, {args.agent!r}]", f"harness.concurrency={args.concurrency}",
                 f"train.steps={args.steps}", f"sft.steps={args.sft_steps}", f"data.eval_size={args.eval_size}",
                 f"eval.samples={args.eval_samples}", "eval.every=0", "logging.progress=true", "checkpoint.every=0",
                 *args.extra]
    return load_config(ROOT / "configs/reverse.yaml", overrides)


def eval_rows(run_dir: Path) -> list[dict]:
    """The RL run's evaluations (metrics.jsonl rows with eval/pass@1): step 0 and the last step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "eval/pass@1" in r]


def measure(args: argparse.Namespace) -> dict:
    import psutil

    from tether.rollout.harness import HarnessRollout
    from tether.recipes.rl import run_rl
    from tether.recipes.sft import run_sft
    from tether.rollout import make_rollout

    cfg = build_config(args)
    assert isinstance(make_rollout(cfg), HarnessRollout), "the RL rollouts and evaluations must go through the harness"
    rd = Path(args.run_dir)
    load_start = os.getloadavg()
    _log(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} on {os.cpu_count()} cpus")
    _log(f"SFT cold start: {cfg.sft.steps} steps on the weak teacher's demonstrations (no harness)")
    t0, cpu0 = time.perf_counter(), _cpu_seconds(psutil.Process())
    policy, _ = run_sft(cfg, rd / "sft", overwrite=True)
    t_sft = time.perf_counter() - t0
    _log(f"SFT done in {t_sft:.0f}s; RL through the harness: {cfg.train.steps} steps x "
         f"{cfg.rollout.problems_per_step * cfg.rollout.n} agent episodes, held-out evaluation before and after "
         f"({args.eval_size} problems x {cfg.eval.samples} agent runs + a greedy run)")
    t1 = time.perf_counter()
    summary = run_rl(cfg, rd / "rl", policy=policy, overwrite=True)
    t_rl = time.perf_counter() - t1
    cpu = _cpu_seconds(psutil.Process()) - cpu0
    evals = eval_rows(rd / "rl")
    first, last = evals[0], evals[-1]
    before, after = first["eval/pass@1"], last["eval/pass@1"]
    t_eval = sum(r.get("time/eval", 0.0) for r in (first, last))
    _log(f"held-out pass@1 through the harness {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points); "
         f"RL stage {t_rl:.0f}s (of which evaluation {t_eval:.0f}s), total {t_sft + t_rl:.0f}s")
    load_end = os.getloadavg()
    return {
        "command": "python benchmarks/harness_lift.py " + " ".join(sys.argv[1:]),
        "equivalent_cli": ("tether pipeline configs/reverse.yaml " + " ".join(a for a in args.extra if "=" in a) +
                           f" harness.command='[python, configs/agents/{Path(args.agent).name}]'"),
        "agent_mode": "persistent" if cfg.harness.persistent else "process per episode", "data_chat": cfg.data.chat,
        "task": "reverse (configs/reverse.yaml), SFT cold start on a 40%-corrupted teacher", "agent": args.agent,
        "evaluated_through": "the agent harness (HarnessRollout): the RL recipe's evaluation at step 0 and at the end",
        "held_out_problems": int(first.get("eval/problems", args.eval_size)), "agent_runs_per_problem": cfg.eval.samples,
        "held_out_success_before": before, "held_out_success_after": after, "lift_points": 100 * (after - before),
        "greedy_before": first.get("eval/greedy_accuracy"), "greedy_after": last.get("eval/greedy_accuracy"),
        "rl_steps": summary["steps"], "episodes_per_step": cfg.rollout.problems_per_step * cfg.rollout.n,
        "rl_wall_seconds": t_rl, "rl_eval_seconds": t_eval, "sft_wall_seconds": t_sft, "total_wall_seconds": t_sft + t_rl,
        "cpu_seconds_with_agents": cpu,  # tether's process and every agent process it started (psutil)
        "meets_issue_17": bool(100 * (after - before) >= 10 and t_rl <= 900),
        "cpus": os.cpu_count(), "cpu": _cpu_name(), "load_average_at_start": load_start, "load_average_at_end": load_end,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
        "note": "wall times on a machine shared with other jobs are upper bounds; the load averages say how busy it was",
    }


def _cpu_split(proc) -> tuple[float, float]:
    """(user + system seconds of `proc`, of its children: alive ones and those it waited for)."""
    t = proc.cpu_times()
    kids = t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            kids += c.user + c.system
        except Exception:  # psutil.Error: a child that ended meanwhile
            pass
    return t.user + t.system, kids


def _cpu_seconds(proc) -> float:
    return sum(_cpu_split(proc))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _write_result(path: str | Path, result: dict) -> Path:
    """The result file (its folder made), indented JSON with a final newline."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = measure(args)
    out = _write_result(args.out, result)
    _log(f"wrote {out}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
