"""RL recipe: synchronous on-policy RL on one device (GRPO by default; every estimator/loss in
`tether.algos` is selectable from the config).

One step, top to bottom (see `run_rl_step`):
  problems -> rollouts (B_p x n, batched) -> rewards (isolated) -> shaping -> dynamic sampling
  -> compact filtering -> sequences -> advantages -> M epochs of updates -> metrics -> checkpoint

Deliberate simplifications:
- rollout and training share one model in one process, so there is no weight sync: the rollout
  log-probs come from the same weights the trainer starts from (the gap is still measured and
  logged, because numerics differ between KV-cache decoding and a full forward);
- with `algo.epochs == 1` and `algo.mini_batches == 1` pi_old is taken from the training forward
  itself (detached) instead of a separate scoring pass — identical by construction;
- the reference policy (KL) and the critic (GAE) are in-memory copies of the starting weights
  (with `model.lora`, the reference is the same model with its adapters off: no copy);
- dynamic sampling refills the batch by drawing more problems, at most `max_gen_batches` times,
  then trains on what it has (the shortfall is logged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from tether.config import TetherConfig, dump_config
from tether.eval.runner import run_eval
from tether.health import build_health
from tether.io.checkpoint import load_checkpoint, save_checkpoint
from tether.io.killpoints import do_kill_point
from tether.io.plots import plot_metrics
from tether.runs.lifecycle import do_finish_run
from tether.runs.resume import do_apply_lr, do_open_run
from tether.io.run_dir import RunDir
from tether.io.sinks import MultiSink, build_sinks
from tether.phase import marks_phase, phase
from tether.policy.hf import HFPolicy, enable_checkpointing, is_checkpointing
from tether.policy.lora import is_adapter_dir
from tether.policy.reference import reset_reference
from tether.rewards.cap import apply_reward_caps, reward_cap_metrics, stops_run
from tether.rewards.live import set_policy as set_live_policy
from tether.rollout import collect_groups, compute_greedy_baseline, compute_tokenizer_corpus, make_rollout
from tether.rollout.prompt_format import compute_harness_format, run_format_check
from tether.settings import RunSettings
from tether.train.batch import make_train_batch
from tether.train.loop import do_log_settings, graceful_interrupt, progress_bar
from tether.train.setup import (
    attach_lora, configure_process, load_resume_policy, precision_summary, seed_run, setup_policy, setup_problems,
)
from tether.train.state import RLState, build_rl_state
from tether.train.update import UpdateContext, run_update
from tether.types import TrainBatch, TrajectoryGroup


def collect_train_groups(st: RLState, cfg: TetherConfig) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """This step's groups (tether.rollout.collect_groups), played by the run's rollout."""
    return collect_groups(st, make_rollout(cfg), cfg.rollout, cfg.algo.dynamic_sampling)


def build_train_batch(st: RLState, cfg: TetherConfig, groups: list[TrajectoryGroup]) -> tuple[TrainBatch, dict[str, float]]:
    """This step's train batch (tether.train.batch) from the config's sections; ReMax's greedy
    baseline plays the run's own rollout (tether.rollout)."""
    baseline = lambda gs: compute_greedy_baseline(st.policy, make_rollout(cfg), cfg.rollout.sampling, gs)  # noqa: E731
    return make_train_batch(st, groups, cfg.algo, cfg.rollout.sampling, cfg.reward, cfg.train, greedy_baseline=baseline)


@dataclass(frozen=True)
class RLVariant:
    """What a recipe built on `run_rl` swaps in: the rollout side (`collect(st, cfg) -> (groups,
    metrics)`; recipes/rl_async.py: the Ray workers), the credit assignment (`build(st, cfg, groups)
    -> (batch, metrics)`; recipes/distill.py), its kind, and run-settings changes it puts in force
    from the start (`(path, value)`; recipes/rl_async.py: the staleness the health layer allows)."""

    collect: Callable[..., tuple[list[TrajectoryGroup], dict[str, float]]] = collect_train_groups
    build: Callable[..., tuple[TrainBatch, dict[str, float]]] = build_train_batch
    kind: str = "rl"
    settings: tuple[tuple[str, Any], ...] = ()


