"""`tether sweep`: a grid of config overrides x seeds, one run directory each, then mean +- standard
error per arm and the difference of every arm from the first.

    tether sweep configs/reverse.yaml --grid algo.advantage.name=grpo,dr_grpo --seeds 0,1,2
    # or a `sweep:` block in the YAML (grid, seeds, command, metric, workers); flags win over it

Layout of the sweep directory:

    <out>/base.yaml               the config without its `sweep:` block (what every run starts from)
    <out>/sweep_spec.json         grid, seeds, command, metric: a resumed sweep must match it
    <out>/<arm>/seed-<s>/         one ordinary run directory (`tether train` / `tether pipeline`)
    <out>/<arm>/seed-<s>.log      that run's output
    <out>/sweep.json, sweep.md    per-run values, the table; plots/sweep.png
    <out>/prepare/<name>/         a `prepare:` step's run (e.g. the SFT every arm starts from), run
                                  before the arms; arms refer to it as {prepare.<name>} (tether.sweep_prepare)

Statistics (`compute_sweep_table`): an arm's mean and its standard error s / sqrt(n) with the
sample standard deviation (ddof = 1). Arms are compared with the first arm. When both arms ran
the same seeds the comparison is paired (same seed = same initial weights, data order and
sampling stream, so the per-seed differences carry less noise): the mean of the per-seed
differences and their standard error. Otherwise Welch's: the difference of the means with
sqrt(se_a^2 + se_b^2). A difference is called "within noise" when its magnitude is below two
standard errors.

Runs go through the multi-run engine (tether.runs.engine): a run whose outcome is recorded is done
and not run again; an unfinished run resumes from its latest checkpoint (`--resume`) when it has
one, else it is moved aside (`seed-<s>.incomplete-<k>`, never deleted) and starts over. Runs
execute as separate processes (`python -m tether.cli ...`), up to `workers` at a time (each with
`run.threads` = cores / workers unless the overrides set it). The values are read from the runs
again on every resume, so a resumed sweep may change `metric`, `extra_metrics` and `seeds`
(applied, printed and recorded in events.jsonl); any other change is refused with each differing
key, and nothing is rewritten then. `--out` must be a new directory or an earlier sweep.

Deliberate simplification: no Ray backend (runs are processes on this machine).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from tether.io.run_dir import do_append_jsonl, write_text_atomic
from tether.runs.engine import Member, Outcome, Plan, member_rows, run_members
from tether.runs.lifecycle import do_set_members
from tether.runs.record import KINDS, RunRecord, read_record, update_record, write_record
from tether.runs.resume import EVENTS_FILE, compute_config_changes
from tether.sweep_metrics import SUMMARY_KEYS, SweepError, check_logged, check_metric, metric_of  # noqa: F401 (API)
from tether.sweep_prepare import RunHooks, referenced, run_prepare, substitute

COMMANDS = ("train", "pipeline", "sft")


@dataclass(frozen=True)
class Arm:
    """One point of the grid: its overrides (`key=value`) and a directory-safe name."""

    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        return ", ".join(self.overrides) if self.overrides else "base"

    @property
    def slug(self) -> str:
        text = "__".join(self.overrides) if self.overrides else "base"
        return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text)[:150]


@dataclass
class SweepSpec:
    grid: dict[str, list[str]]
    seeds: list[int]
    command: str = "train"
    metric: str = "final_accuracy"
    overrides: list[str] = field(default_factory=list)
    arm_list: list[list[str]] = field(default_factory=list)  # explicit arms (instead of, or before, the grid)
    extra_metrics: list[str] = field(default_factory=list)  # recorded per run and tabled too
    prepare: dict[str, dict] = field(default_factory=dict)  # runs the arms start from (tether.sweep_prepare)
    prepare_overrides: list[str] = field(default_factory=list)  # the command line's overrides, for the prepare steps too

    def arms(self) -> list[Arm]:
        explicit = [Arm(tuple(a)) for a in self.arm_list]
        return explicit + (expand_arms(self.grid) if self.grid or not explicit else [])

    def validate(self) -> None:
        if self.command not in COMMANDS:
            raise SweepError(f"sweep command {self.command!r} is not one of {', '.join(COMMANDS)}")
        if not self.seeds:
            raise SweepError("no seeds: pass --seeds 0,1,2 (or sweep.seeds in the YAML)")
        if len(set(self.seeds)) != len(self.seeds):
            raise SweepError(f"seeds repeat: {self.seeds}")
        for arm in self.arm_list:
            bad = [o for o in arm if "=" not in o]
            if bad:
                raise SweepError(f"arm {arm}: expected key.path=value overrides, got {bad}")
        for key, values in self.grid.items():
            if not values:
                raise SweepError(f"--grid {key}: no values (expected {key}=v1,v2)")
            if key == "run.seed":
                raise SweepError("--grid run.seed: use --seeds for seeds")
        texts = [*self.overrides, *(o for a in self.arms() for o in a.overrides)]
        missing = sorted(referenced(texts) - set(self.prepare))
        if missing:
            raise SweepError(f"{{prepare.{missing[0]}}} is used but sweep.prepare defines no step {missing[0]!r} "
                             f"(defined: {', '.join(self.prepare) or 'none'})")


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """["a.b=1,2", "c=x"] -> {"a.b": ["1", "2"], "c": ["x"]} (order kept; a key given twice is an error)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SweepError(f"--grid {item!r}: expected key.path=v1,v2")
        if key in grid:
            raise SweepError(f"--grid {key} given twice")
        grid[key] = [v.strip() for v in values.split(",") if v.strip()]
        if not grid[key]:
            raise SweepError(f"--grid {item!r}: no values after '='")
    return grid


