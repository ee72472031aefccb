"""Signals of invariants every correct RL step keeps, whatever the model or task (no fault model):
what the loss mask covers position by position, whether the trainer is handed the token ids the
sampler drew, whether a group's samples were drawn independently, whether a prompt carries its own
answer, whether rewards reach the samples they score and pay identical responses alike, and the
parameters' norm (the sampler's buffers: `telemetry.compute_buffers_fingerprint`).

Each function is pure and cheap (O(tokens) or O(parameters) of one step); the monitor and the
train batch write their results into the step's metrics row (`health/*`), and the detectors of
`tether.health.detectors_progress` judge them. Hand-computed tests: tests/unit/health/test_invariants.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Sequence

import torch

from tether.types import Outcome

# ----------------------------------------------------------------------------- the loss mask


def compute_mask_coverage(loss_mask_BT: torch.Tensor, sampled_BT: torch.Tensor, row_ok_B: torch.Tensor) -> dict[str, float]:
    """The loss mask against the sampled token positions, position by position (house rule 6:
    the mask covers exactly the sampled tokens). `sampled_BT` [B, T] bool: the positions of
    sampled action tokens (from the trajectories' turns); `row_ok_B` [B] bool: rows that train
    (compact filtering drops the others).

    health/mask_missed        sampled positions of training rows outside the mask / sampled positions
    health/mask_extra         masked positions that were not sampled / sampled positions
    health/mask_missed_last   training rows whose last sampled token is outside the mask (an EOS
                              masked by its token value) / training rows
    health/mask_missed_first  the same for the first sampled token
    health/mask_shifted       training rows whose mask is their sampled positions moved by one / rows
    health/mask_uneven        training rows whose mask weighs its own positions unequally (one row's
                              weight, its validity, is one number for all its tokens) / rows
    """
    m, s = loss_mask_BT > 0, sampled_BT.bool()
    ok = row_ok_B.bool().to(m.device)[:, None] & s.any(-1, keepdim=True)
    n_s = float((s & ok).sum())
    rows = float(ok.sum())
    if n_s == 0 or rows == 0:
        return {}
    T = s.shape[1]
    idx = torch.arange(T)
    first = torch.where(s, idx, T).min(-1).values.clamp(max=T - 1)
    last = torch.where(s, idx, -1).max(-1).values.clamp(min=0)
    r = torch.arange(s.shape[0])
    okB = ok.squeeze(-1)
    right = torch.zeros_like(s)
    right[:, 1:] = s[:, :-1]
    left = torch.zeros_like(s)
    left[:, :-1] = s[:, 1:]
    shifted = ((m == right).all(-1) | (m == left).all(-1)) & ~(m == s).all(-1)
    w = loss_mask_BT.float()
    hi = torch.where(m, w, torch.full_like(w, -math.inf)).max(-1).values
    lo = torch.where(m, w, torch.full_like(w, math.inf)).min(-1).values
    uneven = m.any(-1) & (hi - lo > 1e-6 * hi.abs().clamp(min=1.0))
    return {
        "health/mask_missed": float((s & ~m & ok).sum()) / n_s,
        "health/mask_extra": float((m & ~s).sum()) / n_s,
        "health/mask_missed_last": float((~m[r, last] & okB).sum()) / rows,
        "health/mask_missed_first": float((~m[r, first] & okB).sum()) / rows,
        "health/mask_shifted": float((shifted & okB).sum()) / rows,
        "health/mask_uneven": float((uneven & okB).sum()) / rows,
    }


def compute_token_agreement(batch_ids_BT: torch.Tensor, batch_attn_BT: torch.Tensor, sampled_ids_BT: torch.Tensor,
                            sampled_attn_BT: torch.Tensor, sampled_BT: torch.Tensor) -> dict[str, float]:
    """The tokens the loss scores against the tokens the sampler saw and drew (the trainer must
    score the engine's context and tokens, never a re-tokenisation, a remapped copy or an extra
    prefix: 0 in every correct step). `batch_*`: the ids and attention mask of the batch the loss
    sees; `sampled_*`: the trajectories' ids and attention mask as laid out when the batch was
    built; `sampled_BT` [B, T] bool: the positions of sampled tokens in that layout.

    health/token_mismatch_rows  rows whose attended tokens (prompt and response, padding dropped)
                                differ from the sampled row's, whatever the layout (a prefix, a
                                shift, a remap) / rows; a row missing from either side counts
    health/token_mismatch       with the layout kept (same shape): sampled positions whose id
                                differs / sampled positions
    """
    n_b, n_s = int(batch_ids_BT.shape[0]), int(sampled_ids_BT.shape[0])
    if n_s == 0:
        return {}
    b_ids, b_attn, s_ids, s_attn = (x.detach().cpu() for x in (batch_ids_BT, batch_attn_BT, sampled_ids_BT, sampled_attn_BT))
    differ = abs(n_b - n_s)
    for b in range(min(n_b, n_s)):
        row, ref = b_ids[b][b_attn[b].bool()], s_ids[b][s_attn[b].bool()]
        differ += row.shape != ref.shape or not torch.equal(row, ref)
    out = {"health/token_mismatch_rows": differ / max(n_b, n_s)}
    s = sampled_BT.bool().cpu()
    if b_ids.shape == s_ids.shape == s.shape and s.any():
        out["health/token_mismatch"] = float(((b_ids != s_ids) & s).sum()) / float(s.sum())
    return out


# ----------------------------------------------------------------------------- duplicates within a group

UNLIKELY = 0.01  # a group of identical samples is "unlikely" when p^(n-1) < this under independent sampling


def compute_duplicate_stats(groups: Sequence[Any]) -> dict[str, float]:
    """Are a group's samples independent draws? Under independent sampling the chance that the
    other n-1 samples all repeat a completion the sampler drew with probability p is p^(n-1)
    (`action_logprobs` are the sampling distribution's), and the expected number of identical
    pairs is C(n, 2) x E[p] (estimated by the mean p of the group's samples). Single-turn only.

    health/dup_groups_unlikely  groups whose n samples are all identical although p^(n-1) < 0.01
    health/dup_groups_expected  the number of such groups independent sampling would give (sum p^(n-1))
    health/dup_pairs / health/dup_pairs_expected   identical pairs, observed and expected
    """
    unlikely = expected = pairs = pairs_exp = 0.0
    seen = 0
    for g in groups:
        trajs = g.trajectories
        n = len(trajs)
        if n < 2 or any(len(t.turns) != 1 for t in trajs):
            continue
        seen += 1
        probs = [math.exp(min(0.0, sum(t.turns[0].action_logprobs))) for t in trajs]
        counts = Counter(t.response_ids for t in trajs)
        pairs += sum(c * (c - 1) / 2 for c in counts.values())
        pairs_exp += n * (n - 1) / 2 * sum(probs) / n
        chance = [p ** (n - 1) for p in probs]
        expected += sum(c for c in chance if c < UNLIKELY) / n
        if len(counts) == 1 and chance[0] < UNLIKELY:
            unlikely += 1
    if not seen:
        return {}
    return {"health/dup_groups_unlikely": unlikely, "health/dup_groups_expected": expected,
            "health/dup_pairs": pairs, "health/dup_pairs_expected": pairs_exp}


# ----------------------------------------------------------------------------- answer leakage


def _contains(text: str, answer: str) -> bool:
    """`answer` in `text` as a whole token (a number inside a longer number does not count)."""
    return re.search(r"(?<![0-9A-Za-z])" + re.escape(answer) + r"(?![0-9A-Za-z])", text) is not None


def compute_answer_leakage(groups: Sequence[Any], shifts: Sequence[int] = (1, 2, 3)) -> dict[str, float]:
    """Does a prompt carry its own gold answer more often than another problem's? Chance
    containment (a "7" in "7*1=") is measured with the answers of other problems of the step
    (cyclic shifts), so the difference is the leak, whatever the task's notation.

    health/answer_in_prompt         problems whose prompt contains their own answer
    health/answer_in_prompt_chance  the same with another problem's answer (mean over shifts)
    """
    items = [(str(g.task.get("prompt", "")), str(g.task.get("answer", "")).strip()) for g in groups
             if isinstance(getattr(g, "task", None), dict) and g.task.get("answer") is not None]
    items = [(p, a) for p, a in items if a]
    G = len(items)
    if G < 4:
        return {}
    own = sum(_contains(p, a) for p, a in items) / G
    ks = [k for k in shifts if 0 < k < G]
    cross = sum(_contains(items[i][0], items[(i + k) % G][1]) for k in ks for i in range(G)) / (G * len(ks))
    return {"health/answer_in_prompt": own, "health/answer_in_prompt_chance": cross}


def compute_answer_mix(groups: Sequence[Any]) -> dict[str, float]:
    """Is a step's set of problems a sample of the data? Over its distinct problems (by task id):

    health/answer_len_mean       mean characters of their gold answers
    health/answer_distinct_frac  distinct gold answers over distinct problems

    A loader that picks problems by their answer (a length filter on the label column, a file
    sorted by it) moves them; one that copies problems (every rank reading the same shard) does
    not, and neither does a policy that gets worse.
    """
    answers: dict[Any, str] = {}
    for g in groups:
        task = getattr(g, "task", None)
        if isinstance(task, dict) and task.get("answer") is not None:
            answers.setdefault(g.task_id, str(task["answer"]).strip())
    a = [x for x in answers.values() if x]
    if len(a) < 4:
        return {}
    return {"health/answer_len_mean": sum(map(len, a)) / len(a), "health/answer_distinct_frac": len(set(a)) / len(a)}


# ----------------------------------------------------------------------------- reward routing


def compute_reward_routing(groups: Sequence[Any]) -> dict[str, float]:
    """Per sample, does the reward agree with the sample's own verdict, and when a group's
    rewards disagree with its verdicts, are they the group's right rewards on the wrong samples?

    A sample is paid when its reward is above the midpoint of the step's reward range. A reward
    attached to the wrong sample of its group (an index off by one, results gathered in
    completion order) keeps the group's number of paid samples equal to its number of correct
    ones; noise in the reward changes it.

    health/reward_disagree_groups  groups with a sample paid against its verdict / groups with verdicts
    health/reward_routed_frac      of those, the groups paying exactly as many samples as are correct
    """
    ok = [[t for t in g.trajectories if t.reward.outcome == Outcome.OK and t.reward.correct is not None]
          for g in groups]
    rewards = [t.reward.total for ts in ok for t in ts]
    if not rewards or max(rewards) - min(rewards) <= 1e-9:
        return {}
    mid = (max(rewards) + min(rewards)) / 2
    judged = disagree = routed = 0
    for ts in ok:
        if len(ts) < 2:
            continue
        judged += 1
        paid = [t.reward.total > mid for t in ts]
        correct = [bool(t.reward.correct) for t in ts]
        if paid != correct:
            disagree += 1
            routed += sum(paid) == sum(correct)
    if not judged:
        return {}
    return {"health/reward_disagree_groups": disagree / judged,
            "health/reward_routed_frac": routed / disagree if disagree else float("nan")}


def compute_reward_consistency(groups: Sequence[Any]) -> dict[str, float]:
    """Does the reward pay identical responses to one prompt alike? A reward that is a function
    of the prompt and the response (a verifier, a reward model, a rubric) must; a verifier that
    times out under load, a judge sampled at a temperature or a reward with a random term does
    not. Single-turn samples that were scored (outcome OK) only; identical = the same prompt and
    response token ids (a group holding samples of other prompts is a grouping bug, not this).

    health/reward_split_clusters  clusters of >= 2 identical responses of a group whose rewards
                                  differ / such clusters (absent when no group has one)
    health/reward_split_verdicts  the same for their verdicts (`correct`)
    """
    clusters = split = split_verdicts = 0
    for g in groups:
        by: dict[Any, list[Any]] = {}
        for t in g.trajectories:
            if len(t.turns) == 1 and t.reward.outcome == Outcome.OK:
                by.setdefault((t.turns[0].context_ids, t.response_ids), []).append(t.reward)
        for rs in by.values():
            if len(rs) < 2:
                continue
            clusters += 1
            split += max(r.total for r in rs) - min(r.total for r in rs) > 1e-6
            split_verdicts += len({r.correct for r in rs}) > 1
    if not clusters:
        return {}
    return {"health/reward_split_clusters": split / clusters, "health/reward_split_verdicts": split_verdicts / clusters}


# ----------------------------------------------------------------------------- parameters and buffers


def compute_param_norm(model: Any) -> float:
    """The L2 norm of every parameter of `model` (NaN without parameters)."""
    params = [p.detach() for p in model.parameters()] if isinstance(model, torch.nn.Module) else []
    if not params:
        return float("nan")
    with torch.no_grad():
        return float(torch.stack([n.double() for n in torch._foreach_norm(params)]).norm())


__all__ = ["compute_answer_leakage", "compute_answer_mix", "compute_duplicate_stats", "compute_mask_coverage",
           "compute_param_norm", "compute_reward_consistency", "compute_reward_routing", "compute_token_agreement"]
