"""Preference training: DPO (arXiv 2305.18290), IPO (arXiv 2310.12036) or reference-free SimPO
(arXiv 2405.14734) on (chosen, rejected) pairs; the losses live in `tether.algos.preference`.

    tether pipeline CONFIG     with a stage {kind: dpo, overrides: {dpo: {pairs: samples, loss: sigmoid}}}

Where the pairs come from (`dpo.pairs`):
  file        JSONL of {prompt, chosen, rejected} texts (a missing field fails with file:line);
  samples     k samples per problem from the stage's starting model: an accepted one is chosen,
              a failed one rejected (one pair per problem that has both);
  delta       Delta Learning (Geng et al. arXiv 2507.06187; OLMo 3's DPO): chosen sampled from `dpo.strong_model`,
              rejected from `dpo.weak_model` on the same problem — the pair's *difference* in
              quality teaches, even when neither answer is good;
  short_long  long2short (Kimi k1.5 arXiv 2501.12599 §2.4): the shortest accepted sample is
              chosen, the longest sample at least `long_ratio` times longer is rejected.
Sampled pairs keep their token ids; a multi-turn pair is masked like RL (assistant tokens only,
via batching.build_sequences). The reference policy is the stage's starting model: its sequence
log-probs are computed once, before the first update, and stored with the pairs.

One step: B pairs -> policy log-probs of both sides (one forward) -> loss per pair -> mean -> AdamW.

Deliberate simplifications: pairs are built once at the stage start (offline DPO on on-policy
samples, as OLMo 3 and Kimi do), stored in `pairs.pt` so a resumed stage reads them back; no
micro-batching inside a step (the pairs of a tiny-model step fit in one forward).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tether.algos.preference import PREFERENCE_LOSSES, PreferenceInputs, compute_sequence_logps, needs_reference
from tether.train.batching import SeqRecord, build_sequences, pad_records
from tether.config import TetherConfig
from tether.data import ProblemStream
from tether.io.checkpoint import find_latest_checkpoint, load_checkpoint, save_checkpoint
from tether.io.sinks import MultiSink, build_sinks
from tether.optim import build_optimizer, build_scheduler
from tether.policy.hf import HFPolicy, compute_logprobs
from tether.train.loop import graceful_interrupt, progress_bar
from tether.runs.lifecycle import do_finish_run
from tether.recipes.stage_common import load_model_dir, read_jsonl_fields, run_sampling, save_model, start_stage
from tether.policy.chat import encode_prompt
from tether.tasks import DataError
from tether.types import Trajectory, TrajectoryGroup

Side = list[tuple[list[int], list[int]]]  # the sequences (ids, loss mask) of one response
PAIR_FIELDS = ("prompt", "chosen", "rejected")


def load_pair_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a pairs JSONL file; a line without prompt/chosen/rejected fails with file:line."""
    return read_jsonl_fields(path, PAIR_FIELDS, "dpo.pairs_path")


def _text_side(policy: HFPolicy, prompt: list[int], text: str) -> Side:
    completion = list(policy.tokenizer.encode(text, add_special_tokens=False)) + [policy.stop_ids[0]]
    return [(prompt + completion, [0] * len(prompt) + [1] * len(completion))]


def _traj_side(traj: Trajectory) -> Side:
    return [(list(r.ids), list(r.loss_mask)) for r in build_sequences(traj, 0, 0, True)]


def _accepted_vs_failed(group: TrajectoryGroup, cfg: TetherConfig) -> tuple[Trajectory, Trajectory] | None:
    ok = [t for t in group.trajectories if t.reward.correct and not t.stop.truncated]
    bad = [t for t in group.trajectories if not t.reward.correct]
    return (ok[0], bad[0]) if ok and bad else None