def parse_seeds(text: str | Sequence[int]) -> list[int]:
    if not isinstance(text, str):
        return [int(s) for s in text]
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SweepError(f"--seeds {text!r}: expected integers like 0,1,2") from None


def expand_arms(grid: Mapping[str, Sequence[str]]) -> list[Arm]:
    """The cartesian product of the grid, in the order given (the first arm is the reference)."""
    keys = list(grid)
    combos = itertools.product(*(grid[k] for k in keys)) if keys else [()]
    return [Arm(tuple(f"{k}={_yaml_value(v)}" for k, v in zip(keys, combo))) for combo in combos]


def _yaml_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


# ----------------------------------------------------------------------------------- statistics

def compute_arm_stats(values: Sequence[float]) -> dict[str, float]:
    """mean, sample standard deviation (ddof=1), standard error sd/sqrt(n), n. One value: se = nan."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": float("nan"), "sd": float("nan"), "se": float("nan")}
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else float("nan")
    return {"n": n, "mean": mean, "sd": sd, "se": sd / math.sqrt(n) if n > 1 else float("nan")}


def compute_difference(ref: Mapping[int, float], other: Mapping[int, float]) -> dict[str, Any]:
    """other - ref, by seed. Paired when both have the same seeds (>= 2), else Welch's."""
    ref = {s: v for s, v in ref.items() if v is not None and math.isfinite(v)}
    other = {s: v for s, v in other.items() if v is not None and math.isfinite(v)}
    if ref and set(ref) == set(other) and len(ref) >= 2:
        d = compute_arm_stats([other[s] - ref[s] for s in sorted(ref)])
        diff, se, kind = d["mean"], d["se"], "paired"
    else:
        a, b = compute_arm_stats(list(ref.values())), compute_arm_stats(list(other.values()))
        diff, se, kind = b["mean"] - a["mean"], math.sqrt(a["se"] ** 2 + b["se"] ** 2), "welch"
    noise = not (math.isfinite(se) and abs(diff) > 2 * se)  # 0 +- 0: no difference, "within noise"
    return {"diff": diff, "se": se, "kind": kind, "within_noise": noise}