def run_rl_step(st: RLState, variant: RLVariant = RLVariant()) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """One RL step, under the config in force (`st.settings.config`: the run's config with every
    run-settings change so far, tether.settings)."""
    st.faults.begin_step()  # faultbench's config faults put their settings in force first (tether.health.faults)
    cfg = st.settings.config
    t0 = time.perf_counter()
    with phase("rollout"):  # the phase markers tell the watchdog (tether.health) where a hang is
        groups, metrics = variant.collect(st, cfg)
    rewards = [t.reward.total for g in groups for t in g.trajectories]
    t1 = time.perf_counter()
    with phase("batch"):
        batch, bm = variant.build(st, cfg, groups)
    metrics.update(bm)
    t2 = time.perf_counter()
    with phase("update"):
        um = run_update(UpdateContext.from_run(st, cfg.algo, cfg.train, cfg.rollout.sampling, st.dp), batch)
    positions = um.pop("positions", float("nan"))
    metrics.update(um)
    st.policy.version += 1
    a = cfg.algo
    if st.kl_ctl is not None and "kl_loss" in um:
        st.update.kl_coef = st.kl_ctl.update(um["kl_loss"], 1)
    if st.ref is not None and a.kl.reset_every and (st.step + 1) % a.kl.reset_every == 0:
        reset_reference(st.ref, st.policy)
        st.optimizer.state.clear()  # ProRL §2.2 also re-initialises the optimizer state (Adam moments, step count)
        st.update.moments = None  # a reset on purpose: the next step has nothing to compare its state with
        metrics["kl/reference_reset"] = 1.0
    t3 = time.perf_counter()
    metrics.update({
        "reward/mean": sum(rewards) / max(len(rewards), 1),
        "reward/std": float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
        "kl_coef": st.update.kl_coef, "policy_version": float(st.policy.version),
        "time/rollout_total": t1 - t0, "time/batch": t2 - t1, "time/update": t3 - t2, "time/step": t3 - t0,
        "train/tokens_per_s": float(batch.attention_mask_BT.sum()) * a.epochs / max(t3 - t2, 1e-9),
        "train/positions": positions,
    })
    return metrics, groups


def _sample_rows(groups: list[TrajectoryGroup], limit: int) -> list[dict[str, Any]]:
    rows = []
    for g in groups:
        for t in g.trajectories:
            if len(rows) >= limit:
                return rows
            rows.append({"task_id": g.task_id, "prompt": g.task.get("prompt"), "answer": g.task.get("answer"),
                         "completion": t.info.get("text"), "reward": t.reward.total, "components": dict(t.reward.components),
                         "correct": t.reward.correct, "outcome": t.reward.outcome.value, "stop": t.stop.value,
                         "tokens": t.num_action_tokens})
    return rows


@marks_phase("eval")
def _evaluate(st: RLState, rd: RunDir, held_out, step: int) -> dict[str, float]:
    cfg = st.settings.config  # a dropped reward component or a repair in force applies to the evaluation too
    m, rows = run_eval(st.policy, held_out, cfg.eval, make_rollout(cfg), cfg.reward, seed=cfg.run.seed + 17)
    rd.write_samples(step, rows, kind="eval")
    return m


def _starting_evals(st: RLState, rd: RunDir, held_out, sinks, resumed: bool) -> tuple[dict, dict]:
    """(first, last) evaluation: a new run evaluates the starting policy now (logged at step 0); a
    resumed one reads its evaluations so far from metrics.jsonl (step 0 = the starting policy)."""
    if not resumed:
        first_eval = _evaluate(st, rd, held_out, st.step)
        sinks.log(0, first_eval)
        return first_eval, dict(first_eval)
    evals = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in rd.read_metrics() if "eval/pass@1" in r]
    first_eval = evals[0] if evals else {}
    return first_eval, evals[-1] if len(evals) > 1 else first_eval


