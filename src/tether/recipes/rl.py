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
import warnings
from pathlib import Path
from typing import Any

import torch

from tether import hardware
from tether.algos import ADVANTAGES, AdaptiveKLController, AdvantageInputs, compute_advantages, compute_kl_in_reward
from tether.batching import build_records, pad_records
from tether.config import TetherConfig, dump_config
from tether.data import ProblemStream
from tether.envs.credit import compute_step_fields
from tether.eval.runner import run_eval
from tether.groups import apply_reward_shaping, compute_compact_weights
from tether.health import build_faults, build_health, compute_advantage_alignment
from tether.io.checkpoint import load_checkpoint, save_checkpoint
from tether.io.killpoints import do_kill_point
from tether.io.plots import plot_metrics
from tether.io.resume import do_apply_lr, do_open_run
from tether.io.run_dir import RunDir
from tether.io.sinks import MultiSink, build_sinks
from tether.optim import build_optimizer, build_scheduler
from tether.phase import marks_phase, phase
from tether.policy import decode, lean_train
from tether.policy.hf import HFPolicy, ValueModel, enable_checkpointing, is_checkpointing
from tether.policy.lora import is_adapter_dir
from tether.recipes.common import (
    attach_lora, graceful_interrupt, load_resume_policy, make_reference, precision_summary, progress_bar, reset_reference,
    seed_run, setup_policy, setup_problems,
)
from tether.rewards.cap import apply_reward_caps, reward_cap_metrics, stops_run
from tether.rewards.live import set_policy as set_live_policy
from tether.rollout import collect_groups, compute_greedy_baseline, make_rollout
from tether.types import TrainBatch, TrajectoryGroup
from tether.update import UpdateContext, UpdateState, compute_batch_logprobs, run_update


def choose_compile_for(cfg: TetherConfig, policy: HFPolicy) -> hardware.CompileChoice:
    """`train.compile` / `rollout.compile` for this run (tether.hardware.choose_compile), printed."""
    r = cfg.rollout
    choice = hardware.choose_compile(
        cfg.train.compile, r.compile, autocast_bf16=policy.autocast_bf16, device=str(policy.device),
        params=sum(p.numel() for p in policy.model.parameters()),
        tokens_per_step=r.n * r.problems_per_step * r.sampling.max_new_tokens, steps=cfg.train.steps,
        supported=(lean_train.supports(policy.model, policy.device), decode.supports(policy.model)))
    print(f"[tether] compile: training forward {'on' if choice.train else 'off'}, decode step "
          f"{'on' if choice.rollout else 'off'} ({choice.reason})", flush=True)
    return choice


class RLState:
    """Everything the loop mutates; checkpointed as a whole."""

    def __init__(self, cfg: TetherConfig, policy: HFPolicy, train_problems: list[dict[str, Any]]) -> None:
        a, t = cfg.algo, cfg.train
        self.policy = policy
        self.compile = choose_compile_for(cfg, policy)
        if self.compile.train:  # tether.policy.lean_train, compiled (Llama-family models on a CPU)
            policy.lean_train = "compile"
            if not lean_train.supports(policy.model, policy.device):
                warnings.warn("train.compile=true: only Llama-family models on a CPU have the compiled training "
                              "forward (tether.policy.lean_train); this run trains through transformers' forward",
                              stacklevel=2)
        if self.compile.rollout:  # tether.policy.decode's step, compiled
            policy.compile_decode = True
            if not decode.supports(policy.model):
                warnings.warn("rollout.compile=true: only Llama-family models have the compiled decode step "
                              "(tether.policy.decode); this run samples through transformers' forward", stacklevel=2)
        self.stream = ProblemStream(train_problems, cfg.run.seed)
        self.generator = torch.Generator().manual_seed(cfg.run.seed)
        params = list(policy.model.parameters())
        facts = ADVANTAGES.facts(a.advantage.name)
        self.critic = ValueModel(policy.model).to(policy.device) if facts.needs_critic else None
        self.optimizer = build_optimizer(params, t.lr, t.weight_decay, t.betas)
        if self.critic is not None:
            self.optimizer.add_param_group({"params": list(self.critic.parameters()), "lr": a.value.lr})
        total = max(1, t.steps * a.epochs * a.mini_batches)
        self.scheduler = build_scheduler(self.optimizer, total, t.warmup_steps, t.schedule)
        self.ref = make_reference(policy) if a.kl.coef > 0 and a.kl.reference == "initial" else None
        self.kl_ctl = AdaptiveKLController(a.kl.coef, a.kl.adaptive_target, a.kl.adaptive_horizon) if a.kl.adaptive_target else None
        self.update = UpdateState(kl_coef=a.kl.coef)
        self.step = 0
        self.faults = build_faults(cfg.health.inject, self, cfg, cfg.run.seed)  # faultbench seams; else identity
        self.dp = None  # data-parallel trainer group (tether.dist.trainer); None: this process alone

    def extra_state(self) -> dict[str, Any]:
        return {
            "step": self.step, "data": self.stream.state_dict(), "generator": self.generator.get_state(),
            "update": vars(self.update).copy(), "kl_ctl": self.kl_ctl.state_dict() if self.kl_ctl else None,
            "policy_version": self.policy.version,
            "ref": None if self.ref is None or self.ref.base_only else {k: v.clone() for k, v in self.ref.model.state_dict().items()},
            "critic": None if self.critic is None else self.critic.state_dict(),
            "health": self.health.state_dict() if hasattr(self, "health") else None,
        }

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        self.step = int(extra["step"])
        self.stream.load_state_dict(extra["data"])
        self.generator.set_state(extra["generator"])
        self.update = UpdateState(**extra["update"])
        self.policy.version = int(extra["policy_version"])
        if self.kl_ctl and extra.get("kl_ctl"):
            self.kl_ctl.load_state_dict(extra["kl_ctl"])
        if self.ref is not None and extra.get("ref") is not None:
            self.ref.model.load_state_dict(extra["ref"])
        self.pending_ref = extra.get("ref") if self.ref is None else None  # a KL anchor a health repair added
        if self.critic is not None and extra.get("critic") is not None:
            self.critic.load_state_dict(extra["critic"])


