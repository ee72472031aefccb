"""TrajectoryGroups -> training sequences -> padded TrainBatch.

Masks come from lengths and stop reasons, never from token values (pad may equal eos). The loss
mask is built here, in one place, and every loss path uses it (pitfall 2).

Turns of one episode are merged into one sequence while each turn's context extends the previous
sequence (append-only context: prefix check on token ids); when the context builder rewrote the
context (sliding window, summary) the turn starts a new sequence, so every training sample is
exactly what the model saw when it acted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tether.types import Outcome, Trajectory, TrajectoryGroup


@dataclass(frozen=True)
class SeqRecord:
    """One training sequence (lists of equal length, asserted at every merge)."""

    ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    rollout_logp: tuple[float, ...]
    token_rewards: tuple[float, ...]
    group: int
    traj: int
    score: float
    valid: bool
    weight: float = 1.0  # compact filtering: 0 drops the sequence from the loss
    turn_ids: tuple[int, ...] = ()  # per token: index of the episode turn whose action it is, -1 elsewhere
    kept: tuple[int, ...] = ()  # per token: the sampler's kept count (Turn.action_kept), 0 = full vocabulary


def build_sequences(traj: Trajectory, group: int, traj_idx: int, valid: bool, weight: float = 1.0) -> list[SeqRecord]:
    """Split an episode into training sequences, merging turns whose contexts extend the previous."""
    seqs: list[SeqRecord] = []
    ids: list[int] = []
    mask: list[int] = []
    logp: list[float] = []
    rew: list[float] = []
    tix: list[int] = []  # turn index per token
    kept: list[int] = []  # sampling mask per token (0: unfiltered or not sampled)

    def flush() -> None:
        if ids:
            seqs.append(SeqRecord(tuple(ids), tuple(mask), tuple(logp), tuple(rew), group, traj_idx, traj.reward.total, valid, weight,
                                  tuple(tix), tuple(kept) if any(kept) else ()))

    last = len(traj.turns) - 1
    for k, turn in enumerate(traj.turns):
        ctx = list(turn.context_ids)
        if ids and ctx[: len(ids)] == ids:
            extra = ctx[len(ids):]
        else:
            flush()
            ids, mask, logp, rew, tix, kept = [], [], [], [], [], []
            extra = ctx
        ids += extra + list(turn.action_ids)
        mask += [0] * len(extra) + [1] * len(turn.action_ids)
        logp += [0.0] * len(extra) + list(turn.action_logprobs)
        step = [0.0] * (len(extra) + len(turn.action_ids))
        if turn.action_ids:
            step[-1] = turn.reward + (traj.reward.total if k == last else 0.0)
        rew += step
        tix += [-1] * len(extra) + [k] * len(turn.action_ids)
        kept += [0] * len(extra) + (list(turn.action_kept) or [0] * len(turn.action_ids))
        if not (len(ids) == len(mask) == len(logp) == len(rew) == len(tix) == len(kept)):
            raise AssertionError(f"mask/ids length mismatch merging turn {k} of {traj.task_id}")
    flush()
    return seqs


def build_records(groups: list[TrajectoryGroup], weights: dict[tuple[int, int], float] | None = None, mask_invalid: bool = True) -> list[SeqRecord]:
    """All training sequences of `groups`. A trajectory whose reward failed is `valid=False`
    (excluded from advantages) when `mask_invalid`; `weights[(g, i)]` applies compact filtering."""
    records: list[SeqRecord] = []
    traj_idx = 0
    for g, group in enumerate(groups):
        for i, traj in enumerate(group.trajectories):
            valid = traj.reward.outcome == Outcome.OK or not mask_invalid
            w = 1.0 if weights is None else weights.get((g, i), 1.0)
            records.extend(build_sequences(traj, g, traj_idx, valid, w))
            traj_idx += 1
    return records


@dataclass(frozen=True)
class PaddedRecords:
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    rollout_logp_BT: torch.Tensor
    token_rewards_BT: torch.Tensor
    scores_B: torch.Tensor
    group_B: torch.Tensor
    traj_B: torch.Tensor
    valid_B: torch.Tensor
    turn_BT: torch.Tensor | None = None  # long: turn index of each action token, -1 elsewhere
    kept_BT: torch.Tensor | None = None  # long: sampling mask (kept count) per token; None: no filter anywhere


def pad_records(records: list[SeqRecord], pad_id: int) -> PaddedRecords:
    """Right-pad records into [B,T] tensors. The loss mask is the action mask times the
    sequence's validity weight (compact filtering); padding is never in it."""
    if not records:
        raise ValueError("no training sequences to pad")
    B, T = len(records), max(len(r.ids) for r in records)
    lengths = torch.tensor([len(r.ids) for r in records])
    attn = torch.arange(T)[None] < lengths[:, None]  # boolean-mask writes fill it row by row, in order

    def flat(field: str, dtype) -> torch.Tensor:
        return torch.tensor([x for r in records for x in getattr(r, field)], dtype=dtype)

    ids = torch.full((B, T), pad_id, dtype=torch.long)
    ids[attn] = flat("ids", torch.long)
    lmask = torch.zeros((B, T), dtype=torch.float32)
    weight = torch.tensor([float(r.weight) for r in records], dtype=torch.float32)
    lmask[attn] = flat("loss_mask", torch.float32) * weight.repeat_interleave(lengths)
    rlogp = torch.zeros((B, T), dtype=torch.float32)
    rlogp[attn] = flat("rollout_logp", torch.float32)
    trew = torch.zeros((B, T), dtype=torch.float32)
    trew[attn] = flat("token_rewards", torch.float32)
    turn = torch.full((B, T), -1, dtype=torch.long)
    kept = torch.zeros((B, T), dtype=torch.long) if any(r.kept for r in records) else None
    for b, r in enumerate(records):
        if r.turn_ids:
            turn[b, :len(r.ids)] = torch.tensor(r.turn_ids, dtype=torch.long)
        if r.kept and kept is not None:
            kept[b, :len(r.ids)] = torch.tensor(r.kept, dtype=torch.long)
    return PaddedRecords(
        input_ids_BT=ids,
        attention_mask_BT=attn,
        loss_mask_BT=lmask,
        rollout_logp_BT=rlogp,
        token_rewards_BT=trew,
        scores_B=torch.tensor([r.score for r in records], dtype=torch.float32),
        group_B=torch.tensor([r.group for r in records], dtype=torch.long),
        traj_B=torch.tensor([r.traj for r in records], dtype=torch.long),
        valid_B=torch.tensor([r.valid for r in records], dtype=torch.bool),
        turn_BT=turn,
        kept_BT=kept,
    )


def split_by_token_budget(lengths_B: list[int], budget: int) -> list[list[int]]:
    """Greedy micro-batches of row indices whose padded size (rows x longest) fits `budget`.

    Each micro-batch holds at least one row, so an over-long row still trains (alone)."""
    order = sorted(range(len(lengths_B)), key=lambda i: -lengths_B[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        L = lengths_B[i]
        if cur and max(longest, L) * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, L)
    if cur:
        batches.append(cur)
    return batches