def compute_sweep_table(results: Sequence[Mapping[str, Any]], arms: Sequence[Arm], metric: str) -> list[dict[str, Any]]:
    """One row per arm: mean +- se of `metric` over seeds, and the difference from the first arm."""
    by_arm: dict[str, dict[int, float]] = {a.label: {} for a in arms}
    for r in results:
        v = r.get("value")
        if r["arm"] in by_arm and v is not None:
            by_arm[r["arm"]][int(r["seed"])] = float(v)
    rows, ref = [], by_arm[arms[0].label] if arms else {}
    for i, arm in enumerate(arms):
        vals = by_arm[arm.label]
        row = {"arm": arm.label, "metric": metric, **compute_arm_stats(list(vals.values())),
               "values": {str(s): v for s, v in sorted(vals.items())}}
        if i > 0:
            row["vs_first"] = compute_difference(ref, vals)
        rows.append(row)
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The sweep table as Markdown (mean +- se, n, difference from the first arm +- se)."""
    if not rows:
        return "(no arms)"
    first = rows[0]["arm"]
    out = [f"| arm | {rows[0]['metric']} (mean ± s.e.) | n | vs `{first}` (± s.e.) |", "|---|---|---|---|"]
    for r in rows:
        cell = f"{r['mean']:.4f} ± {r['se']:.4f}" if r["n"] else "—"
        d = r.get("vs_first")
        dcell = "(reference)" if d is None else "—" if not math.isfinite(d["diff"]) else (
            f"{d['diff']:+.4f} ± {d['se']:.4f} ({d['kind']}{', within noise' if d['within_noise'] else ''})")
        out.append(f"| `{r['arm']}` | {cell} | {r['n']} | {dcell} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- running

RunFn = Callable[[Sequence[str], Path, Path], int]


def run_cli_subprocess(argv: Sequence[str], run_dir: Path, log_path: Path) -> int:
    """Run `python -m tether.cli ARGV --run-dir RUN_DIR` with its output in `log_path`; the exit code."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run([sys.executable, "-m", "tether.cli", *argv, "--run-dir", str(run_dir)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    return proc.returncode


def load_sweep_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config without `sweep:`, the `sweep:` block or {})."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SweepError(f"{path}: cannot read the config ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: expected a YAML mapping at the top")
    block = raw.pop("sweep", None) or {}
    if not isinstance(block, dict):
        raise SweepError(f"{path}: `sweep:` must be a mapping (grid, seeds, command, metric, workers)")
    valid = {"grid", "arms", "seeds", "command", "metric", "extra_metrics", "workers", "prepare", "overrides"}
    unknown = set(block) - valid
    if unknown:
        raise SweepError(f"{path}: unknown sweep key(s) {sorted(unknown)}; valid: {', '.join(sorted(valid))}")
    return raw, block


SPEC_RESUMABLE = ("metric", "extra_metrics", "seeds")  # a resumed sweep may change these (the runs stay valid)


def _check_out(out: Path) -> None:
    """A sweep writes into a new (or empty) directory or an earlier sweep; never into another run."""
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} is a file; a sweep writes into a new directory or an earlier sweep")
    if not out.is_dir() or (out / "sweep_spec.json").is_file() or not any(out.iterdir()):
        return
    kind = read_record(out).kind
    if kind == "sweep":
        return
    what = f"a {kind} run ({KINDS.get(kind, kind)})" if kind else "files that are not a tether sweep"
    raise SweepError(f"--out {out} holds {what}: a sweep writes into a new directory or an earlier sweep; "
                     "choose another --out")