def make_train_batch(st: RLState, cfg: TetherConfig, groups: list[TrajectoryGroup]) -> tuple[TrainBatch, dict[str, float]]:
    """Groups -> padded sequences -> advantages (and KL-in-reward, critic values, ReMax baseline)."""
    a, metrics = cfg.algo, {}
    groups = apply_reward_shaping(groups, a, cfg.rollout.sampling.max_new_tokens)
    groups, weights, cm = compute_compact_weights(groups, a.compact_filter)
    metrics.update(cm)
    records = build_records(groups, weights, mask_invalid=cfg.reward.on_error == "mask")
    p = pad_records(records, st.policy.pad_id)
    temp = cfg.rollout.sampling.temperature
    token_rewards, values, baseline = p.token_rewards_BT, None, None
    if st.ref is not None and a.kl.placement == "reward" and st.update.kl_coef > 0:
        stub = TrainBatch(p.input_ids_BT, p.attention_mask_BT, p.loss_mask_BT, p.rollout_logp_BT,
                          torch.zeros_like(p.rollout_logp_BT), p.group_B, p.traj_B, kept_BT=p.kept_BT)
        ref_logp = compute_batch_logprobs(st.ref, stub, temp, cfg.train.micro_batch_tokens)
        token_rewards, kl_BT = compute_kl_in_reward(token_rewards, p.rollout_logp_BT, ref_logp, p.loss_mask_BT,
                                                    st.update.kl_coef, a.kl.estimator, a.kl.clamp)
        metrics["kl_reward"] = float(kl_BT.sum() / p.loss_mask_BT.sum().clamp(min=1))
    if st.critic is not None:
        with torch.no_grad():
            values = st.critic(p.input_ids_BT.to(st.policy.device), p.attention_mask_BT.to(st.policy.device)).float().cpu()
    if ADVANTAGES.facts(a.advantage.name).needs_greedy_baseline:
        baseline = compute_greedy_baseline(st.policy, cfg, groups)[p.group_B]
    adv = compute_advantages(AdvantageInputs(
        scores_B=p.scores_B, token_rewards_BT=token_rewards, mask_BT=p.loss_mask_BT, group_B=p.group_B,
        traj_B=p.traj_B, valid_B=p.valid_B, values_BT=values, baseline_B=baseline, **compute_step_fields(groups, p)),
        a.advantage)
    adv = st.faults.on_advantages(adv, p.group_B)  # seam: credit assignment
    batch = TrainBatch(p.input_ids_BT, p.attention_mask_BT, p.loss_mask_BT, p.rollout_logp_BT, adv.advantages_BT,
                       p.group_B, p.traj_B, adv.returns_BT, values, kept_BT=p.kept_BT)  # kept: the sampling mask
    batch = st.faults.on_batch(batch)  # seam: the loss's inputs (loss mask, advantages, rollout log-probs)
    mask = p.loss_mask_BT > 0
    metrics["advantage/mean"] = float(adv.advantages_BT[mask].mean()) if mask.any() else 0.0
    metrics["advantage/abs_mean"] = float(adv.advantages_BT[mask].abs().mean()) if mask.any() else 0.0
    metrics.update(compute_advantage_alignment(adv.advantages_BT, p.scores_B, p.loss_mask_BT, p.group_B))
    metrics["batch/sequences"], metrics["batch/loss_tokens"] = float(batch.num_seqs), float(batch.num_loss_tokens)
    metrics["reward/masked_invalid"] = float((~p.valid_B).sum())
    return batch, metrics