def _fit_problems(cfg: TetherConfig, rollout, policy: HFPolicy, train: list, held_out: list) -> tuple[list, list, dict]:
    """(train, held-out, run record): the problems whose prompt fits, and the prompts skipped and the
    prompt format (chat vs raw, warned when it differs from the model's own record) for summary.json."""
    fitted = rollout.fit_problems(train, policy, cfg, "training"), rollout.fit_problems(held_out, policy, cfg, "held-out")
    fmt = run_format_check(cfg, rollout, fitted[0], "this run")
    fmt["prompts_skipped"] = {"training": len(train) - len(fitted[0]), "held_out": len(held_out) - len(fitted[1])}
    return fitted[0], fitted[1], fmt


def _start(cfg: TetherConfig, rd: RunDir, ckpt: Path | None, policy: HFPolicy | None,
           variant: RLVariant) -> tuple[RLState, list, list, dict[str, Any], dict[str, Any]]:
    """The run's state (new, or as the checkpoint left it), its training and held-out problems, the
    checkpoint's extra state and the run record's prompt fields (`_fit_problems`)."""
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)  # before the problems: a code environment checks the sandbox
    train, held_out = setup_problems(cfg.data)
    if policy is None and ckpt is not None and (not cfg.model.path or is_adapter_dir(ckpt)):
        policy = load_resume_policy(cfg.model, ckpt)  # a full HF model + tokenizer, or (LoRA) base + adapter slots
    elif policy is not None and cfg.model.lora is not None:  # handed over in memory (a pipeline stage)
        attach_lora(policy, cfg.model.lora, rd.root / "base_model")
    policy = policy or setup_policy(cfg.model, cfg.run.seed, rd.root, lambda: compute_tokenizer_corpus(cfg.data.task, train))
    rollout = make_rollout(cfg)  # prompts past the context: skipped and counted, or refused (data.on_overlong)
    train, held_out, fmt = _fit_problems(cfg, rollout, policy, train, held_out)
    if cfg.model.gradient_checkpointing and not is_checkpointing(policy.model):  # a resumed or passed-in policy
        enable_checkpointing(policy.model)
    policy.model.train()
    st = build_rl_state(RunSettings(cfg), policy, train)
    set_live_policy(policy.model, policy.tokenizer)  # for rewards that ask the policy itself (judge model=policy)
    extra: dict[str, Any] = {}
    if ckpt is not None:
        st.load_extra_state(extra := load_checkpoint(ckpt, policy.model, st.optimizer, st.scheduler))
    for path, value in variant.settings:  # in force already after a resume (the checkpoint carries them)
        st.settings.set(path, value, source=f"{variant.kind} recipe", step=st.step)
    return st, train, held_out, extra, fmt


