"""Reward-model recipe: a Bradley–Terry reward model from preference pairs (`tether rm CONFIG`).

    pairs (JSONL, or verifier outcomes of the base policy's own samples) -> held-out split
    -> AdamW on -log sigmoid(r_chosen - r_rejected) -> held-out pair accuracy -> final_model/

The reward model starts from `model.path` (a causal LM; transformers adds the scalar `score`
head) and is saved as a `*ForSequenceClassification` model that the `reward_model` reward
component loads (tether.rewards.rm).

Deliberate simplifications: one process, full fine-tuning, no margin term, a constant learning
rate; pairs built from verifier outcomes pair the i-th correct with the i-th incorrect sample of
a problem (at most 4 pairs per problem), which is enough for tasks with a checkable answer.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from tether.config import ConfigError, TetherConfig
from tether.runs.lifecycle import do_finish_run
from tether.runs.resume import do_open_run
from tether.io.run_dir import write_summary_json, write_text_atomic
from tether.train.loop import progress_bar
from tether.train.setup import configure_process, seed_run, setup_problems
from tether.rewards.rm import (
    compute_bradley_terry_loss, compute_pair_accuracy, compute_scores, encode_pair_texts, load_reward_model,
    make_pairs_from_groups, read_pairs,
)

EVAL_PAIRS = "eval_pairs.jsonl"  # the held-out pairs, kept in the run directory


def build_verifier_pairs(cfg: TetherConfig) -> list[dict[str, str]]:
    """Sample `rm.samples` completions per training problem from model.path; pair correct over incorrect."""
    from tether.policy.hf import load_policy
    from tether.rollout import make_rollout

    policy = load_policy(cfg.model.path, cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    train, _ = setup_problems(cfg.data)
    problems = train[: cfg.rm.problems]
    gen = torch.Generator().manual_seed(cfg.run.seed)
    groups, _ = make_rollout(cfg).run(policy, problems, cfg.rm.samples, cfg.rollout.sampling, gen)
    return make_pairs_from_groups(groups)


def run_rm(cfg: TetherConfig, run_dir: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Train the reward model; returns the summary written to summary.json. An existing run
    directory is refused unless `overwrite` (tether.runs.resume)."""
    t0 = time.perf_counter()
    if not cfg.model.path:
        raise ConfigError("tether rm needs model.path: the causal LM the reward model starts from")
    rd = do_open_run(run_dir, cfg, "rm", overwrite=overwrite).run_dir
    seed_run(cfg.run)
    configure_process(cfg.sandbox, cfg.model)
    r = cfg.rm
    pairs = read_pairs(r.pairs) if r.pairs else build_verifier_pairs(cfg)
    rng = random.Random(cfg.run.seed)
    if r.eval_pairs:
        train_pairs, held_out = pairs, read_pairs(r.eval_pairs)
    else:
        rng.shuffle(pairs)
        k = max(1, int(len(pairs) * r.eval_fraction))
        held_out, train_pairs = pairs[:k], pairs[k:]
    # the held-out pairs stay with the run: `tether eval` of it reports their pair accuracy
    do_write_jsonl(rd.root / EVAL_PAIRS, held_out)
    if len(train_pairs) < 2:
        raise ConfigError(f"only {len(train_pairs)} training pair(s): the reward model needs more (rm.problems, rm.samples)")
    model, tok = load_reward_model(cfg.model.path)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr)
    pad = model.config.pad_token_id or 0
    start_acc = compute_pair_accuracy(model.eval(), tok, held_out, r.max_length)
    rd.append_metrics(0, {"rm/eval_pair_accuracy": start_acc, "rm/train_pairs": len(train_pairs),
                          "rm/eval_pairs": len(held_out)})
    acc = start_acc
    with progress_bar(r.steps, "RM", cfg.logging.progress) as bar:
        for step in range(1, r.steps + 1):
            model.train()
            batch = rng.sample(train_pairs, min(r.batch_size, len(train_pairs)))
            prompts = [p["prompt"] for p in batch]
            ids = encode_pair_texts(tok, prompts, [p["chosen"] for p in batch], r.max_length)
            ids += encode_pair_texts(tok, prompts, [p["rejected"] for p in batch], r.max_length)
            scores = compute_scores(model, ids, pad)
            loss = compute_bradley_terry_loss(scores[: len(batch)], scores[len(batch):])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
            m = {"rm/loss": float(loss.detach()), "rm/grad_norm": grad_norm,
                 "rm/train_batch_accuracy": float((scores[: len(batch)] > scores[len(batch):]).float().mean())}
            if step == r.steps or step in r.save_at or (r.eval_every and step % r.eval_every == 0):
                acc = compute_pair_accuracy(model.eval(), tok, held_out, r.max_length)
                m["rm/eval_pair_accuracy"] = acc
            rd.append_metrics(step, m)
            bar(step, loss=m["rm/loss"], acc=acc)
            if step in r.save_at and step < r.steps:  # the model an N-step run ends with (constant lr, same batches)
                snap = rd.root / f"step-{step}"
                _do_save(model, tok, snap / "final_model")
                write_summary_json(snap / "summary.json", {**_summary(step, train_pairs, held_out, start_acc, acc, snap / "final_model"),
                                                           "wall_seconds": time.perf_counter() - t0, "snapshot_of": str(rd.root)})
    out = rd.root / "final_model"
    _do_save(model, tok, out)
    summary = {**_summary(r.steps, train_pairs, held_out, start_acc, acc, out), "wall_seconds": time.perf_counter() - t0}
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, out, r.steps)
    return summary


def do_write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def _do_save(model, tok, out: Path) -> None:
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def _summary(steps: int, train_pairs: list, held_out: list, start_acc: float, acc: float, out: Path) -> dict[str, Any]:
    return {"kind": "rm", "steps": steps, "train_pairs": len(train_pairs), "eval_pairs": len(held_out),
            "baseline_pair_accuracy": start_acc, "final_pair_accuracy": acc, "model": str(out)}