def run_rl_step(st: RLState, cfg: TetherConfig, collect=collect_groups,
                build=make_train_batch) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """One RL step; `collect(st, cfg) -> (groups, metrics)` is the rollout side (tether.rollout.collect_groups;
    recipes/rl_async.py swaps in the Ray workers), `build(st, cfg, groups) -> (batch, metrics)` the credit
    assignment (recipes/distill.py swaps it)."""
    t0 = time.perf_counter()
    with phase("rollout"):  # the phase markers tell the watchdog (tether.health) where a hang is
        groups, metrics = collect(st, cfg)
    rewards = [t.reward.total for g in groups for t in g.trajectories]
    t1 = time.perf_counter()
    with phase("batch"):
        batch, bm = build(st, cfg, groups)
    metrics.update(bm)
    t2 = time.perf_counter()
    with phase("update"):
        um = run_update(UpdateContext.from_run(st, cfg, st.dp), batch)
    positions = um.pop("positions", float("nan"))
    metrics.update(um)
    st.policy.version += 1
    a = cfg.algo
    if st.kl_ctl is not None and "kl_loss" in um:
        st.update.kl_coef = st.kl_ctl.update(um["kl_loss"], 1)
    if st.ref is not None and a.kl.reset_every and (st.step + 1) % a.kl.reset_every == 0:
        reset_reference(st.ref, st.policy)
        st.optimizer.state.clear()  # ProRL §2.2 also re-initialises the optimizer state (Adam moments, step count)
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
def _evaluate(st: RLState, cfg: TetherConfig, rd: RunDir, held_out, step: int) -> dict[str, float]:
    m, rows = run_eval(st.policy, held_out, cfg.eval, make_rollout(cfg), cfg.reward, seed=cfg.run.seed + 17)
    rd.write_samples(step, rows, kind="eval")
    return m


def _starting_evals(st, cfg: TetherConfig, rd, held_out, sinks, resumed: bool) -> tuple[dict, dict]:
    """(first, last) evaluation: a new run evaluates the starting policy now (logged at step 0); a
    resumed one reads its evaluations so far from metrics.jsonl (step 0 = the starting policy)."""
    if not resumed:
        first_eval = _evaluate(st, cfg, rd, held_out, st.step)
        sinks.log(0, first_eval)
        return first_eval, dict(first_eval)
    evals = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in rd.read_metrics() if "eval/pass@1" in r]
    first_eval = evals[0] if evals else {}
    return first_eval, evals[-1] if len(evals) > 1 else first_eval


