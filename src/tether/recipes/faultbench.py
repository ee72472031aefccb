"""`tether faultbench`: inject every fault type at two severities into small, fast RL runs and
measure detection, diagnosis and remediation; healthy control runs over several seeds measure
false alarms and the harm of auto mode.

The base run (`BASE`): a 2-layer, 128-wide Llama built locally, SFT warm start on one-digit
arithmetic (+, -, *), then GRPO for `steps` (40) steps with 32 problems x 8 samples per step. The SFT
model is built once per benchmark and shared. Faults start at `start`; steps before it form the
baseline window. Each (fault, severity, seed) runs twice: `advise` (detect + diagnose only) and
`auto` (also repair); each healthy seed likewise.

Outcome of a run: verified accuracy of the final policy on a fixed sample of training problems
(with their true labels; 4 samples each) - what RL optimises - plus held-out pass@1. A run that
auto mode halted is scored with the policy it stopped with.

Scores: tether.recipes.faultbench_score (what is scored; this module runs the cases).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from tether.recipes.faultbench_score import (BASE_VARIANT, case_id, compute_results, format_results,  # noqa: F401
                                             read_health_record, replay_record)

BASE = [
    "model.tiny.hidden_size=128", "model.tiny.num_layers=2", "model.tiny.num_heads=4", "model.tiny.intermediate_size=344",
    "model.tiny.vocab_size=64", "model.tiny.max_position_embeddings=64",
    "data.task=arith", "data.task_kwargs={digits: 1, ops: ['+', '-', '*']}", "data.train_size=150", "data.eval_size=60",
    "rollout.n=8", "rollout.problems_per_step=32", "rollout.sampling.max_new_tokens=6",
    "algo.mini_batches=2", "train.lr=1e-3", "train.max_bad_steps=8",
    "sft.steps=150", "sft.lr=3e-3", "sft.batch_size=32",
    "reward.isolation=inline", "eval.problems=8", "eval.samples=1", "checkpoint.every=0",  # scored after the run
    "logging.tensorboard=false", "logging.progress=false", "logging.samples_per_step=4", "run.threads=1",
]


@dataclass(frozen=True)
class Case:
    fault: str | None  # None: healthy control
    severity: str | None
    seed: int
    mode: str  # advise | auto
    variant: str = ""  # healthy controls repeated under other settings (precision, threads): its name

    @property
    def id(self) -> str:
        return case_id(self.fault, self.severity, self.seed, self.mode, self.variant)


def prepare_base(cache: Path, extra: list[str] | None = None) -> Path:
    """SFT warm start of the base model, cached by its config; returns the model directory."""
    import torch

    from tether.config import load_config
    from tether.recipes.sft import run_sft

    torch.set_num_threads(1)
    key = hashlib.sha1(json.dumps(BASE + (extra or [])).encode()).hexdigest()[:10]
    out = cache / f"base-{key}"
    model = out / "final_model"
    if not (model / "config.json").is_file():
        cfg = load_config(None, BASE + (extra or []) + ["health.mode=off"])
        run_sft(cfg, out, overwrite=True)  # a base model left half-built by an interrupted bench
    return model


def fault_start(cls: Any, start: int) -> int:
    """The step a fault starts at: its class's `start_step`, else the benchmark's."""
    return int(cls.start_step) if getattr(cls, "start_step", None) else start


def _case_overrides(case: Case, model: Path, steps: int, start: int, extra: list[str],
                    variants: dict[str, list[str]] | None = None) -> list[str]:
    ov = BASE + extra + [f"model.path={model}", f"run.seed={case.seed}", f"health.mode={case.mode}", f"train.steps={steps}"]
    if case.fault:
        from tether.health.faults import get_fault_class

        cls = get_fault_class(case.fault)
        ov += list(cls.base)  # the fault's own base-config overrides
        ov.append(f"health.inject=[{{name: {json.dumps(case.fault)}, severity: {case.severity}, "
                  f"start: {fault_start(cls, start)}}}]")
    elif case.variant.startswith(BASE_VARIANT):
        from tether.health.faults import get_fault_class

        ov += list(get_fault_class(case.variant[len(BASE_VARIANT):]).base)
    ov += (variants or {}).get(case.variant, [])
    return ov


def _score(policy: Any, problems: list[dict], cfg: Any, seed: int) -> float:
    """pass@1 from 4 samples of every problem (the runs' own evaluations are kept minimal)."""
    from tether.config import EvalConfig
    from tether.eval.runner import run_eval
    from tether.rollout import make_rollout

    ev = EvalConfig(problems=None, samples=4, sampling=cfg.eval.sampling)
    m, _ = run_eval(policy, problems, ev, make_rollout(cfg), cfg.reward, seed=seed, greedy=False)
    return m["eval/pass@1"]


def run_case(case: Case, model: str, out_dir: str, steps: int, start: int, extra: list[str],
             variants: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """One benchmark run; returns its record (never raises)."""
    import torch

    from tether.config import load_config
    from tether.policy.hf import load_policy
    from tether.recipes.rl import run_rl
    from tether.train.setup import configure_process, setup_problems

    torch.set_num_threads(1)
    logging.getLogger("tether.health").setLevel(logging.CRITICAL)
    t0, c0 = time.perf_counter(), time.process_time()
    rd = Path(out_dir) / case.id
    rec: dict[str, Any] = {"case": asdict(case), "id": case.id}
    try:
        cfg = load_config(None, _case_overrides(case, Path(model), steps, start, extra, variants))
        configure_process(cfg.sandbox, cfg.model)
        train, held = setup_problems(cfg.data)
        policy = load_policy(model)
        try:
            summary = run_rl(cfg, rd, policy=policy, overwrite=True)  # a case an interrupted bench left unfinished
            rec["health"] = summary.get("health", {})
            rec["interrupted"] = summary.get("interrupted")
        except Exception as err:  # TrainingHalted, RewardFailure: the run died; score what is left
            rec["crash"] = f"{type(err).__name__}: {err}"[:300]
        clean = load_config(None, BASE + extra + [f"model.path={model}", "health.mode=off"])  # true labels, clean reward
        rec["final_train_acc"] = _score(policy, train[:128], clean, 1234)
        rec["final_heldout_acc"] = _score(policy, held, clean, 4321)
        rec.update(read_health_record(rd, cfg.health.inject[0].start if case.fault else 1))
    except Exception as err:  # a benchmark bug must not kill the whole benchmark
        rec["error"] = f"{type(err).__name__}: {err}"[:500]
    rec["seconds"] = time.perf_counter() - t0
    rec["cpu_seconds"] = time.process_time() - c0  # wall time depends on what else shares the machine
    return rec


def make_cases(faults: Iterable[str], severities: Iterable[str], seeds: list[int], healthy_seeds: list[int],
               modes: tuple[str, ...] = ("advise", "auto"), variants: Iterable[str] = (),
               auto_remediable_only: bool = False) -> list[Case]:
    """Healthy controls (both modes; each variant in advise mode) and every fault at each of
    `severities` that its class defines (a one-severity fault runs once per seed and mode);
    `auto_remediable_only`: auto mode only for remediable faults (and the healthy controls).
    A remediable fault with a `base` config also gets healthy controls in that config (advise,
    the fault's seeds): the reference its repairs are scored against."""
    from tether.health.faults import get_fault_class

    cases = [Case(None, None, s, m) for s in healthy_seeds for m in modes]
    cases += [Case(None, None, s, "advise", v) for v in variants for s in healthy_seeds]
    if "auto" in modes:
        cases += [Case(None, None, s, "advise", BASE_VARIANT + f) for f in faults
                  if get_fault_class(f).remediable and get_fault_class(f).base for s in seeds]
    cases += [Case(f, sev, s, m) for f in faults for sev in severities if sev in get_fault_class(f).severities
              for s in seeds for m in modes if m == "advise" or not auto_remediable_only or get_fault_class(f).remediable]

    order = {key: i for i, key in enumerate(dict.fromkeys((c.fault, c.severity) for c in cases))}

    def rank(c: Case) -> tuple:  # seed-major: healthy advise, faults (modes together), healthy auto, variants
        pool = seeds if c.fault or c.variant.startswith(BASE_VARIANT) else healthy_seeds
        k = pool.index(c.seed) * max(len(seeds), 1) // max(len(pool), 1) if c.seed in pool else 0
        later = c.fault is None and c.mode != "advise" or bool(c.variant)
        return (k, later, order[(c.fault, c.severity)], c.mode != "advise", c.variant)

    return sorted(cases, key=rank)


@dataclass(frozen=True)
class BenchPlan:
    """Which cases the benchmark runs. `faults`: registered names or user specs
    (`package.module:Class`, `path/file.py:Class`; the module is imported here and in each worker),
    None for all, [] for the healthy controls only; `variants`: name -> config overrides under which
    the healthy controls are repeated (advise); `steps` per run, faults from step `start`."""

    faults: list[str] | None = None
    severities: tuple[str, ...] = ("subtle", "obvious")
    seeds: list[int] | None = None
    healthy_seeds: list[int] | None = None
    steps: int = 40
    start: int = 15
    variants: dict[str, list[str]] | None = None
    modes: tuple[str, ...] = ("advise", "auto")
    auto_remediable_only: bool = False


def run_bench(out: Path, plan: BenchPlan = BenchPlan(), workers: int = 2, extra: list[str] | None = None,
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmark of `plan` into `out` (cases.jsonl, results.json); finished cases are reused."""
    from tether.health.faults import get_fault_class, load_fault_plugins

    faults, severities, seeds, healthy_seeds = plan.faults, plan.severities, plan.seeds, plan.healthy_seeds
    steps, start, variants, modes = plan.steps, plan.start, plan.variants, plan.modes
    auto_remediable_only = plan.auto_remediable_only

    faults = list(sorted(load_fault_plugins()) if faults is None else faults)
    registry = {f: get_fault_class(f) for f in faults}  # raises ValueError naming a bad spec
    variants = dict(variants or {})
    seeds = list(seeds if seeds is not None else [0, 1])
    healthy_seeds = list(healthy_seeds if healthy_seeds is not None else range(10))
    extra = list(extra or [])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = prepare_base(out / "cache", extra)
    progress(f"base model ready ({time.perf_counter() - t0:.0f}s): {model}")
    cases = make_cases(faults, severities, seeds, healthy_seeds, modes, variants, auto_remediable_only)
    records = run_cases(out, cases, (str(model), str(out / "runs"), steps, start, extra, variants), workers, progress)
    results = compute_results(records, registry, start)
    results["config"] = {"steps": steps, "start": start, "seeds": seeds, "healthy_seeds": healthy_seeds,
                         "severities": list(severities), "faults": faults, "base": BASE + extra, "variants": variants,
                         "fault_starts": {f: fault_start(c, start) for f, c in registry.items() if fault_start(c, start) != start},
                         "fault_base": {f: list(c.base) for f, c in registry.items() if c.base},
                         "auto_remediable_only": auto_remediable_only}
    results["wall_seconds"] = time.perf_counter() - t0
    results["cpu_seconds_runs"] = sum(r.get("cpu_seconds", 0.0) for r in records)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def rescore(out: Path, start: int = 15, planned: int | None = None, replay: bool = False) -> dict[str, Any]:
    """Scores from the cases finished so far (`out/cases.jsonl`), e.g. of a benchmark cut short;
    written to `out/results.json` marked partial when fewer than `planned` runs are done.
    `replay`: the advise runs' findings and diagnoses re-computed from their metrics.jsonl by the
    current detectors and diagnosis (tether.health.doctor.replay_events) instead of read from
    their health.jsonl (auto runs keep theirs: their actions changed the run)."""
    from tether.health.faults import get_fault_class

    records = [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines() if x.strip()]
    faults = sorted({r["case"]["fault"] for r in records if r["case"]["fault"]})
    if replay:
        records = [replay_record(r, out / "runs" / r["id"], start) for r in records]
    res = compute_results(records, {f: get_fault_class(f) for f in faults}, start)
    res["partial"] = planned is not None and len(records) < planned
    res["runs_done"], res["runs_planned"] = len(records), planned
    res["cpu_seconds_runs"] = sum(r.get("cpu_seconds", 0.0) for r in records)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    return res


def _run_member(args: tuple, member: Any, resume: bool) -> dict[str, Any]:
    """One case as a member of the multi-run engine (module level: it runs in a forked worker)."""
    return run_case(member.data, *args)


def run_cases(out: Path, cases: list[Case], args: tuple, workers: int, progress: Callable[[str], None]) -> list[dict]:
    """Run the cases not done yet through the multi-run engine (tether.runs.engine: its resume rule,
    progress lines and member record; forked workers); every finished case's record is appended to
    `out/cases.jsonl`, which scoring reads. Returns the records of every case, done before or now; a
    case whose record holds a benchmark error is run again next time."""
    from functools import partial

    from tether.runs.engine import Member, Plan, run_members
    from tether.runs.record import RunRecord, read_record, update_record, write_record

    log_path = out / "cases.jsonl"
    earlier = {}  # cases.jsonl rows of a benchmark run before the engine recorded outcomes (or of this one)
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            r = json.loads(line)
            if "error" not in r:
                earlier[r["id"]] = r
    errors: list[dict] = []

    def collect(m: Any, rec: dict[str, Any]) -> dict[str, Any] | None:
        with open(log_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if "error" in rec:  # a benchmark bug, not a finding: recorded, and run again next time
            errors.append(rec)
            raise RuntimeError(rec["error"])
        return rec

    def describe(rec: dict[str, Any]) -> str:
        return (f"alarm={rec.get('first_alarm_step')} dx={rec.get('diagnosis', [])[:1]} "
                f"acc={rec.get('final_train_acc', float('nan')):.3f}")

    if read_record(out).kind is None:
        write_record(out, RunRecord(kind="faultbench", status="running"))
    members = [Member(c.id, out / "runs" / c.id, "rl", c) for c in cases]
    plan = Plan(partial(_run_member, args), collect, describe, recorded=lambda m: earlier.get(m.name),
                workers=max(1, workers), pool="process" if workers > 1 else "thread", resumable=False)
    outcomes = run_members(out, "faultbench", members, plan, progress)
    update_record(out, status="complete" if all(o.ok for o in outcomes) else "failed")
    return [o.value for o in outcomes if o.ok] + errors


__all__ = ["BASE", "BenchPlan", "Case", "compute_results", "format_results", "make_cases", "prepare_base", "read_health_record", "rescore",
           "run_bench", "run_case"]
