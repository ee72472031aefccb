"""`prepare:` steps of a `tether sweep`: runs that the arms start from (e.g. one SFT model shared by every
arm and seed), run by the sweep itself before its arms, once, and skipped on resume once finished — so
that a comparison that needs a starting model is still one command.

    sweep:
      prepare:
        sft:                          # a name; the arms refer to its run directory as {prepare.sft}
          config: reverse_sft.yaml    # relative to the sweep's config file (or an inline mapping)
          command: sft                # train | pipeline | sft (default sft)
          overrides: [sft.steps=250]  # optional, applied to this step only
          per_seed: false             # true: one run per sweep seed (run.seed=<s>), {prepare.sft} -> its own
      overrides: ["model.path={prepare.sft}/final_model"]    # applied to every arm (or put it in an arm)

Layout: `<out>/prepare/<name>.yaml` (the step's config), `<out>/prepare/<name>/` its run directory
(`<out>/prepare/<name>/seed-<s>/` when per_seed) with the log beside it. A step is done when its
run directory holds a finished summary.json (the same test as an arm's run); an unfinished one is
moved aside and run again. The steps run in order before any arm, the seeds of a per-seed step
`--workers` at a time (with the arms' per-worker `run.threads`). They receive the command line's
overrides (after their own), the ones without a `{prepare.NAME}` placeholder: a model shape or a
data setting given on the command line applies to the model every arm starts from too (and an
override the step's config does not accept is refused before anything runs); the sweep block's
`overrides:` are the arms' alone. Their summaries (scalars) go into sweep.json under `prepare`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

PLACEHOLDER = re.compile(r"\{prepare\.([A-Za-z0-9_-]+)\}")
STEP_KEYS = {"config", "command", "overrides", "per_seed"}


def resolve_prepare(block: Any, config_dir: Path, commands: Sequence[str], error: type[Exception]) -> dict[str, dict]:
    """The sweep block's `prepare:` mapping -> {name: {command, config (a mapping), overrides, per_seed}}.
    A `config:` path is read relative to `config_dir`; its own `sweep:` block, if any, is dropped."""
    if not block:
        return {}
    if not isinstance(block, Mapping):
        raise error("sweep.prepare: expected a mapping of step names to {config, command, overrides, per_seed}")
    steps: dict[str, dict] = {}
    for name, step in block.items():
        where = f"sweep.prepare.{name}"
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
            raise error(f"{where}: a step name may hold letters, digits, '_' and '-' only")
        if not isinstance(step, Mapping) or "config" not in step:
            raise error(f"{where}: expected a mapping with a `config:` (a YAML path or an inline mapping)")
        unknown = set(step) - STEP_KEYS
        if unknown:
            raise error(f"{where}: unknown key(s) {sorted(unknown)}; valid: {', '.join(sorted(STEP_KEYS))}")
        command = str(step.get("command", "sft"))
        if command not in commands:
            raise error(f"{where}.command {command!r} is not one of {', '.join(commands)}")
        config = step["config"]
        if not isinstance(config, Mapping):
            path = (config_dir / str(config)).resolve()
            try:
                config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
                raise error(f"{where}.config: cannot read {path} ({type(err).__name__})") from None
            if not isinstance(config, Mapping):
                raise error(f"{where}.config: {path} is not a YAML mapping")
        config = {k: v for k, v in config.items() if k != "sweep"}
        overrides = step.get("overrides") or []
        if not isinstance(overrides, list) or any("=" not in str(o) for o in overrides):
            raise error(f"{where}.overrides: expected a list of key.path=value")
        steps[str(name)] = {"command": command, "config": config, "overrides": [str(o) for o in overrides],
                            "per_seed": bool(step.get("per_seed", False))}
    return steps


def referenced(texts: Sequence[str]) -> set[str]:
    """The prepare step names that `{prepare.NAME}` placeholders in `texts` refer to."""
    return {m for t in texts for m in PLACEHOLDER.findall(t)}


def step_dir(out: Path, name: str, step: Mapping[str, Any], seed: int) -> Path:
    return out / "prepare" / name / f"seed-{seed}" if step.get("per_seed") else out / "prepare" / name


def substitute(overrides: Sequence[str], prepare: Mapping[str, Mapping], out: Path, seed: int) -> list[str]:
    """Replace `{prepare.NAME}` in every override by that step's run directory (for this seed)."""
    return [PLACEHOLDER.sub(lambda m: str(step_dir(out, m.group(1), prepare[m.group(1)], seed)), o) for o in overrides]


@dataclass(frozen=True)
class RunHooks:
    """How the sweep runs one command (`run(argv, run_dir, log_path) -> exit code`), tells a finished
    run (`finished(run_dir) -> summary or None`), logs, and fails (`error`)."""

    run: Callable
    finished: Callable[[Path], dict | None]
    log: Callable[[str], None]
    error: type[Exception]


def run_prepare(prepare: Mapping[str, Mapping], seeds: Sequence[int], out: Path, hooks: RunHooks, workers: int = 1,
                extra: Sequence[str] = (), cli_overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run every prepare step (each seed of a per-seed one) whose run is not done yet, through the
    multi-run engine (tether.runs.engine: its resume rule and progress lines); one record per run:
    name, seed (None: once), run_dir, ran (False: found done), seconds, summary scalars. The seeds of
    a per-seed step run `workers` at a time, with `extra` overrides (the sweep's per-worker thread
    count) and the command line's overrides after the step's own; the steps run in order (a later one
    may start from an earlier one). A failed step raises `hooks.error`: no arm could start without it."""
    from tether.runs.engine import Member, Plan, run_members

    run_fn, finished, log, error = hooks.run, hooks.finished, hooks.log, hooks.error
    records = []
    for name, step in prepare.items():
        cfg_path = out / "prepare" / f"{name}.yaml"
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(yaml.safe_dump(dict(step["config"]), sort_keys=False))
        seeds_of = list(seeds) if step["per_seed"] else [None]
        members = [Member(name if s is None else f"{name} seed {s}", step_dir(out, name, step, s if s is not None else 0),
                          step["command"], s) for s in seeds_of]

        def execute(m: Member, resume: bool, step: Mapping = step, cfg_path: Path = cfg_path) -> int:
            argv = [step["command"], str(cfg_path), *step["overrides"], *cli_overrides, *extra,
                    *([f"run.seed={m.data}"] if m.data is not None else []), *(["--resume"] if resume else [])]
            code = run_fn(argv, m.path, m.path.with_name(f"{m.path.name}.log"))
            if code != 0:
                raise error(f"prepare step {m.name} failed (exit {code}); see {m.path.with_name(m.path.name + '.log')}")
            return code

        def collect(m: Member, _: Any) -> dict[str, Any] | None:
            summary = finished(m.path)
            return None if summary is None else {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}

        plan = Plan(execute, collect, describe=lambda v: "done", recorded=lambda m: collect(m, None),
                    workers=max(1, min(workers, len(members))), recollect=True, raise_errors=True)
        outcomes = run_members(out / "prepare", "sweep prepare", members, plan, log, record_members=False)
        for o in outcomes:
            if not o.ok:
                raise error(f"prepare step {o.member.name} failed ({o.message})")
            records.append({"name": name, "seed": o.member.data, "run_dir": str(o.member.path), "ran": o.status == "ran",
                            "seconds": o.seconds, "summary": o.value})
    return records


__all__ = ["resolve_prepare", "referenced", "substitute", "run_prepare", "step_dir"]
