"""Rejection-sampling SFT: sample k answers per problem from the current policy, keep the ones the
verifier accepts, mask the turns that erred, mix in other SFT data, and fine-tune on the result
(DeepSeek-R1 arXiv 2501.12948 §2.3.3; selective RFT of SWE-agent RL; Kimi k1.5's "shortest
rejection sampling" for long2short, arXiv 2501.12599 §2.4).

    tether pipeline CONFIG     with a stage {kind: rs_sft, overrides: {rs_sft: {keep: shortest}}}

One stage, top to bottom:
  problems (rs_sft.problems of train) -> k samples each (rollout.sampling) -> accepted ones
  (reward.correct, not truncated) -> keep all | the shortest | at most m per problem -> loss
  mask zeroed on error turns -> + rs_sft.mix_demos scripted demos + rs_sft.mix_path JSONL
  -> recipes/sft.py's loop (sft.steps, sft.lr, sft.batch_size) -> final_model/

Deliberate simplifications:
- samples are drawn once, at the start of the stage, from its starting model, and stored in
  `rs_data.pt`; a resumed stage reads them back instead of sampling again (exact resume);
- the sampled token ids are trained on as they are (token ids are the only truth): no
  re-tokenisation, no rewriting of "unreadable" answers as R1 does with its cold-start data.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from tether.train.batching import SeqRecord, build_sequences
from tether.config import TetherConfig
from tether.data import ProblemStream
from tether.recipes.sft import run_sft
from tether.recipes.stage_common import find_error_turns, mask_error_turns, read_jsonl_fields, run_sampling, start_stage
from tether.rollout import make_rollout
from tether.tasks import DataError
from tether.types import Trajectory, TrajectoryGroup


def select_accepted(trajs: Sequence[Trajectory], keep: str, m: int) -> list[Trajectory]:
    """The verifier-accepted, untruncated samples of one problem, then all of them, the shortest
    one (fewest action tokens; the first on ties), or the first m (samples are i.i.d.)."""
    ok = [t for t in trajs if t.reward.correct and not t.stop.truncated]
    if keep == "shortest":
        return [min(ok, key=lambda t: t.num_action_tokens)] if ok else []
    if keep == "at_most":
        return ok[:m]
    return ok


def build_rs_records(groups: Sequence[TrajectoryGroup], cfg: TetherConfig) -> tuple[list[SeqRecord], dict[str, float]]:
    """Training sequences of the kept samples, error turns masked; with counts for the summary."""
    rs = cfg.rs_sft
    records: list[SeqRecord] = []
    kept = masked_turns = 0
    for g, group in enumerate(groups):
        for t in select_accepted(group.trajectories, rs.keep, rs.max_per_problem):
            bad = find_error_turns(t) if rs.mask_error_turns else set()
            masked_turns += len(bad)
            records.extend(mask_error_turns(r, bad) for r in build_sequences(t, g, kept, True))
            kept += 1
    samples = sum(len(g.trajectories) for g in groups)
    accepted = sum(bool(t.reward.correct) for g in groups for t in g.trajectories)
    kept_tokens = [t.num_action_tokens for g in groups for t in select_accepted(g.trajectories, rs.keep, rs.max_per_problem)]
    stats = {"rs/samples": float(samples), "rs/accepted": float(accepted), "rs/accept_rate": accepted / max(samples, 1),
             "rs/kept": float(kept), "rs/masked_turns": float(masked_turns),
             "rs/problems_with_accepted": float(sum(any(t.reward.correct for t in g.trajectories) for g in groups)),
             "rs/kept_tokens_mean": sum(kept_tokens) / max(len(kept_tokens), 1)}
    return records, stats


def load_completions(path: str | Path) -> list[dict[str, Any]]:
    """JSONL of {prompt, completion} to mix in; a malformed line fails with file:line."""
    return read_jsonl_fields(path, ("prompt", "completion"), "rs_sft.mix_path")


def _save_records(path: Path, records: list[SeqRecord], stats: dict[str, float]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"ids": [list(r.ids) for r in records], "mask": [list(r.loss_mask) for r in records],
                "stats": stats}, tmp)
    os.replace(tmp, path)


def _load_records(path: Path) -> tuple[list[SeqRecord], dict[str, float]]:
    data = torch.load(path, weights_only=True)
    recs = [SeqRecord(tuple(ids), tuple(m), (0.0,) * len(ids), (0.0,) * len(ids), i, i, 0.0, True)
            for i, (ids, m) in enumerate(zip(data["ids"], data["mask"]))]
    return recs, data["stats"]


def run_rs_sft(cfg: TetherConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Sample, filter, mix and fine-tune; writes final_model/ and summary.json (kind rs_sft)."""
    t0 = time.perf_counter()
    rd, train, policy = start_stage(cfg, run_dir, "rs_sft")
    data_file = rd.root / "rs_data.pt"
    if resume and data_file.is_file():
        records, stats = _load_records(data_file)
    else:
        problems = ProblemStream(train, cfg.run.seed).next_batch(min(cfg.rs_sft.problems, len(train)))
        groups = run_sampling(policy, problems, cfg.rs_sft.k, cfg, torch.Generator().manual_seed(cfg.run.seed + 29))
        records, stats = build_rs_records(groups, cfg)
        mix = train[: cfg.rs_sft.mix_demos] + (load_completions(cfg.rs_sft.mix_path) if cfg.rs_sft.mix_path else [])
        if mix:
            records += make_rollout(cfg).build_demo_records(policy, mix, cfg)
        stats["rs/mixed"] = float(len(mix))
        if not records:
            raise DataError(f"rs_sft: none of {int(stats['rs/samples'])} samples ({cfg.rs_sft.k} per problem) was accepted "
                            "and nothing is mixed in: start from a stronger model, raise rs_sft.k, or set rs_sft.mix_demos")
        _save_records(data_file, records, stats)
    print(f"[rs_sft] kept {int(stats['rs/kept'])} of {int(stats['rs/accepted'])} accepted samples "
          f"({stats['rs/accept_rate']:.2f} of {int(stats['rs/samples'])}), {int(stats['rs/mixed'])} mixed in", flush=True)
    # this stage's own folder: continue its SFT checkpoint if there is one (there is none on a fresh start)
    _, sft = run_sft(cfg, rd.root, policy=policy, resume=True, records=records, kind="rs_sft")
    summary = {**sft, "kind": "rs_sft", **stats, "wall_seconds": time.perf_counter() - t0}
    rd.write_summary(summary)
    return summary