def _spec_changes(out: Path, have: dict[str, Any], want: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The spec keys a resumed sweep changes (a key an older sweep_spec.json lacks has its default);
    raises SweepError naming each change that the finished runs would not fit."""
    defaults = asdict(SweepSpec(grid={}, seeds=[]))
    changes = {k: (have.get(k, defaults.get(k)), want[k]) for k in want if have.get(k, defaults.get(k)) != want[k]}
    refused = {k: v for k, v in changes.items() if k not in SPEC_RESUMABLE}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise SweepError(f"{out} holds a different sweep (differs in {listed}); its runs do not fit that: use another "
                         f"--out, or the same grid/arms/command/overrides/prepare to resume it "
                         f"(a resume may change only {', '.join(SPEC_RESUMABLE)})")
    return changes


def _prepare_dir(out: Path, base: Mapping[str, Any], spec: SweepSpec, log: Callable[[str], None] = print) -> None:
    """Write base.yaml and sweep_spec.json; on resume check that the sweep asks for the same runs:
    allowed changes (`SPEC_RESUMABLE`) are applied and recorded in events.jsonl, any other is refused
    with each differing key, and nothing is rewritten then."""
    _check_out(out)
    spec_path, want = out / "sweep_spec.json", asdict(spec)
    changes: dict[str, tuple[Any, Any]] = {}
    if spec_path.exists():
        changes = _spec_changes(out, json.loads(spec_path.read_text()), want)
        old = yaml.safe_load((out / "base.yaml").read_text()) if (out / "base.yaml").exists() else None
        if old is not None and old != dict(base):
            diff = compute_config_changes(old, dict(base))
            listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise SweepError(f"{out}/base.yaml differs from the config given ({listed}); its runs do not fit that: "
                             "use another --out to sweep the new config")
    out.mkdir(parents=True, exist_ok=True)
    if changes:
        listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        do_append_jsonl(out / EVENTS_FILE, {"kind": "resume", "resume_changes": {k: list(v) for k, v in changes.items()},
                                            "message": f"resuming the sweep {out}; changes: {listed}"})
        log(f"[tether sweep] resuming with changes: {listed}")
    write_text_atomic(out / "base.yaml", yaml.safe_dump(dict(base), sort_keys=False))
    write_text_atomic(spec_path, json.dumps(want, indent=1))
    if read_record(out).kind != "sweep":
        write_record(out, RunRecord(kind="sweep", status="running"))


def _finished(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json if the run finished (not interrupted; a pipeline's says complete), else None."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("complete") is False or summary.get("interrupted_in") or summary.get("interrupted"):
        return None  # a pipeline writes summary.json after every stage; an interrupted run writes one too
    return summary


def _collect(run_dir: Path, arm: Arm, seed: int, metric: str, extra: Sequence[str] = ()) -> dict[str, Any] | None:
    summary = _finished(run_dir)
    if summary is None:
        return None
    return {"arm": arm.label, "seed": seed, "run_dir": str(run_dir), "value": metric_of(summary, metric, run_dir),
            "extra": {m: metric_of(summary, m, run_dir) for m in extra},
            "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}}


def _threads(spec: SweepSpec, workers: int) -> list[str]:
    """Each run's torch threads: cores / workers, unless the overrides set run.threads."""
    if any(o.startswith("run.threads=") for o in spec.overrides) or workers <= 1:
        return []
    return [f"run.threads={max(1, (os.cpu_count() or 2) // workers)}"]


def run_sweep(spec: SweepSpec, base: Mapping[str, Any], out: Path, workers: int = 1, run_fn: RunFn = run_cli_subprocess,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (arm, seed) not yet done through the multi-run engine (tether.runs.engine: its
    resume rule, progress and member record), then write sweep.json, sweep.md and plots/sweep.png."""
    spec.validate()
    out = Path(out)
    _prepare_dir(out, base, spec, log)
    arms, threads = spec.arms(), _threads(spec, workers)
    prepared = run_prepare(spec.prepare, spec.seeds, out, RunHooks(run_fn, _finished, log, SweepError), workers, threads,
                           spec.prepare_overrides)
    members = [Member(f"{arm.label} seed {seed}", out / arm.slug / f"seed-{seed}", _KIND[spec.command], (arm, seed))
               for arm in arms for seed in spec.seeds]

    def execute(m: Member, resume: bool) -> int:
        arm, seed = m.data
        argv = [spec.command, str(out / "base.yaml"), *substitute([*spec.overrides, *arm.overrides], spec.prepare, out, seed),
                *threads, f"run.seed={seed}", *(["--resume"] if resume else [])]
        code = run_fn(argv, m.path, m.path.with_name(f"seed-{seed}.log"))
        if code != 0:
            raise RuntimeError(f"exit {code}; log {m.path.name}.log")
        return code

    def collect(m: Member, _: Any) -> dict[str, Any] | None:
        return _collect(m.path, m.data[0], m.data[1], spec.metric, spec.extra_metrics)

    def first_check(o: Outcome) -> None:  # a metrics.jsonl key is checked against the first finished run
        if o.status != "ran":
            return
        for metric, what in [(spec.metric, "--metric"), *((m, "--extra-metric") for m in spec.extra_metrics)]:
            if (problem := check_logged(metric, o.member.path, what)) is not None:
                raise SweepError(f"{problem}; the sweep stopped (finished runs are kept): resume it with a corrected "
                                 f"{what} and the same --out")

    plan = Plan(execute, collect, describe=lambda v: f"{spec.metric}={v['value']}", recorded=lambda m: collect(m, None),
                workers=max(1, workers), recollect=True)
    outcomes = run_members(out, "sweep", members, plan, log, on_outcome=first_check)
    do_set_members(out, [{"name": f"prepare {p['name']}" + ("" if p["seed"] is None else f" seed {p['seed']}"),
                          "kind": spec.prepare[p["name"]]["command"], "status": "ran" if p["ran"] else "reused",
                          "path": _relative(out, p["run_dir"])} for p in prepared] + member_rows(out, outcomes))
    results = [o.value for o in outcomes if o.ok]
    failures = [f"{o.member.data[0].label} seed {o.member.data[1]} ({o.message})" for o in outcomes if not o.ok]
    payload = write_sweep_results(out, spec, arms, results, failures, prepared)
    complete = len(results) == len(members)
    update_record(out, status="complete" if complete else "failed" if failures else "running")
    return payload


_KIND = {"train": "rl", "sft": "sft", "pipeline": "pipeline"}


def _relative(out: Path, run_dir: str | Path) -> str:
    """A run directory inside the sweep's `out` as a path relative to it (sweep.json stays valid when
    the sweep directory is moved or copied); one outside it stays as given."""
    try:
        return str(Path(run_dir).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return str(run_dir)


def write_sweep_results(out: Path, spec: SweepSpec, arms: Sequence[Arm], results: Sequence[Mapping[str, Any]],
                        failures: Sequence[str] = (), prepared: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    rows = compute_sweep_table(results, arms, spec.metric)
    extra_tables = {m: compute_sweep_table([{**r, "value": r.get("extra", {}).get(m)} for r in results], arms, m)
                    for m in spec.extra_metrics}
    order = {(a.label, s): i for i, (a, s) in enumerate(itertools.product(arms, spec.seeds))}
    prepared = [{**p, "run_dir": _relative(out, p["run_dir"])} for p in prepared]  # the sweep directory can move
    runs = [{**r, "run_dir": _relative(out, r["run_dir"])} for r in results]
    payload = {"spec": asdict(spec), "table": rows, "extra_tables": extra_tables, "failures": list(failures),
               "prepare": prepared, "runs": sorted(runs, key=lambda r: order.get((r["arm"], int(r["seed"])), 0)),
               "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "sweep.json").write_text(json.dumps(payload, indent=1, default=float))
    prep = [f"prepare `{p['name']}`{'' if p['seed'] is None else ' seed ' + str(p['seed'])}: {p['run_dir']} ("
            + ", ".join(f"{k}={p['summary'][k]:.4g}" for k in ("final_loss", "final_accuracy", "wall_seconds") if isinstance(p["summary"].get(k), (int, float)))
            + ")" for p in prepared]
    (out / "sweep.md").write_text("\n\n".join([format_table(rows), *(format_table(t) for t in extra_tables.values()),
                                              *(["\n".join(f"- {x}" for x in prep)] if prep else [])]) + "\n")
    plot_sweep(rows, out / "plots" / "sweep.png")
    return payload


def plot_sweep(rows: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Mean +- standard error per arm, each seed's value as a dot."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.6))
    for i, r in enumerate(rows):
        se = r["se"] if math.isfinite(r["se"]) else 0.0
        ax.errorbar([i], [r["mean"]], yerr=[se], fmt="o", color="C0", capsize=6, markersize=7)
        vals = list(r["values"].values())
        ax.scatter([i + 0.12] * len(vals), vals, color="C1", s=12, alpha=0.8, zorder=3)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["arm"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(rows[0]["metric"])
    ax.set_title("mean ± standard error (dots: seeds)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["Arm", "SweepSpec", "SweepError", "parse_grid", "parse_seeds", "expand_arms", "compute_arm_stats",
           "compute_difference", "compute_sweep_table", "format_table", "metric_of", "check_metric", "SUMMARY_KEYS",
           "run_sweep", "load_sweep_config",
           "write_sweep_results", "plot_sweep"]