@marks_phase("loop")
def run_rl(cfg: TetherConfig, run_dir: str | Path, resume: bool = False, policy: HFPolicy | None = None,
           collect=collect_groups, build=make_train_batch, kind: str = "rl", overwrite: bool = False) -> dict[str, Any]:
    """Train for `cfg.train.steps` RL steps; returns the summary written to summary.json.
    An existing run directory needs `resume` or `overwrite` (tether.io.resume)."""
    t_start, c_start = time.perf_counter(), time.process_time()
    start = do_open_run(run_dir, cfg, kind, resume, overwrite)
    rd, ckpt = start.run_dir, start.checkpoint
    seed_run(cfg.run)
    train, held_out = setup_problems(cfg)
    if policy is None and ckpt is not None and (not cfg.model.path or is_adapter_dir(ckpt)):
        policy = load_resume_policy(cfg, ckpt)  # a full HF model + tokenizer, or (LoRA) base + adapter slots
    elif policy is not None and cfg.model.lora is not None:  # handed over in memory (a pipeline stage)
        attach_lora(policy, cfg, rd.root / "base_model")
    policy = policy or setup_policy(cfg, rd.root, train)
    rollout = make_rollout(cfg)  # prompts past the context: skipped and counted, or refused (data.on_overlong)
    train = rollout.fit_problems(train, policy, cfg, "training")
    held_out = rollout.fit_problems(held_out, policy, cfg, "held-out")
    if cfg.model.gradient_checkpointing and not is_checkpointing(policy.model):  # a resumed or passed-in policy
        enable_checkpointing(policy.model)
    policy.model.train()
    st = RLState(cfg, policy, train)
    set_live_policy(policy.model, policy.tokenizer)  # for rewards that ask the policy itself (judge model=policy)
    extra: dict[str, Any] = {}
    if ckpt is not None:
        st.load_extra_state(extra := load_checkpoint(ckpt, policy.model, st.optimizer, st.scheduler))
        if "train.lr" in start.changes:
            do_apply_lr(st.optimizer, st.scheduler, cfg.train.lr)
    sinks = MultiSink(build_sinks(rd, cfg.logging, cfg, start_step=st.step if ckpt is not None else None))
    st.health = build_health(cfg, rd, st, extra.get("health"))  # detect, diagnose, repair (tether.health); off: no-op
    first_eval, last_eval = _starting_evals(st, cfg, rd, held_out, sinks, resumed=ckpt is not None)
    caps = apply_reward_caps(cfg, st.step)  # a resumed run past a component's max_steps (tether.rewards.cap)
    with graceful_interrupt() as stop, progress_bar(cfg.train.steps, "RL", cfg.logging.progress, st.step) as bar:
        while st.step < cfg.train.steps and not stop and not stops_run(caps):
            metrics, groups = run_rl_step(st, cfg, collect, build)
            st.step += 1
            caps += (fired := apply_reward_caps(cfg, st.step))
            metrics.update(reward_cap_metrics(fired))
            if st.step == cfg.train.steps or stops_run(fired) or (cfg.eval.every and st.step % cfg.eval.every == 0):
                last_eval = _evaluate(st, cfg, rd, held_out, st.step)
                do_kill_point("eval/done")
                metrics.update(last_eval)
            with phase("health"):
                halted = st.health.observe(st, cfg, metrics, groups)  # adds health/* metrics
            if halted:  # auto mode stopped the run
                stop.requested = True
            do_kill_point("step/computed")  # kill -9 test hooks (tether.io.killpoints)
            sinks.log(st.step, metrics)
            do_kill_point("step/logged")
            if cfg.logging.samples_per_step:
                rd.write_samples(st.step, _sample_rows(groups, cfg.logging.samples_per_step))
            do_kill_point("step/samples")
            bar(st.step, reward=metrics["reward/mean"], acc=metrics.get("accuracy", float("nan")), s=metrics["time/step"])
            if (cfg.checkpoint.every and st.step % cfg.checkpoint.every == 0) or stop:
                save_checkpoint(rd, st.step, policy.model, policy.tokenizer, st.optimizer, st.scheduler, st.extra_state(), cfg.checkpoint.keep)
    save_checkpoint(rd, st.step, policy.model, policy.tokenizer, st.optimizer, st.scheduler, st.extra_state(), cfg.checkpoint.keep)
    sinks.close()
    st.health.close()
    rows = rd.read_metrics()
    plot_metrics(rows, rd.plots_dir)
    summary = {
        "kind": kind, "steps": st.step, "interrupted": bool(stop), "wall_seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - c_start,  # this process, all threads (this invocation): load-independent
        # final_* describe the last evaluation after training started (none if interrupted before one)
        "baseline_accuracy": first_eval.get("eval/pass@1"),
        "final_accuracy": last_eval.get("eval/pass@1") if last_eval is not first_eval or st.step == 0 else None,
        "baseline_greedy_accuracy": first_eval.get("eval/greedy_accuracy"),
        "final_greedy_accuracy": last_eval.get("eval/greedy_accuracy") if last_eval is not first_eval or st.step == 0 else None,
        "final_eval": last_eval, "nonfinite_steps": st.update.nonfinite_steps, "health": st.health.summary(),
        "reward_caps": caps,
        "precision": precision_summary(cfg, policy),
        "compile": {"train": st.compile.train, "rollout": st.compile.rollout, "reason": st.compile.reason},
    }
    rd.write_summary(summary)
    return summary


__all__ = ["run_rl", "run_rl_step", "RLState", "dump_config"]
