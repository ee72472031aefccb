"""Health telemetry: per-step signals derived from a step's trajectories, and the run history
that every detector reads (RFT-FM, arXiv 2605.04431: failures are observable from training
dynamics; only the abstract was available, the signal set here is tether's own).

Two sources feed the history, one row per step:
- the recipe's metrics row (reward, accuracy, entropy, grad_norm, logp_gap_*, ...);
- `compute_trajectory_stats(groups)`: signals only the per-trajectory records carry
  (reward/correctness agreement, repetition, output diversity, group integrity, rollout policy
  version, prompt lengths, repeated tasks). They are written into the metrics row under
  `health/*`, so `tether doctor` can replay the detectors from `metrics.jsonl` alone.

Everything here is O(number of tokens of the step) in plain Python: well under 1% of a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from tether.types import Outcome, TrajectoryGroup

# ----------------------------------------------------------------------------- per-step signals


def _repetition(ids: Sequence[int], n: int = 2) -> float:
    """1 - distinct n-grams / n-grams of one response (0 for responses shorter than 2n)."""
    if len(ids) < 2 * n:
        return 0.0
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def _reward_correct_auc(groups: Sequence[TrajectoryGroup]) -> tuple[float, int]:
    """P(reward(correct) > reward(incorrect)) over (correct, incorrect) pairs of one group.

    ~1 when the reward ranks verified-correct samples first; falls when the reward is noisy or
    pays for something other than correctness. Ties count 1/2. Returns (auc, number of pairs)."""
    wins, pairs = 0.0, 0
    for g in groups:
        ok = [t for t in g.trajectories if t.reward.outcome == Outcome.OK and t.reward.correct is not None]
        good = [t.reward.total for t in ok if t.reward.correct]
        bad = [t.reward.total for t in ok if not t.reward.correct]
        for r1 in good:
            for r0 in bad:
                wins += 1.0 if r1 > r0 else 0.5 if r1 == r0 else 0.0
        pairs += len(good) * len(bad)
    return (wins / pairs if pairs else float("nan")), pairs


def compute_trajectory_stats(groups: Sequence[TrajectoryGroup], prev_task_ids: Iterable[str] = ()) -> dict[str, float]:
    """Signals of one step's rollouts that the per-step metrics do not carry (`health/*` keys).

    health/reward_correct_auc      reward ranks correct above incorrect (NaN: no mixed group)
    health/reward_incorrect_mean   mean reward of verified-incorrect samples (NaN: none)
    health/reward_correct_mean     mean reward of verified-correct samples (NaN: none)
    health/repetition              mean bigram repetition of responses
    health/distinct_frac           distinct responses / responses, averaged over groups
    health/empty_frac              responses with no token before the stop token
    health/all_wrong_groups        groups where no sample is verified correct
    health/group_mixed_frac        groups whose samples saw different prompts (grouping bug)
    health/rollout_version_min     oldest policy version that sampled this step's tokens
    health/prompt_len_mean         prompt tokens per problem
    health/task_repeat_frac        tasks of this step that were also in the previous step
    health/dup_task_frac           groups whose task id already appeared in this step
    health/group_size_min / _max   samples per group (every group holds rollout.n)
    health/max_turns               most turns of one trajectory (1: single-turn)
    health/action_tokens(_ok)      sampled tokens (of samples scored ok): the loss mask covers
                                   all of them, or (reward.on_error=mask) those of ok samples
    health/samples                 samples with a verdict (the accuracy's sample size)
    health/accuracy_se             standard error of the step's accuracy, problems as sampling units
    health/reward_correct_pairs    (correct, incorrect) pairs behind reward_correct_auc
    health/reward_corr_own         correlation of each sample's reward with its own verdict
    health/reward_corr_shift       the same with a neighbour's verdict (best of shifts +-1, +-n):
                                   high only when rewards are attached to the wrong samples
    health/reward_agreement/<c>    each reward component's AUC against the verdicts on this step's
                                   rollouts (tether.health.detectors_learned), and the pair count
    health/dup_*, health/answer_in_prompt*, health/answer_len_mean, health/answer_distinct_frac,
    health/reward_disagree_groups, health/reward_routed_frac,
    health/reward_split_*:         independent sampling, answer leakage, reward routing and identical
                                   responses paid alike (tether.health.invariants)
    """
    trajs = [t for g in groups for t in g.trajectories]
    out: dict[str, float] = {}
    auc, pairs = _reward_correct_auc(groups)
    out["health/reward_correct_auc"] = auc
    out["health/reward_correct_pairs"] = float(pairs)
    for key, verdict in (("health/reward_incorrect_mean", False), ("health/reward_correct_mean", True)):
        xs = [t.reward.total for t in trajs if t.reward.outcome == Outcome.OK and t.reward.correct is verdict]
        out[key] = sum(xs) / len(xs) if xs else float("nan")
    out["health/repetition"] = sum(_repetition(t.response_ids) for t in trajs) / max(len(trajs), 1)
    distinct, mixed, all_wrong, plens, group_acc = [], 0, 0, [], []
    for g in groups:
        if not g.trajectories:
            continue
        distinct.append(len({t.response_ids for t in g.trajectories}) / len(g.trajectories))
        ctx = g.trajectories[0].turns[0].context_ids if g.trajectories[0].turns else ()
        mixed += any((t.turns[0].context_ids if t.turns else ()) != ctx for t in g.trajectories)
        verdicts = [t.reward.correct for t in g.trajectories if t.reward.correct is not None]
        all_wrong += bool(verdicts) and not any(verdicts)
        if verdicts:
            group_acc.append(sum(map(bool, verdicts)) / len(verdicts))
        plens.append(len(ctx))
    n_groups = max(len(distinct), 1)
    out["health/distinct_frac"] = sum(distinct) / n_groups
    out["health/group_mixed_frac"] = mixed / n_groups
    out["health/all_wrong_groups"] = all_wrong / n_groups
    out["health/prompt_len_mean"] = sum(plens) / n_groups
    out["health/accuracy_se"] = _cluster_se(group_acc)
    out["health/empty_frac"] = sum(t.num_action_tokens <= 1 and not t.stop.truncated for t in trajs) / max(len(trajs), 1)
    versions = [turn.policy_version for t in trajs for turn in t.turns]
    out["health/rollout_version_min"] = float(min(versions)) if versions else float("nan")
    prev = set(prev_task_ids)
    ids = [g.task_id for g in groups]
    out["health/task_repeat_frac"] = sum(i in prev for i in ids) / max(len(ids), 1) if prev else float("nan")
    out["health/dup_task_frac"] = (len(ids) - len(set(ids))) / max(len(ids), 1)
    sizes = [len(g.trajectories) for g in groups] or [math.nan]
    out["health/group_size_min"], out["health/group_size_max"] = float(min(sizes)), float(max(sizes))
    out["health/max_turns"] = float(max((len(t.turns) for t in trajs), default=0))
    out["health/action_tokens"] = float(sum(t.num_action_tokens for t in trajs))
    out["health/action_tokens_ok"] = float(sum(t.num_action_tokens for t in trajs if t.reward.outcome == Outcome.OK))
    out.update(_reward_linkage(trajs, len(groups[0].trajectories) if groups else 1))
    out.update(_invariant_stats(groups))
    return out


def _invariant_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """The reward components' agreement with the verdicts and the invariants of a step's groups
    (tether.health.invariants): independent sampling, answer leakage, reward routing, identical
    responses paid alike."""
    from tether.health.detectors_learned import compute_component_agreement
    from tether.health.invariants import (compute_answer_leakage, compute_answer_mix, compute_duplicate_stats,
                                          compute_reward_consistency, compute_reward_routing)

    out = compute_component_agreement(groups)  # health/reward_agreement/<component>
    for compute in (compute_duplicate_stats, compute_answer_leakage, compute_answer_mix, compute_reward_routing,
                    compute_reward_consistency):
        out.update(compute(groups))
    return out


def _cluster_se(acc_G: Sequence[float]) -> float:
    """Standard error of a step's accuracy with problems as the sampling units (samples of one
    problem are correlated, so the binomial SE over samples would be too small)."""
    G = len(acc_G)
    if G < 2:
        return float("nan")
    m = sum(acc_G) / G
    return math.sqrt(sum((a - m) ** 2 for a in acc_G) / (G - 1) / G)


def _corr(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    if n < 3:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 1e-12 and syy > 1e-12 else float("nan")


def _reward_linkage(trajs: Sequence[Any], n: int) -> dict[str, float]:
    """Does each reward belong to its own sample? Correlation of reward with the sample's verdict
    vs with a neighbour's (shifts +-1, +-n in rollout order): a reward record attached to the
    wrong sample (an off-by-one in the reward's index, verl PR#6310) tracks the neighbour."""
    ok = [t for t in trajs if t.reward.outcome == Outcome.OK and t.reward.correct is not None]
    r = [float(t.reward.total) for t in ok]
    c = [1.0 if t.reward.correct else 0.0 for t in ok]
    own = _corr(r, c)
    shifted = [_corr(r[k:], c[:-k]) for k in {1, n} if 0 < k < len(r) - 2]
    shifted += [_corr(r[:-k], c[k:]) for k in {1, n} if 0 < k < len(r) - 2]
    shifted = [x for x in shifted if math.isfinite(x)]
    return {"health/samples": float(len(ok)), "health/reward_corr_own": own,
            "health/reward_corr_shift": max(shifted) if shifted else float("nan")}


def compute_advantage_alignment(adv_BT: torch.Tensor, scores_B: torch.Tensor, mask_BT: torch.Tensor, group_B: torch.Tensor) -> dict[str, float]:
    """`advantage/score_corr`: the Pearson correlation, within each group, between the mean
    advantage of a sequence and its score, averaged over the groups with score variance.

    Within a group every group-relative estimator (GRPO, Dr. GRPO, RLOO, ...) is an increasing
    affine map of the score, so a correct one gives 1 whatever the reward's scale; a sign bug gives
    -1, an indexing or grouping bug ~0. (Pooled over the batch, the correlation also depends on
    each group's normalisation: GRPO's division by the group std blows a continuous reward's tiny
    spread in one group up to unit advantages, which pulled a healthy pooled value down to 0.66
    under a small length bonus - faultbench reward_hack_bonus/subtle s2, read as an advantage bug.)
    NaN when no group has score variance, or every advantage is 0.
    """
    with torch.no_grad():
        m = mask_BT.float()
        n = m.sum(-1)
        keep = n > 0
        if not bool(keep.any()):
            return {"advantage/score_corr": float("nan")}
        a = (adv_BT.float() * m).sum(-1)[keep] / n[keep]
        s, g = scores_B.float()[keep], group_B[keep]
        out = compute_group_advantage_stats(a, s, g)
        a, s = a.double(), s.double()
        G = int(g.max()) + 1
        cnt = torch.zeros(G, dtype=torch.float64).index_add_(0, g, torch.ones_like(s)).clamp(min=1)
        da = a - (torch.zeros(G, dtype=torch.float64).index_add_(0, g, a) / cnt)[g]
        ds = s - (torch.zeros(G, dtype=torch.float64).index_add_(0, g, s) / cnt)[g]
        num, va, vs = (torch.zeros(G, dtype=torch.float64).index_add_(0, g, x) for x in (da * ds, da * da, ds * ds))
        ok = vs > 1e-12
        if not bool(ok.any()) or float(a.abs().sum()) == 0.0:
            out["advantage/score_corr"] = float("nan")
            return out
        corr = num[ok] / (va[ok] * vs[ok]).sqrt().clamp(min=1e-300)  # a group with flat advantages: 0
        out["advantage/score_corr"] = float(corr.mean())
        return out


def compute_group_advantage_stats(a_B: torch.Tensor, s_B: torch.Tensor, g_B: torch.Tensor) -> dict[str, float]:
    """Within-group structure of the per-sequence advantages `a_B` (scores `s_B`, groups `g_B`):

    advantage/group_mean_max   max over groups of |mean advantage| (0 for group-relative estimators)
    advantage/abs_max          max |advantage| of a sequence
    advantage/range_ratio_max  max over groups of max|A| / (score range of the group): <= 1 for
                               mean-centred estimators (Dr. GRPO), n/(n-1) for RLOO
    advantage/group_n_max      most sequences of one group
    """
    G = int(g_B.max()) + 1
    a, s = a_B.double(), s_B.double()
    cnt = torch.zeros(G, dtype=torch.float64).index_add_(0, g_B, torch.ones_like(a))
    mean_G = torch.zeros(G, dtype=torch.float64).index_add_(0, g_B, a) / cnt.clamp(min=1)
    amax_G = torch.zeros(G, dtype=torch.float64).scatter_reduce_(0, g_B, a.abs(), "amax")
    smax_G = torch.full((G,), -math.inf, dtype=torch.float64).scatter_reduce_(0, g_B, s, "amax")
    smin_G = torch.full((G,), math.inf, dtype=torch.float64).scatter_reduce_(0, g_B, s, "amin")
    present = cnt > 0
    rng_G = (smax_G - smin_G)[present]
    ratio = amax_G[present][rng_G > 1e-9] / rng_G[rng_G > 1e-9]
    return {"advantage/group_mean_max": float(mean_G[present].abs().max()),
            "advantage/abs_max": float(a.abs().max()),
            "advantage/range_ratio_max": float(ratio.max()) if ratio.numel() else 0.0,
            "advantage/group_n_max": float(cnt.max())}


def compute_weights_fingerprint(model: Any, per_tensor: int = 4096) -> float:
    """A cheap identity of a model's weights: a weighted float64 sum over every parameter tensor
    of a strided sample of at most ~`per_tensor` of its elements. An optimizer step changes every
    sampled element, so a tensor that missed a sync changes the value; equal weights give the
    same value bit for bit (the same reductions over the same elements)."""
    return compute_fingerprint_of_sums(compute_weight_sums(model, per_tensor))


def compute_buffers_fingerprint(model: Any, per_tensor: int = 4096) -> float:
    """The same identity over a model's floating-point buffers (non-parameter state: rotary
    frequency tables, running statistics): a sampler whose buffers differ from the trainer's
    passes the parameter checksum. NaN for a model without floating buffers."""
    bufs = [b for b in model.buffers() if b.is_floating_point()] if isinstance(model, torch.nn.Module) else []
    return _fingerprint(bufs, per_tensor)


def compute_weight_sums(model: Any, per_tensor: int = 4096) -> torch.Tensor | None:
    """The per-tensor parts of `compute_weights_fingerprint` (float64, on the CPU, one per parameter
    tensor in order): which tensors of a sampler match which version of the trainer's."""
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    return _tensor_sums(params, per_tensor).cpu() if params else None


def compute_fingerprint_of_sums(sums: torch.Tensor | None) -> float:
    """The fingerprint (`compute_weights_fingerprint`) of per-tensor sums."""
    if sums is None or sums.numel() == 0:
        return float("nan")
    w = torch.arange(1, len(sums) + 1, dtype=torch.float64, device=sums.device)
    return float((sums * (1 + w / len(sums))).sum())


def compute_sums_match(sums: torch.Tensor, versions: dict[int, torch.Tensor]) -> dict[str, float]:
    """Which of a sampler's weight tensors (per-tensor sums) equal the trainer's tensor at some
    recorded version (`versions`: version -> per-tensor sums; a comparison is O(versions x tensors)): `health/weights_foreign_frac` is the share that matches none (a sync that
    converts, reorders or corrupts tensors), the rest being current or older versions' (a stale or
    partial sync). A sampler holding another number of weight tensors than every recorded version
    (a tensor added to or left out of the engine's copy: a bias on its output head, a dropped
    layer) is no version of the trainer's at all: each of its tensors is looked up among every
    version's tensors wherever they sit, and the share is at least the count difference over the
    larger count. Empty when no version is recorded."""
    tol = 1e-9 * sums.abs().clamp(min=1.0)
    refs = [v for v in versions.values() if v.shape == sums.shape]
    if not refs:
        others = [v for v in versions.values() if v.numel()]
        if not others or not sums.numel():
            return {}
        pool = torch.cat(others).sort().values
        i = torch.searchsorted(pool, sums).clamp(max=len(pool) - 1)
        near = torch.minimum((pool[i] - sums).abs(), (pool[(i - 1).clamp(min=0)] - sums).abs())
        n = max(len(sums), max(len(v) for v in others))
        missing = min(abs(len(sums) - len(v)) for v in others) / n
        return {"health/weights_foreign_frac": max(float((near > tol).double().mean()), missing)}
    seen = torch.zeros_like(sums, dtype=torch.bool)
    for ref in refs:
        seen |= (sums - ref).abs() <= tol
    return {"health/weights_foreign_frac": float((~seen).double().mean())}


def _tensor_sums(tensors: list[torch.Tensor], per_tensor: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([p.detach().reshape(-1)[:: max(1, p.numel() // per_tensor)].double().sum() for p in tensors])


def _fingerprint(tensors: list[torch.Tensor], per_tensor: int) -> float:
    if not tensors:
        return float("nan")
    return compute_fingerprint_of_sums(_tensor_sums(tensors, per_tensor))


# ----------------------------------------------------------------------------- history


def finite(x: Any) -> float | None:
    """x as a float when it is a finite number, else None (None, NaN, inf, strings)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    k = len(s) // 2
    return s[k] if len(s) % 2 else 0.5 * (s[k - 1] + s[k])


@dataclass(frozen=True)
class Baseline:
    """Robust location/scale of one signal over the baseline window.

    `scale` is 1.4826 x MAD (the std for Gaussian data), floored at `rel_floor x |median|` and
    `abs_floor` so that a flat baseline (MAD 0) does not make every wiggle infinitely surprising.
    """

    median: float
    scale: float
    mean: float
    std: float
    lo: float
    hi: float
    n: int

    def z(self, x: float) -> float:
        return (x - self.median) / self.scale


def compute_baseline(xs: Sequence[float], rel_floor: float = 0.05, abs_floor: float = 1e-6) -> Baseline | None:
    if not xs:
        return None
    med = _median(xs)
    mad = _median([abs(x - med) for x in xs])
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(len(xs) - 1, 1))
    scale = max(1.4826 * mad, rel_floor * abs(med), abs_floor)
    return Baseline(med, scale, mean, std, min(xs), max(xs), len(xs))


class History:
    """The rows a run has produced, by step, plus each signal's baseline window.

    The baseline window is the first `window` rows after `skip` warm-up rows (rows the monitor
    marked unhealthy never enter it). It is frozen once full, and re-anchored every `rebase_every`
    steps to the most recent `window` healthy rows at least `lag` steps old, so that slow healthy
    drift (entropy falling while accuracy rises) does not become an alarm over long runs, while an
    abrupt fault is compared with what came before it.
    """

    def __init__(self, skip: int = 1, window: int = 8, rebase_every: int = 50, lag: int = 20) -> None:
        self.skip, self.window, self.rebase_every, self.lag = skip, window, rebase_every, lag
        self.rows: list[dict[str, Any]] = []
        self.excluded: set[int] = set()  # steps kept out of the baseline (unhealthy or rolled back)
        self.discarded: set[int] = set()  # steps undone by a rollback: out of every window
        self._base_steps: list[int] = []
        self._cache: dict[str, Baseline | None] = {}
        self._last_rebase = 0

    def add(self, step: int, row: Mapping[str, Any]) -> None:
        self.rows.append({"step": step, **row})
        if len(self._base_steps) < self.window and len(self.rows) > self.skip and step not in self.excluded:
            self._base_steps.append(step)
            self._cache.clear()
        elif self.rebase_every and step - self._last_rebase >= self.rebase_every and self.ready:
            self._rebase(step)

    def _rebase(self, step: int) -> None:
        eligible = self.rows[self.skip:]  # never the warm-up rows
        old = [r["step"] for r in eligible if r["step"] <= step - self.lag and r["step"] not in self.excluded]
        if len(old) >= self.window:
            self._base_steps = old[-self.window:]
            self._cache.clear()
        self._last_rebase = step

    def discard(self, steps: Iterable[int]) -> None:
        """Steps a rollback undid: they leave the baseline and the recent windows."""
        steps = set(steps)
        self.discarded.update(steps)
        self.exclude(steps)

    def exclude(self, steps: Iterable[int]) -> None:
        """Steps kept out of the baseline window (a detector fired on them)."""
        self.excluded.update(steps)
        before = len(self._base_steps)
        self._base_steps = [s for s in self._base_steps if s not in self.excluded]
        if len(self._base_steps) != before:
            self._cache.clear()

    @property
    def ready(self) -> bool:
        """True once the baseline window is full."""
        return len(self._base_steps) >= self.window

    @property
    def last_step(self) -> int:
        return int(self.rows[-1]["step"]) if self.rows else 0

    @property
    def baseline_steps(self) -> list[int]:
        return list(self._base_steps)

    def baseline(self, key: str, rel_floor: float = 0.05, abs_floor: float = 1e-6) -> Baseline | None:
        ck = f"{key}|{rel_floor}|{abs_floor}"
        if ck not in self._cache:
            steps = set(self._base_steps)
            xs = [v for r in self.rows if r["step"] in steps and (v := finite(r.get(key))) is not None]
            self._cache[ck] = compute_baseline(xs, rel_floor, abs_floor) if len(xs) >= max(3, self.window // 2) else None
        return self._cache[ck]

    def values(self, key: str, k: int) -> list[float]:
        """The last `k` finite values of `key` among rows not discarded (oldest first)."""
        out: list[float] = []
        for r in reversed(self.rows):
            if len(out) >= k:
                break
            if r["step"] in self.discarded:
                continue
            v = finite(r.get(key))
            if v is not None:
                out.append(v)
        return out[::-1]

    def latest(self, key: str) -> Any:
        return self.rows[-1].get(key) if self.rows else None

    def previous(self, key: str) -> float | None:
        """The finite value of `key` in the row before the latest (None when absent)."""
        return finite(self.rows[-2].get(key)) if len(self.rows) >= 2 else None


def load_history(history: History, rows: Iterable[Mapping[str, Any]], upto: int) -> None:
    """Re-read a run's metrics rows (steps 1..`upto`, the rows of one step merged) into `history`: a resumed
    run whose checkpoint holds no monitor state continues from what it logged."""
    by_step: dict[int, dict] = {}
    for row in rows:
        if isinstance(row.get("step"), int) and 0 < row["step"] <= upto:
            by_step.setdefault(row["step"], {}).update(row)
    for s in sorted(by_step):
        history.add(s, by_step[s])
