"""`tether.evaluate` / `tether eval`: held-out metrics of a run's result model, whatever the run's kind.

    metrics = tether.evaluate("runs/rev-sft")               # or a Run, a checkpoint dir, a YAML config
    metrics = tether.evaluate(run, ["eval.samples=16"], step=40)

What is evaluated (`resolve_target`):
* a run directory: its result model (tether.runs.result: the final model; a checkpoint only with
  `step`, or when the run did not finish, and then `Target.note` says so); a pipeline's last
  stage; a reward-model run's classifier on its held-out preference pairs (pair accuracy: it is
  not a policy and has nothing to sample);
* a model directory inside a run (`checkpoints/step_N/`, `final_model/`) with that run's config;
* a YAML config whose `model.path` names the model.
A sweep, a context comparison or a fault benchmark has one result per member run: refused with
the member runs named. eval.json (metrics, test-time-scaling curves, per-problem pass rates,
samples) goes to `out`, default the evaluated run's directory; plots/eval_tts.png beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tether.api.run import Run, load_run_config, open_run
from tether.config import TetherConfig, load_config
from tether.errors import UserError
from tether.io.run_dir import sanitize_json
from tether.runs.lifecycle import enclosing_run
from tether.runs.result import is_model_dir


@dataclass(frozen=True)
class Target:
    """What an evaluation (or a plan) runs on: the config, the model, where outputs go, the run's
    kind and the one line to tell the user (None when it is a finished run's final model)."""

    cfg: TetherConfig
    model: Path
    out: Path
    kind: str | None = None
    note: str | None = None


def resolve_target(target: str | Path | Run, overrides: Sequence[str] = (), step: int | None = None) -> Target:
    """The config, model and output directory for a run, a model directory inside a run, or a YAML config."""
    if isinstance(target, Run):
        return _run_target(target, overrides, step)
    target = Path(target)
    if target.is_dir() and is_model_dir(target):  # a checkpoint, final_model/ or any model inside a run
        run = enclosing_run(target.parent)
        if run is None:
            raise UserError(f"{target}: a model directory outside any run (no config.yaml above it); "
                            "pass a YAML config with model.path instead")
        return Target(load_run_config(run, overrides), target, run, open_run(run).kind)
    if target.is_dir():
        return _run_target(open_run(target), overrides, step)
    cfg = load_config(target, list(overrides))
    if not cfg.model.path:
        raise UserError(f"{target}: model.path is not set; evaluate a run directory or set model.path=DIR")
    return Target(cfg, Path(cfg.model.path), Path("."))


def _run_target(run: Run, overrides: Sequence[str], step: int | None) -> Target:
    res = run.result(step)  # NoResult / NoSingleResult: one line naming what works
    owner = res.run or run.path  # a pipeline's last stage
    kind = open_run(owner).kind if owner != run.path else run.kind
    return Target(load_run_config(owner, overrides), res.path, owner, kind, res.note)


def evaluate(target: str | Path | Run, overrides: Sequence[str] = (), step: int | None = None,
             out: str | Path | None = None, plot: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Held-out metrics of `target`'s result (see the module doc); writes eval.json. The note about
    what was evaluated (an interrupted run's last model, a chosen step) goes to `log`."""
    metrics, _ = run_eval_command(target, overrides, out, plot=plot, step=step, log=log)
    return metrics


def run_eval_command(target: str | Path | Run, overrides: Sequence[str], out: str | Path | None = None, plot: bool = True,
                     step: int | None = None, log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], Path]:
    """Evaluate and write eval.json (metrics, curves, what was evaluated); returns (metrics, path)."""
    t = resolve_target(target, overrides, step)
    if t.note and log is not None:
        log(t.note)
    out_dir = Path(out or t.out)
    if t.kind == "rm":
        return _eval_reward_model(t, out_dir)
    return _eval_policy(t, out_dir, plot)


def _eval_policy(t: Target, out_dir: Path, plot: bool) -> tuple[dict[str, Any], Path]:
    from tether.eval.runner import run_eval
    from tether.policy.hf import load_policy
    from tether.rollout import make_rollout
    from tether.rollout.prompt_format import run_format_check
    from tether.train.setup import configure_process, seed_run, setup_problems

    cfg = t.cfg
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    policy = load_policy(t.model, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    _, held_out = setup_problems(cfg.data)
    extra: dict[str, Any] = {}
    rollout = make_rollout(cfg)  # the run's own rollout: single-turn samples or environment episodes
    fmt = run_format_check(cfg, rollout, held_out, "this evaluation", t.model)  # chat vs raw (a warning)
    if getattr(rollout, "checks_prompt_format", False):  # an agent harness: its endpoint checks against this model
        rollout.prompt_format = fmt["model_prompt_format"]
    metrics, rows = run_eval(policy, held_out, cfg.eval, rollout, cfg.reward, seed=cfg.run.seed + 17, curves_out=extra)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    if plot:
        from tether.io.plots import plot_eval_curve

        named = {name + (f" ({extra['best_of']})" if name == "best@k" else ""): curve
                 for name, curve in extra["curves"].items() if name != "mean@k"}
        plots.append(str(plot_eval_curve(named, out_dir / "plots" / "eval_tts.png", title="test-time scaling",
                                          ylabel="fraction of problems solved")))
    payload = {"model": str(t.model), "note": t.note, "task": cfg.data.task, "rollout": rollout.kind, "metrics": metrics,
               "best_of": extra["best_of"], "sampling": cfg.eval.sampling.model_dump(), "samples_per_problem": cfg.eval.samples,
               "curves": {name: {str(k): v for k, v in curve.items()} for name, curve in extra["curves"].items()},
               "pass_rates": extra["pass_rates"], "plots": plots, "samples": rows[:50], **fmt}
    path = out_dir / "eval.json"
    path.write_text(json.dumps(sanitize_json(payload)[0], indent=2))
    return {"model": str(t.model), "task": cfg.data.task, "rollout": rollout.kind, **metrics}, path


def _eval_reward_model(t: Target, out_dir: Path) -> tuple[dict[str, Any], Path]:
    """A reward model is a classifier of (prompt, completion) pairs: its held-out pair accuracy
    (the fraction of pairs it scores chosen above rejected) on the pairs its run held out."""
    from tether.recipes.rm import EVAL_PAIRS
    from tether.rewards.rm import compute_pair_accuracy, load_reward_model, read_pairs

    source = t.out / EVAL_PAIRS
    if not source.is_file():
        if not t.cfg.rm.eval_pairs:
            raise UserError(f"{t.out}: this reward-model run kept no held-out pairs ({EVAL_PAIRS}); "
                            "pass rm.eval_pairs=PAIRS.jsonl to evaluate it")
        source = Path(t.cfg.rm.eval_pairs)
    pairs = read_pairs(source)
    model, tok = load_reward_model(t.model)
    acc = compute_pair_accuracy(model.eval(), tok, pairs, t.cfg.rm.max_length)
    metrics = {"model": str(t.model), "kind": "rm", "rm/eval_pair_accuracy": acc, "rm/eval_pairs": len(pairs)}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval.json"
    path.write_text(json.dumps({**metrics, "pairs_file": str(source), "note": t.note}, indent=2))
    return metrics, path


__all__ = ["Target", "evaluate", "resolve_target", "run_eval_command"]