def _short_vs_long(group: TrajectoryGroup, cfg: TetherConfig) -> tuple[Trajectory, Trajectory] | None:
    ok = [t for t in group.trajectories if t.reward.correct and not t.stop.truncated]
    if not ok:
        return None
    short = min(ok, key=lambda t: t.num_action_tokens)
    floor = max(short.num_action_tokens * cfg.dpo.long_ratio, short.num_action_tokens + 1)
    longer = [t for t in group.trajectories if t.num_action_tokens >= floor]
    return (short, max(longer, key=lambda t: t.num_action_tokens)) if longer else None


PAIR_BUILDERS: dict[str, Callable[[TrajectoryGroup, TetherConfig], tuple[Trajectory, Trajectory] | None]] = {
    "samples": _accepted_vs_failed, "short_long": _short_vs_long,
}


def build_pairs(policy: HFPolicy, cfg: TetherConfig, train: Sequence[dict[str, Any]]) -> list[tuple[Side, Side]]:
    """(chosen, rejected) sides per `dpo.pairs`, from the file or sampled now."""
    d = cfg.dpo
    if d.pairs == "file":
        rows = load_pair_rows(d.pairs_path or "")
        prompts = [encode_prompt(policy.tokenizer, r, cfg.data.chat) for r in rows]
        return [(_text_side(policy, p, r["chosen"]), _text_side(policy, p, r["rejected"])) for p, r in zip(prompts, rows)]
    problems = ProblemStream(list(train), cfg.run.seed).next_batch(min(d.problems, len(train)))
    gen = torch.Generator().manual_seed(cfg.run.seed + 31)
    if d.pairs == "delta":
        strong = run_sampling(load_model_dir(d.strong_model, cfg, "dpo.strong_model"), problems, 1, cfg, gen)
        weak = run_sampling(load_model_dir(d.weak_model, cfg, "dpo.weak_model"), problems, 1, cfg, gen)
        pairs = [(s.trajectories[0], w.trajectories[0]) for s, w in zip(strong, weak)
                 if s.trajectories[0].response_ids != w.trajectories[0].response_ids]
    else:
        groups = run_sampling(policy, problems, d.k, cfg, gen)
        pairs = [p for g in groups if (p := PAIR_BUILDERS[d.pairs](g, cfg)) is not None]
    return [(_traj_side(c), _traj_side(r)) for c, r in pairs]


