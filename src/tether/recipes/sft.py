"""SFT recipe: supervised cold start on demonstrations (DeepSeek-R1's stage 1).

Deliberate simplifications:
- demonstrations come from the task's scripted expert (or a JSONL "completion" field); there is
  no packing — sequences are short and micro-batches are sized by a token budget instead; the
  batch's common prefix (system prompt, tool schemas) runs once when that saves positions
  (`train.share_prefix`, tether.policy.prefix: the same log-probs);
- the loss is the token-mean negative log-likelihood of completion tokens (prompt tokens and
  padding are masked by lengths), normalised by `agg_loss` like every other loss in tether;
- the final model is saved as a Hugging Face directory (`final_model/`) that `model.path=` loads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tether.algos import agg_loss, compute_agg_norm
from tether.train.batching import SeqRecord, pad_records, split_by_token_budget
from tether.config import TetherConfig
from tether.data import ProblemStream
from tether.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tether.runs.lifecycle import do_finish_run
from tether.runs.resume import do_apply_lr, do_open_run
from tether.io.sinks import MultiSink, build_sinks
from tether.optim import build_optimizer, build_scheduler, compute_all_finite
from tether.policy.hf import HFPolicy
from tether.policy.prefix import compute_sequence_logprobs
from tether.policy.lora import is_lora, save_adapter
from tether.train.setup import attach_lora, configure_process, precision_summary, seed_run, setup_policy, setup_problems
from tether.train.loop import graceful_interrupt, progress_bar
from tether.rollout import compute_tokenizer_corpus, make_rollout
from tether.rollout.prompt_format import compute_prompt_format
from tether.train.step import UpdateState, do_guarded_step


def run_sft(cfg: TetherConfig, run_dir: str | Path, policy: HFPolicy | None = None, resume: bool = False,
            records: list[SeqRecord] | None = None, overwrite: bool = False,
            kind: str = "sft") -> tuple[HFPolicy, dict[str, Any]]:
    """Train on demonstrations for `cfg.sft.steps` steps; returns the policy and a summary.
    `records`: train on these sequences instead (recipes/rs_sft.py's accepted samples).
    An existing run directory needs `resume` or `overwrite` (tether.runs.resume)."""
    t_start, c_start = time.perf_counter(), time.process_time()
    begin = do_open_run(run_dir, cfg, kind, resume, overwrite)
    rd, ckpt = begin.run_dir, begin.checkpoint
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    train, _ = setup_problems(cfg.data)
    if policy is None:
        policy = setup_policy(cfg.model, cfg.run.seed, rd.root, lambda: compute_tokenizer_corpus(cfg.data.task, train))
    elif cfg.model.lora is not None:  # handed over in memory (a pipeline stage)
        attach_lora(policy, cfg.model.lora, rd.root / "base_model")
    rollout = make_rollout(cfg)
    demos = train[: cfg.sft.train_size] if cfg.sft.train_size else train
    if records is None:
        records = rollout.build_demo_records(policy, demos, cfg)  # single-turn or the env's expert
    # the run record: the prompt format the model learns (SFT teaches it, so no mismatch warning), and the
    # demonstrations whose target is empty (only the stop token trained: a tether doctor finding)
    fmt = compute_prompt_format(cfg.data.chat, demos, rollout.multi_turn)
    empty = sum(sum(r.loss_mask) <= 1 for r in records) / max(len(records), 1)
    if empty:
        print(f"[tether] WARNING: {empty:.0%} of the SFT demonstrations have an empty target (the `completion` "
              "column, else the answer): they teach the model to stop at once", flush=True)
    stream = ProblemStream([{"i": i} for i in range(len(records))], cfg.run.seed)
    model = policy.model
    model.train()
    optimizer = build_optimizer(model.parameters(), cfg.sft.lr, cfg.sft.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.sft.steps, cfg.sft.warmup_steps, "cosine")
    start, update = 0, UpdateState()
    if ckpt is not None:
        extra = load_checkpoint(ckpt, model, optimizer, scheduler)
        stream.load_state_dict(extra["data"])
        start = int(extra["step"])
        update = UpdateState(**extra.get("update", {}))
        if "sft.lr" in begin.changes:
            do_apply_lr(optimizer, scheduler, cfg.sft.lr)
    sinks = MultiSink(build_sinks(rd, cfg.logging, cfg, start_step=start if ckpt is not None else None))
    losses: list[float] = []
    step = start
    with graceful_interrupt() as stop, progress_bar(cfg.sft.steps, "SFT", cfg.logging.progress, start) as bar:
        for step in range(start + 1, cfg.sft.steps + 1):
            t0 = time.perf_counter()
            batch = [records[r["i"]] for r in stream.next_batch(cfg.sft.batch_size)]
            loss = _sft_step(policy, optimizer, scheduler, batch, cfg, update)
            losses.append(loss)
            metrics = {"sft/loss": loss, "lr": optimizer.param_groups[0]["lr"], "nonfinite_steps": update.nonfinite_steps,
                       "time/step": time.perf_counter() - t0}
            sinks.log(step, metrics)
            bar(step, loss=loss)
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 or stop:
                save_checkpoint(rd, step, model, policy.tokenizer, optimizer, scheduler,
                                {"step": step, "data": stream.state_dict(), "update": vars(update).copy()}, cfg.checkpoint.keep)
            if stop:
                break
    final = rd.root / "final_model"
    if not compute_all_finite(list(model.parameters())):  # a NaN model is never written as a result
        raise CheckpointError(f"refusing to write {final}: the model has non-finite weights")
    if is_lora(model):  # the adapter (peft format); load_policy / tether eval merge it, tether export writes a plain model
        save_adapter(model, final)
    else:
        model.save_pretrained(str(final), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(final))
    sinks.close()
    summary = {"kind": kind, "steps": step, "final_loss": losses[-1] if losses else None,
               "final_model": str(final), "wall_seconds": time.perf_counter() - t_start,
               "cpu_seconds": time.process_time() - c_start, "interrupted": bool(stop),
               "precision": precision_summary(cfg.model, policy), "nonfinite_steps": update.nonfinite_steps,
               "prompt_format": fmt, "sft_empty_targets": empty}
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, final, step)  # the result is final_model/, whatever checkpoint.every
    return policy, summary


def _sft_step(policy: HFPolicy, optimizer, scheduler, batch: list[SeqRecord], cfg: TetherConfig,
              state: UpdateState) -> float:
    padded = pad_records(batch, policy.pad_id)
    norm = compute_agg_norm(padded.loss_mask_BT)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for idx in split_by_token_budget(padded.attention_mask_BT.sum(-1).tolist(), cfg.train.micro_batch_tokens):
        rows = torch.tensor(idx)
        am = padded.attention_mask_BT[rows]
        T = int(am.sum(-1).max())
        # every demonstration may share the batch's common prefix (a system prompt, tool schemas): computed
        # once when that runs fewer positions (tether.policy.prefix; same log-probs), else padded rows
        mask = padded.loss_mask_BT[rows, :T]
        logp, _ = compute_sequence_logprobs(policy, padded.input_ids_BT[rows, :T], am[:, :T], torch.zeros(len(idx), dtype=torch.long),
                                            pack=False, share=cfg.train.share_prefix, needed_BT=mask > 0)
        mask = mask.to(logp.device)
        loss = agg_loss(-logp, mask, "token_mean", norm)
        loss.backward()
        total += float(loss.detach())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    do_guarded_step(optimizer, scheduler, params, cfg.sft.grad_clip, cfg.train.max_bad_steps, state)
    return total