@marks_phase("loop")
def run_rl(cfg: TetherConfig, run_dir: str | Path, resume: bool = False, policy: HFPolicy | None = None,
           variant: RLVariant = RLVariant(), overwrite: bool = False) -> dict[str, Any]:
    """Train for `cfg.train.steps` RL steps; returns the summary written to summary.json.
    An existing run directory needs `resume` or `overwrite` (tether.runs.resume)."""
    t_start, c_start = time.perf_counter(), time.process_time()
    start = do_open_run(run_dir, cfg, variant.kind, resume, overwrite)
    rd, ckpt = start.run_dir, start.checkpoint
    st, train, held_out, extra, fmt = _start(cfg, rd, ckpt, policy, variant)
    if ckpt is not None and "train.lr" in start.changes:
        do_apply_lr(st.optimizer, st.scheduler, cfg.train.lr)
    sinks = MultiSink(build_sinks(rd, cfg.logging, cfg, start_step=st.step if ckpt is not None else None))
    st.health = build_health(cfg, rd, st, extra.get("health"))  # detect, diagnose, repair (tether.health); off: no-op
    first_eval, last_eval = _starting_evals(st, rd, held_out, sinks, resumed=ckpt is not None)
    caps = apply_reward_caps(st.settings, st.step)  # a resumed run past a component's max_steps (tether.rewards.cap)
    do_log_settings(rd, st.settings)
    with graceful_interrupt() as stop, progress_bar(cfg.train.steps, "RL", cfg.logging.progress, st.step) as bar:
        while st.step < cfg.train.steps and not stop and not stops_run(caps):
            metrics, groups = run_rl_step(st, variant)
            metrics.update({"rollout/prompt_format_mismatch": 1.0} if "prompt_format_warning" in fmt else {})
            st.step += 1
            caps += (fired := apply_reward_caps(st.settings, st.step))
            metrics.update(reward_cap_metrics(fired))
            if st.step == cfg.train.steps or stops_run(fired) or (cfg.eval.every and st.step % cfg.eval.every == 0):
                last_eval = _evaluate(st, rd, held_out, st.step)
                do_kill_point("eval/done")
                metrics.update(last_eval)
            with phase("health"):
                halted = st.health.observe(st, st.settings.config, metrics, groups)  # adds health/* metrics
            if halted:  # auto mode stopped the run
                stop.requested = True
            do_log_settings(rd, st.settings)  # this step's run-settings changes (faults, caps, repairs)
            do_kill_point("step/computed")  # kill -9 test hooks (tether.io.killpoints)
            sinks.log(st.step, metrics)
            do_kill_point("step/logged")
            if cfg.logging.samples_per_step:
                rd.write_samples(st.step, _sample_rows(groups, cfg.logging.samples_per_step))
            do_kill_point("step/samples")
            bar(st.step, reward=metrics["reward/mean"], acc=metrics.get("accuracy", float("nan")), s=metrics["time/step"])
            if (cfg.checkpoint.every and st.step % cfg.checkpoint.every == 0) or stop:
                save_checkpoint(rd, st.step, st.policy.model, st.policy.tokenizer, st.optimizer, st.scheduler, st.extra_state(), cfg.checkpoint.keep)
    final = save_checkpoint(rd, st.step, st.policy.model, st.policy.tokenizer, st.optimizer, st.scheduler, st.extra_state(),
                            cfg.checkpoint.keep)  # the run's result: the model of its last step
    sinks.close()
    st.health.close()
    rows = rd.read_metrics()
    plot_metrics(rows, rd.plots_dir)
    summary = {
        "kind": variant.kind, "steps": st.step, "interrupted": bool(stop), "wall_seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - c_start,  # this process, all threads (this invocation): load-independent
        # final_* describe the last evaluation after training started (none if interrupted before one)
        "baseline_accuracy": first_eval.get("eval/pass@1"),
        "final_accuracy": last_eval.get("eval/pass@1") if last_eval is not first_eval or st.step == 0 else None,
        "baseline_greedy_accuracy": first_eval.get("eval/greedy_accuracy"),
        "final_greedy_accuracy": last_eval.get("eval/greedy_accuracy") if last_eval is not first_eval or st.step == 0 else None,
        "final_eval": last_eval, "nonfinite_steps": st.update.nonfinite_steps, "health": st.health.summary(),
        "reward_caps": caps,
        **fmt, "prompt_format": fmt.get("prompt_format") or compute_harness_format(rows),  # chat or raw (the run record)
        "precision": precision_summary(cfg.model, st.policy),
        "compile": {"train": st.compile.train, "rollout": st.compile.rollout, "reason": st.compile.reason},
    }
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, final, st.step)
    return summary


__all__ = ["RLState", "RLVariant", "build_train_batch", "collect_train_groups", "dump_config", "run_rl", "run_rl_step"]