def score_sides(policy: HFPolicy, sides: Sequence[Side]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence log-probs [S] (gradient flows when enabled) and loss-token counts [S] of `sides`."""
    seqs = [(s, ids, m) for s, side in enumerate(sides) for ids, m in side]
    recs = [SeqRecord(tuple(ids), tuple(m), (0.0,) * len(ids), (0.0,) * len(ids), s, s, 0.0, True) for s, ids, m in seqs]
    p = pad_records(recs, policy.pad_id)
    logp_BT, _ = compute_logprobs(policy, p.input_ids_BT, p.attention_mask_BT, needed_BT=p.loss_mask_BT > 0)
    return compute_sequence_logps(logp_BT, p.loss_mask_BT.to(logp_BT.device), p.group_B, len(sides))


def _reference_logps(policy: HFPolicy, pairs: list[tuple[Side, Side]], chunk: int = 32) -> list[tuple[float, float]]:
    out, was_training = [], policy.model.training
    policy.model.eval()  # no dropout in the reference's scores
    with torch.no_grad():
        for i in range(0, len(pairs), chunk):
            part = pairs[i:i + chunk]
            lp, _ = score_sides(policy, [s for pair in part for s in pair])
            out += [(float(lp[2 * j]), float(lp[2 * j + 1])) for j in range(len(part))]
    policy.model.train(was_training)
    return out


def _prepare(policy: HFPolicy, cfg: TetherConfig, train, path: Path, resume: bool) -> dict[str, Any]:
    """The stage's pairs and reference log-probs: read back on resume, else built and stored."""
    if resume and path.is_file():
        return torch.load(path, weights_only=True)
    pairs = build_pairs(policy, cfg, train)
    if not pairs:
        raise DataError(f"dpo: no pairs could be built (dpo.pairs={cfg.dpo.pairs}, {cfg.dpo.problems} problems x "
                        f"{cfg.dpo.k} samples): no problem had both a chosen and a rejected sample; raise dpo.k or "
                        "dpo.problems, or start from another model")
    ref = _reference_logps(policy, pairs) if needs_reference(cfg.dpo.loss) else [(0.0, 0.0)] * len(pairs)
    data = {"pairs": [[list(map(list, c)), list(map(list, r))] for c, r in pairs], "ref": ref}
    torch.save(data, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    return data


def _dpo_step(policy, optimizer, scheduler, batch: list, cfg: TetherConfig) -> dict[str, float]:
    sides = [[tuple(s) for s in side] for pair, _ in batch for side in pair]
    logp, n = score_sides(policy, sides)
    ref = torch.tensor([r for _, r in batch], dtype=logp.dtype, device=logp.device)
    inp = PreferenceInputs(logp[0::2], logp[1::2], ref[:, 0], ref[:, 1], n[0::2], n[1::2])
    loss_P, metrics = PREFERENCE_LOSSES[cfg.dpo.loss](inp, cfg.dpo)
    loss = loss_P.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.dpo.grad_clip or float("inf"))
    if torch.isfinite(gnorm):
        optimizer.step()
    scheduler.step()
    return {"dpo/loss": float(loss.detach()), "grad_norm": float(gnorm), "lr": optimizer.param_groups[0]["lr"],
            **{f"dpo/{k}": float(v) for k, v in metrics.items()}}


def run_dpo(cfg: TetherConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """`dpo.steps` preference steps from `model.path`; writes final_model/ and summary.json."""
    t0 = time.perf_counter()
    rd, train, policy = start_stage(cfg, run_dir, "dpo")
    PREFERENCE_LOSSES[cfg.dpo.loss]  # an unknown loss fails before any sampling
    data = _prepare(policy, cfg, train, rd.root / "pairs.pt", resume)
    items = list(zip(data["pairs"], data["ref"]))
    stream = ProblemStream([{"i": i} for i in range(len(items))], cfg.run.seed)
    policy.model.train()
    optimizer = build_optimizer(policy.model.parameters(), cfg.dpo.lr, 0.0)
    scheduler = build_scheduler(optimizer, max(1, cfg.dpo.steps), cfg.dpo.warmup_steps, "constant")
    start = 0
    if resume and (ckpt := find_latest_checkpoint(rd)) is not None:
        extra = load_checkpoint(ckpt, policy.model, optimizer, scheduler)
        stream.load_state_dict(extra["data"])
        start = int(extra["step"])
        rd.truncate_metrics_after(start)
    sinks = MultiSink(build_sinks(rd, cfg.logging, cfg))
    last: dict[str, float] = {}
    step = start
    with graceful_interrupt() as stop, progress_bar(cfg.dpo.steps, "DPO", cfg.logging.progress, start) as bar:
        for step in range(start + 1, cfg.dpo.steps + 1):
            t1 = time.perf_counter()
            batch = [items[r["i"]] for r in stream.next_batch(min(cfg.dpo.batch_size, len(items)))]
            last = _dpo_step(policy, optimizer, scheduler, batch, cfg) | {"time/step": time.perf_counter() - t1}
            sinks.log(step, last)
            bar(step, loss=last["dpo/loss"], acc=last["dpo/accuracy"])
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or stop:
                save_checkpoint(rd, step, policy.model, policy.tokenizer, optimizer, scheduler,
                                {"step": step, "data": stream.state_dict()}, cfg.checkpoint.keep)
            if stop:
                break
    final = save_model(policy, rd.root / "final_model")
    sinks.close()
    summary = {"kind": "dpo", "loss": cfg.dpo.loss, "pairs_source": cfg.dpo.pairs, "pairs": len(items), "steps": step,
               "final_loss": last.get("dpo/loss"), "final_accuracy_on_pairs": last.get("dpo/accuracy"),
               "final_model": str(final), "interrupted": bool(stop), "wall_seconds": time.perf_counter() - t0}
    rd.write_summary(summary)
    do_finish_run(rd.root, summary, final, step)
    return summary
