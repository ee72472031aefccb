"""CLI: `tether plan`, `tether fit`, `tether report`, `tether compare` (tether.plan, tether.report)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer

from tether.commands.common import fail



def _check_dirs(paths: List[Path]) -> None:
    for p in paths:
        if not p.is_dir():
            fail(f"{p}: not a directory")


@dataclass(frozen=True)
class PlanRequest:
    """What `tether plan` was asked: the budget in `unit`, the pilot's size (or a saved pilot), the
    update steps the plan protects first, and where to save the pilot."""

    budget: float
    unit: str = "rollouts"
    pilot_problems: int = 64
    pilot_samples: int = 16
    min_steps: int = 100
    pilot_file: Optional[Path] = None
    save_pilot: Optional[Path] = None


def run_plan_command(target: Path, overrides: List[str], req: PlanRequest):
    """Pilot (or a saved one) -> Plan. Returns (plan, pilot)."""
    budget, unit, pilot_problems, pilot_samples = req.budget, req.unit, req.pilot_problems, req.pilot_samples
    min_steps, pilot_file, save_pilot = req.min_steps, req.pilot_file, req.save_pilot
    from tether.plan.pilot import PilotResult, run_pilot
    from tether.plan.planner import PlanConstraints, recommend_allocation

    if pilot_file is not None:
        pilot = PilotResult.load(pilot_file)
    else:
        from tether.policy.hf import load_policy
        from tether.api.evaluate import resolve_target
        from tether.errors import UserError
        from tether.train.setup import configure_process, seed_run, setup_problems
        from tether.rollout import make_rollout

        t = resolve_target(target, overrides)
        if t.kind == "rm":
            raise UserError(f"{target} is a reward-model run: a plan samples a policy; plan the policy run it rewards "
                            "(tether eval gives the reward model's pair accuracy)")
        if t.note:
            from tether.commands.common import note

            note(t.note)
        cfg, model_dir = t.cfg, t.model
        seed_run(cfg.run)
        configure_process(cfg.sandbox, cfg.model)
        policy = load_policy(model_dir, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
        train, _ = setup_problems(cfg.data)
        pilot = run_pilot(policy, train, pilot_problems, pilot_samples, cfg.rollout.sampling, make_rollout(cfg),
                          seed=cfg.run.seed, model=str(model_dir))
    if save_pilot is not None:
        save_pilot.write_text(json.dumps(pilot.to_json(), indent=1))
    tokens = budget if unit == "tokens" else None
    rollouts = int(budget // max(pilot.tokens_per_rollout, 1e-9)) if unit == "tokens" else int(budget)
    plan = recommend_allocation(pilot.counts, rollouts, PlanConstraints(min_steps=min_steps),
                                pilot.tokens_per_rollout, budget_tokens=tokens)
    return plan, pilot


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        target: Path = typer.Argument(..., help="the starting point: a run directory, a checkpoint directory, or a YAML config with model.path"),
        overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides (task, sampling, reward)"),
        budget: float = typer.Option(..., "--budget", help="sampling budget C, in --unit"),
        unit: str = typer.Option("rollouts", "--unit", help="rollouts | tokens (sampled completion tokens)"),
        pilot_problems: int = typer.Option(64, "--pilot-problems", help="training problems in the pilot"),
        pilot_samples: int = typer.Option(16, "--pilot-samples", help="rollouts per pilot problem"),
        min_steps: int = typer.Option(100, "--min-steps", help="update steps the plan protects first (scale with 1/lr)"),
        pilot_file: Optional[Path] = typer.Option(None, "--pilot", help="reuse a saved pilot (JSON) instead of sampling"),
        save_pilot: Optional[Path] = typer.Option(None, "--save-pilot", help="write the pilot's counts to this JSON file"),
        as_json: bool = typer.Option(False, "--json", help="machine-readable plan"),
    ) -> None:
        """Recommend rollouts per problem n, problems per step B_p and steps M for a budget (C = B_p*n*M)."""
        from tether.commands.common import fail_on, known_errors, offline_env

        offline_env()
        if unit not in ("rollouts", "tokens"):
            fail(f"--unit must be rollouts or tokens, got {unit!r}")
        if budget <= 0 or pilot_samples < 2 or pilot_problems < 1 or min_steps < 1:
            fail("--budget > 0, --pilot-samples >= 2, --pilot-problems >= 1 and --min-steps >= 1 are required")
        try:
            req = PlanRequest(budget, unit, pilot_problems, pilot_samples, min_steps, pilot_file, save_pilot)
            p, pilot = run_plan_command(target, overrides or [], req)
        except known_errors() as err:
            fail_on(err)
        except (ValueError, KeyError) as err:
            fail(str(err), 1)
        if as_json:
            typer.echo(json.dumps({**p.to_json(), "pilot": {"model": pilot.model, "problems": len(pilot.counts),
                                                            "tokens_per_rollout": pilot.tokens_per_rollout,
                                                            "rollout": pilot.rollout,
                                                            "pass_rates": pilot.pass_rates}}, indent=2))
        else:
            from tether.plan.planner import format_plan

            solved = sum(c for _, c in pilot.counts) / max(sum(n for n, _ in pilot.counts), 1)
            typer.echo(f"pilot: {len(pilot.counts)} problems x {pilot.counts[0][0] if pilot.counts else 0} "
                       f"{pilot.rollout or 'saved'} rollouts, mean pass rate {solved:.3f}, "
                       f"{pilot.tokens_per_rollout:.1f} sampled tokens per rollout")
            typer.echo(format_plan(p))

    _register_reports(app)


def _register_reports(app: typer.Typer) -> None:
    @app.command()
    def fit(
        run_dirs: List[Path] = typer.Argument(..., help="one or more run directories"),
        metric: str = typer.Option("eval/pass@1", "--metric", help="metrics.jsonl key to fit (eval/pass@1, reward/mean, ...)"),
        unit: str = typer.Option("rollouts", "--compute", help="compute axis: rollouts | tokens | steps | seconds"),
        law: List[str] = typer.Option(["sigmoid", "power"], "--law", help="sigmoid (ScaleRL) and/or power"),
        final_only: bool = typer.Option(False, "--final-only", help="one point per run (its last): fit across budgets"),
        extrapolate: float = typer.Option(10.0, "--extrapolate", help="plot and predict up to this multiple of the largest compute"),
        bootstrap: int = typer.Option(200, "--bootstrap", help="bootstrap refits for the prediction band (0: none)"),
        free_r0: bool = typer.Option(False, "--free-r0", help="fit R0 instead of fixing it to the step-0 value"),
        smooth: int = typer.Option(1, "--smooth", help="moving average over this many points (noisy per-step metrics)"),
        out: Optional[Path] = typer.Option(None, "--out", help="output directory (default: the run, or ./tether-fit for several)"),
        as_json: bool = typer.Option(False, "--json", help="print the fit report as JSON"),
    ) -> None:
        """Fit accuracy/reward vs compute: ScaleRL sigmoid and power law, with uncertainty and extrapolation."""
        from tether.plan.scaling import FitOptions, format_fit_report, run_fit

        _check_dirs(run_dirs)
        if unit not in ("rollouts", "tokens", "steps", "seconds"):
            fail(f"--compute must be rollouts, tokens, steps or seconds, got {unit!r}")
        if extrapolate < 1:
            fail("--extrapolate must be >= 1")
        out_dir = out or (run_dirs[0] if len(run_dirs) == 1 else Path("tether-fit"))
        try:
            opts = FitOptions(metric, unit, tuple(law), final_only, extrapolate, bootstrap, free_r0, smooth)
            rep = run_fit(run_dirs, opts, plot_path=out_dir / "plots" / "scaling_fit.png")
        except (ValueError, FileNotFoundError) as err:
            fail(str(err), 1)
        (out_dir / "scaling_fit.json").write_text(json.dumps(rep, indent=2, default=float))
        typer.echo(json.dumps(rep, indent=2, default=float) if as_json else format_fit_report(rep))
        if not as_json:
            typer.echo(f"wrote {out_dir / 'scaling_fit.json'}")

    @app.command()
    def report(
        run_dir: Path = typer.Argument(..., help="a run directory of any kind (a pipeline: its stages; a sweep: its table)"),
        out: Optional[Path] = typer.Option(None, "--out", help="output file (default: <run>/report.html); a new file, "
                                           "an earlier report or a run directory"),
    ) -> None:
        """One self-contained HTML report: curves, evaluation, health timeline, trajectories, config."""
        from tether.api.report import report as write_any_report
        from tether.commands.common import fail_on, known_errors

        _check_dirs([run_dir])
        try:
            path = write_any_report(run_dir, out)
        except known_errors() as err:
            fail_on(err)
        except ValueError as err:
            fail(str(err), 1)
        typer.echo(f"wrote {path}")

    @app.command()
    def compare(
        run_dirs: List[Path] = typer.Argument(..., help="two or more run directories"),
        out: Optional[Path] = typer.Option(Path("compare.html"), "--out", help="HTML page with overlaid curves"),
        x: str = typer.Option("step", "--x", help="x axis of the curves: step | rollouts"),
        as_json: bool = typer.Option(False, "--json", help="print the table as JSON"),
    ) -> None:
        """A table of headline numbers and overlaid curves for several runs (a pipeline: its last stage)."""
        from tether.api.report import compare as run_compare
        from tether.commands.common import fail_on, known_errors
        from tether.report.compare import format_comparison

        _check_dirs(run_dirs)
        if x not in ("step", "rollouts"):
            fail(f"--x must be step or rollouts, got {x!r}")
        try:
            rows, path = run_compare(run_dirs, out, x)
        except known_errors() as err:
            fail_on(err)
        except ValueError as err:
            fail(str(err), 1)
        typer.echo(json.dumps(rows, indent=2, default=str) if as_json else format_comparison(rows))
        if path is not None and not as_json:
            typer.echo(f"wrote {path}")
