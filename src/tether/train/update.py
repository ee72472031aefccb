"""One policy update: M epochs x mini-batches x micro-batches over a TrainBatch.

Shared by every RL recipe. The loss of a micro-batch is composed here from the registered
pieces (policy loss, KL, entropy, value loss) and normalised by `agg_loss` with the GLOBAL
denominators of its mini-batch, so gradient accumulation never changes the gradient.

Numerics (pitfall 5): a non-finite loss or gradient skips the optimizer step, an update that leaves a
non-finite weight is undone; both are counted;
`max_bad_steps` in a row raise `TrainingHalted` (the guarded step: tether.train.step).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from tether.algos import (
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AggNorm,
    ISInputs,
    KLInputs,
    PolicyLossInputs,
    agg_loss,
    compute_agg_norm,
    compute_mismatch_metrics,
    compute_off_policy_mask,
    compute_value_loss,
)
from tether.train.batching import split_by_token_budget
from tether.algos.config import AlgoConfig
from tether.policy.config import SamplingConfig
from tether.train.config import TrainConfig
from tether.health.faults import NO_FAULTS
from tether.phase import marks_phase
from tether.policy.hf import HFPolicy, ValueModel
from tether.policy.lora import adapters_disabled
from tether.policy.prefix import compute_sequence_logprobs
from tether.train.probes import (NormCheck, PreSamplerKL, choose_probe_rows, compute_cosine, compute_grad_sketch,
                                 compute_hparams, compute_logp_progress, compute_logp_shift, compute_moment_change, compute_moment_sketch,
                                 fill_probe_rows, probe_size)
from tether.train.step import TrainingHalted, UpdateState, do_guarded_step
from tether.types import TrainBatch


# Loss terms are already divided by the mini-batch's global denominators: micro-batch values add
# up to the mini-batch value (then average over optimizer steps). Other metrics are token-weighted.
SUMMED_METRICS = frozenset({"pg_loss", "entropy", "kl_loss", "value_loss"})


@dataclass
class _Acc:
    """Accumulation of micro-batch metrics into per-update metrics."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    n_minibatches: int = 0

    def add(self, metrics: dict[str, torch.Tensor | float], weight: float) -> None:
        for k, v in metrics.items():
            x = float(v)
            if k in SUMMED_METRICS:
                self.losses[k] = self.losses.get(k, 0.0) + x
            elif k.endswith("_max"):
                self.maxes[k] = max(self.maxes.get(k, float("-inf")), x)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + x * weight
                self.weights[k] = self.weights.get(k, 0.0) + weight

    def end_minibatch(self) -> None:
        self.n_minibatches += 1

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out.update(self.maxes)
        out.update({k: v / max(self.n_minibatches, 1) for k, v in self.losses.items()})
        return out


def compute_microbatch_loss(
    policy: HFPolicy,
    mb: TrainBatch,
    norm: AggNorm,
    algo: AlgoConfig,
    temperature: float,
    kl_coef: float,
    old_logp_BT: torch.Tensor | None,
    ref_logp_BT: torch.Tensor | None,
    critic: ValueModel | None = None,
    pack: bool = False,
    share: str = "off",
    inert: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The scalar loss of one micro-batch (already divided by the mini-batch's global norm).
    `inert` ([B] bool, `inert_mask`): rows run without gradients (the loss's gradient is the same)."""
    terms, metrics = compute_loss_terms(policy, mb, norm, algo, temperature,
                                        LossInputs(old_logp_BT, ref_logp_BT, critic, pack, share, inert))
    return compose_loss(terms, algo, kl_coef), metrics


def compose_loss(terms: dict[str, torch.Tensor], algo: AlgoConfig, kl_coef: float) -> torch.Tensor:
    """pg - entropy_coef x entropy + kl_coef x kl + value_coef x value (terms already aggregated)."""
    loss = terms["pg"] - algo.entropy_coef * terms["entropy"]
    if "kl" in terms:
        loss = loss + kl_coef * terms["kl"]
    if "value" in terms:
        loss = loss + algo.value.coef * terms["value"]
    return loss


@dataclass(frozen=True)
class LossInputs:
    """What one micro-batch's loss reads besides the batch itself: pi_old's and the reference's
    log-probs ([B, T] or None), the critic, the scoring options of `compute_batch_logprobs` and the
    `inert` rows ([B] bool, `inert_mask`: run without gradients)."""

    old_logp_BT: torch.Tensor | None
    ref_logp_BT: torch.Tensor | None
    critic: ValueModel | None = None
    pack: bool = False
    share: str = "off"
    inert: torch.Tensor | None = None
    logp_sink: list | None = None  # receives the forward's log-probs (detached): the probe's "before" in fused mode


def compute_loss_terms(policy: HFPolicy, mb: TrainBatch, norm: AggNorm, algo: AlgoConfig, temperature: float,
                       inp: LossInputs) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The aggregated loss terms of one micro-batch (`pg`, `entropy`, and `kl`, `value` when
    present) and its metrics; `compose_loss` adds them up (a fault seam sits in between)."""
    old_logp_BT, ref_logp_BT, critic = inp.old_logp_BT, inp.ref_logp_BT, inp.critic
    logp, ent = _score(policy, mb, temperature, inp.pack, inp.share, inp.inert)
    if inp.logp_sink is not None:
        inp.logp_sink.append(logp.detach())
    mask = mb.loss_mask_BT.to(logp.device)
    # Fused mode: with one pass and one mini-batch, pi_old is exactly the policy of this forward.
    old = logp.detach() if old_logp_BT is None else old_logp_BT.to(logp.device)
    rollout = mb.rollout_logp_BT.to(logp.device)
    adv = mb.advantages_BT.to(logp.device)
    metrics: dict[str, torch.Tensor] = {}
    metrics.update(compute_mismatch_metrics(old, rollout, mask))
    metrics.update(compute_logp_shift(old, rollout, mask))  # where a gap sits (tether.health's logp checks)
    if algo.correction.off_policy_mask_delta is not None:
        opm = compute_off_policy_mask(rollout, logp.detach(), adv, mask, algo.correction.off_policy_mask_delta)
        metrics["off_policy_mask_frac"] = 1.0 - (opm * mask).sum() / mask.sum().clamp(min=1)
        mask = mask * opm
    is_w, is_metrics = IS_CORRECTIONS[algo.correction.mode](ISInputs(old, rollout, mask), algo.correction)
    metrics.update(is_metrics)
    pg_BT, pg_metrics = POLICY_LOSSES[algo.policy_loss.name](PolicyLossInputs(logp, old, adv, mask), algo.policy_loss)
    metrics.update(pg_metrics)
    mode = algo.agg.mode
    pg = agg_loss(pg_BT * is_w, mask, mode, norm)
    # no entropy bonus: the entropy is a metric only, and its backward (a softmax over the vocabulary) is skipped
    entropy = agg_loss(ent if algo.entropy_coef else ent.detach(), mask, mode, norm)
    terms = {"pg": pg, "entropy": entropy}
    metrics["pg_loss"], metrics["entropy"] = pg.detach(), entropy.detach()
    if ref_logp_BT is not None and algo.kl.placement == "loss":
        kl_BT = KL_ESTIMATORS[algo.kl.estimator](KLInputs(logp, ref_logp_BT.to(logp.device), old, mask), algo.kl)
        terms["kl"] = agg_loss(kl_BT, mask, mode, norm)
        metrics["kl_loss"] = terms["kl"].detach()
    if critic is not None and mb.returns_BT is not None:
        values = critic(mb.input_ids_BT.to(logp.device), mb.attention_mask_BT.to(logp.device))
        old_v = mb.old_values_BT if mb.old_values_BT is not None else values.detach()
        v_BT = compute_value_loss(values, old_v.to(logp.device), mb.returns_BT.to(logp.device), mask, algo.value.clip)
        terms["value"] = agg_loss(v_BT, mask, mode, norm)
        metrics["value_loss"] = terms["value"].detach()
    return terms, metrics


def can_skip_inert(ctx: "UpdateContext", kl_in_loss: bool) -> bool:
    """Whether this update may run zero-advantage sequences without gradients: `train.skip_zero_advantage`,
    a policy loss that vanishes at A = 0 (PolicyLossFacts) and no other loss term of the policy (entropy bonus, KL in
    the loss); not under FSDP2's sharded call (one backbone pass per call there)."""
    algo = ctx.algo
    return (ctx.train.skip_zero_advantage and POLICY_LOSSES.facts(algo.policy_loss.name).zero_at_zero_advantage
            and not algo.entropy_coef and not kl_in_loss
            and getattr(ctx.policy.model, "tether_sharded_call", None) is None)


def inert_mask(mb: TrainBatch) -> torch.Tensor:
    """[B] bool: sequences whose every advantage under the loss mask is exactly 0 (a GRPO group with
    equal rewards)."""
    return ((mb.advantages_BT == 0) | (mb.loss_mask_BT <= 0)).all(-1)


def _score(policy: HFPolicy, mb: TrainBatch, temperature: float, pack: bool, share: str,
           inert: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropies) [B, T] of `mb`; the `inert` rows in a forward without gradients (their
    loss has none): the saving is their backward and the activations kept for it."""
    def run(sub: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return compute_sequence_logprobs(policy, sub.input_ids_BT, sub.attention_mask_BT, sub.seq_group_B, temperature,
                                         with_entropy=True, pack=pack, share=share, kept_BT=sub.kept_BT,
                                         needed_BT=sub.loss_mask_BT > 0)

    if inert is None or not bool(inert.any()):
        return run(mb)
    live, dead = (~inert).nonzero().squeeze(-1), inert.nonzero().squeeze(-1)
    with torch.no_grad():
        lp_dead, ent_dead = run(mb.select(dead))
    if len(live) == 0:
        return lp_dead, ent_dead
    lp_live, ent_live = run(mb.select(live))
    order = torch.cat([live, dead]).argsort().to(lp_live.device)
    return torch.cat([lp_live, lp_dead])[order], torch.cat([ent_live, ent_dead])[order]


@marks_phase("scoring")
@torch.no_grad()
def compute_batch_logprobs(policy: HFPolicy, batch: TrainBatch, temperature: float, token_budget: int, pack: bool = False,
                           share: str = "off") -> torch.Tensor:
    """log-probs of every sequence of `batch` (no grad), micro-batched by a token budget."""
    out = torch.zeros_like(batch.rollout_logp_BT)
    lengths = batch.attention_mask_BT.sum(-1).tolist()
    for idx in split_by_token_budget(lengths, token_budget):
        rows = torch.tensor(idx)
        mb = batch.select(rows)
        T = int(mb.attention_mask_BT.sum(-1).max())
        kept = None if mb.kept_BT is None else mb.kept_BT[:, :T]
        with adapters_disabled(policy.model) if policy.base_only else nullcontext():  # LoRA: the reference is the base
            lp, _ = compute_sequence_logprobs(policy, mb.input_ids_BT[:, :T], mb.attention_mask_BT[:, :T],
                                              mb.seq_group_B, temperature, pack=pack, share=share, kept_BT=kept,
                                              needed_BT=mb.loss_mask_BT[:, :T] > 0)
        out[rows, :T] = lp.float().cpu()
    return out


def _trim(mb: TrainBatch) -> TrainBatch:
    """Drop all-padding columns on the right (micro-batches of short rows stay short)."""
    T = int(mb.attention_mask_BT.sum(-1).max())
    return TrainBatch(*(None if x is None else x[:, :T] if x.dim() == 2 else x for x in (
        mb.input_ids_BT, mb.attention_mask_BT, mb.loss_mask_BT, mb.rollout_logp_BT, mb.advantages_BT,
        mb.seq_group_B, mb.seq_traj_B, mb.returns_BT, mb.old_values_BT, mb.kept_BT)))


@dataclass
class UpdateContext:
    """Everything one update reads besides the batch (the recipe builds it once per step).

    `dp` (tether.dist.trainer.DataParallel): data-parallel ranks receive the batch from rank 0, run
    disjoint micro-batches and sum gradients — exact, because losses use global denominators.
    `max_len`: the constant of constant_norm aggregation (Dr. GRPO). `faults`: the fault seams of
    `tether.health.faults` (None: none). `probes`: run the health layer's self-checks
    (`tether.train.probes`; off with `health.mode=off` and under data parallelism)."""

    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    algo: AlgoConfig
    train: TrainConfig
    temperature: float = 1.0
    state: UpdateState = field(default_factory=UpdateState)
    scheduler: Any = None
    ref_policy: HFPolicy | None = None
    critic: ValueModel | None = None
    generator: torch.Generator | None = None
    max_len: int | None = None
    dp: Any = None
    faults: Any = None
    probes: bool = False

    @classmethod
    def from_run(cls, st: Any, algo: AlgoConfig, train: TrainConfig, sampling: SamplingConfig,
                 dp: Any = None) -> "UpdateContext":
        """From a recipe's state (policy, optimizer, scheduler, update, ref, critic, generator, fault
        seams, health monitor; an RLState) and the config sections in force. The probes run when the
        run's health monitor is on (`health.mode` advise or auto) and no data-parallel group shards the update."""
        policy = getattr(dp, "train_policy", None) or st.policy  # FSDP2 rank 0: the sharded twin (tether.dist.fsdp)
        faults = getattr(st, "faults", None) or NO_FAULTS
        probes = getattr(getattr(st, "health", None), "mode", "off") != "off" and dp is None
        return cls(policy, st.optimizer, algo, train, sampling.temperature, st.update, st.scheduler,
                   faults.on_reference(st.ref), st.critic, st.generator, algo.agg.max_len or sampling.max_new_tokens, dp,
                   faults, probes)


@dataclass
class _Pass:
    """What one update pass shares across its mini-batches (built by `run_update`)."""

    old_all: torch.Tensor | None
    ref_all: torch.Tensor | None
    skip: bool
    acc: _Acc
    norms: NormCheck | None
    stats: dict[str, list[float]] | None
    first: bool = True  # the next mini-batch is the update's first: no optimizer step yet
    pre_kl: float = float("nan")  # approx_kl of the first mini-batch (`update/kl_pre`)
    pre_sampler: PreSamplerKL = field(default_factory=lambda: PreSamplerKL())  # `update/kl_pre_sampler`
    probe: tuple[torch.Tensor, torch.Tensor] | None = None  # fused: (probe rows, their log-probs, filled by the forward)


def run_update(ctx: UpdateContext, batch: TrainBatch | None) -> dict[str, float]:
    """M epochs over `batch`, `algo.mini_batches` optimizer steps per epoch. Returns metrics.
    (`batch` is None on data-parallel ranks > 0: rank 0 sends it.)"""
    policy, optimizer, algo, train, dp = ctx.policy, ctx.optimizer, ctx.algo, ctx.train, ctx.dp
    faults = ctx.faults or NO_FAULTS
    if dp is not None:
        batch = dp.begin(batch, ctx.generator, ctx.state)
    # a fault on pi_old needs pi_old scored: with one pass and one mini-batch it is the training forward itself
    fused = algo.epochs == 1 and algo.mini_batches == 1 and not faults.wants("on_old_logp")
    pack, share = train.pack_sequences, train.share_prefix
    old_all = None if fused else faults.on_old_logp(compute_batch_logprobs(policy, batch, ctx.temperature,
                                                                          train.micro_batch_tokens, pack, share), batch)
    with_ref = ctx.ref_policy is not None and ctx.state.kl_coef > 0 and algo.kl.placement == "loss"
    ref_all = compute_batch_logprobs(ctx.ref_policy, batch, ctx.temperature, train.micro_batch_tokens, pack,
                                     share) if with_ref else None
    t_probe = time.perf_counter()
    probe = _probe_before(ctx, batch, old_all) if ctx.probes else None
    t_probe = time.perf_counter() - t_probe
    ps = _Pass(old_all, ref_all, can_skip_inert(ctx, ref_all is not None), _Acc(),
               NormCheck(algo.agg.mode, ctx.max_len) if ctx.probes else None, {} if ctx.probes else None,
               probe=probe if probe is not None and old_all is None else None)
    positions0 = policy.trained_positions
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norms: list[float] = []
    for _ in range(algo.epochs):
        perm = torch.randperm(batch.num_seqs, generator=ctx.generator)
        for mini_idx in perm.chunk(algo.mini_batches):
            _run_minibatch(ctx, batch, mini_idx, ps, params)
            faults.before_optimizer_step(optimizer, ctx.scheduler, params)
            if ps.stats is not None:
                _note_optimizer_state(optimizer, ctx.state, ps.stats)
            grad_norms.append(_step(optimizer, ctx.scheduler, params, train, ctx.state, ps.stats))
            if ps.stats is not None:  # what the next step must start from (timed with the probes)
                t0 = time.perf_counter()
                ctx.state.moments = compute_moment_sketch(optimizer)
                ps.stats.setdefault("time", []).append(time.perf_counter() - t0)
            if ps.first and ps.stats is not None:
                _note_grad_direction(optimizer, ctx.state, ps.stats)
            ps.first = False
    if dp is not None:
        dp.reduce_metrics(ps.acc)
        dp.end()
    out = ps.acc.result()
    finite = [g for g in grad_norms if g == g]  # NaN marks a skipped step
    out["grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
    out["grad_norm_max"] = max(finite) if finite else float("nan")
    out["nonfinite_steps"] = float(ctx.state.nonfinite_steps)
    out["lr"] = float(optimizer.param_groups[0]["lr"])
    out["optimizer_steps"] = float(len(grad_norms))
    out["positions"] = float(policy.trained_positions - positions0)
    if ctx.probes:
        t0 = time.perf_counter()
        out.update(_probe_results(ctx, batch, probe, ps, fused))
        out["time/probes"] = t_probe + time.perf_counter() - t0 + out.pop("time", 0.0)  # the health layer's cost in the update
    return out


def _run_minibatch(ctx: UpdateContext, batch: TrainBatch, mini_idx: torch.Tensor, ps: _Pass, params: list) -> None:
    """Forward and backward of one mini-batch, micro-batch by micro-batch (gradients accumulated)."""
    algo, train, dp, state = ctx.algo, ctx.train, ctx.dp, ctx.state
    faults = ctx.faults or NO_FAULTS
    mini = batch.select(mini_idx)
    norm = faults.on_norm(compute_agg_norm(mini.loss_mask_BT, ctx.max_len), mini)  # seam: the loss's normaliser
    ctx.optimizer.zero_grad(set_to_none=True)
    lengths = mini.attention_mask_BT.sum(-1).tolist()
    micro = split_by_token_budget(lengths, train.micro_batch_tokens)
    # a mini-batch without any gradient still takes its optimizer step (Adam's moments move): run it whole
    skip_here = ps.skip and not bool(inert_mask(mini).all())
    finite = True  # a non-finite loss skips the step also when its non-finite rows had no backward
    kl_sum = kl_w = 0.0
    for idx in micro if dp is None else dp.shard(micro, lengths):
        rows = torch.tensor(idx)
        mb = _trim(mini.select(rows))
        T = mb.input_ids_BT.shape[1]
        old = None if ps.old_all is None else ps.old_all[mini_idx[rows], :T]
        ref = None if ps.ref_all is None else ps.ref_all[mini_idx[rows], :T]
        inert = inert_mask(mb) if skip_here else None
        sink = [] if ps.first and ps.stats is not None else None  # the first forward's log-probs: probes
        terms, m = compute_loss_terms(ctx.policy, mb, norm, algo, ctx.temperature,
                                      LossInputs(old, ref, ctx.critic, train.pack_sequences, train.share_prefix, inert, sink))
        if sink and ps.probe is not None:
            fill_probe_rows(*ps.probe, mini_idx[rows], sink[0])
        if sink and old is not None:  # the training forward against the sampler, before any optimizer step
            ps.pre_sampler.add(sink[0], mb.rollout_logp_BT, mb.loss_mask_BT)
        terms = faults.on_loss(terms, mb)  # seam: the micro-batch's loss terms
        if ctx.probes and ref is not None and state.kl_coef > 0:
            m["update/kl_live"] = float("kl" in terms and terms["kl"].requires_grad)
        loss = compose_loss(terms, algo, state.kl_coef)
        if loss.requires_grad:  # not when every row of this micro-batch was inert
            loss.backward()
        if ps.skip:
            lm = mb.loss_mask_BT  # the share of loss tokens that ran forward only
            m["no_grad_token_frac"] = 0.0 if inert is None else float((lm * inert[:, None]).sum() / lm.sum().clamp(min=1))
            finite = finite and bool(torch.isfinite(loss.detach()))
        ps.acc.add(m, float(mb.loss_mask_BT.sum()))
        if ps.first and "approx_kl" in m:
            kl_sum, kl_w = kl_sum + float(m["approx_kl"]) * float(mb.loss_mask_BT.sum()), kl_w + float(mb.loss_mask_BT.sum())
        if ps.norms is not None:
            ps.norms.add(mb.loss_mask_BT, norm)
    ps.acc.end_minibatch()
    if ps.first and kl_w > 0:
        ps.pre_kl = kl_sum / kl_w
    if ps.norms is not None and dp is None:
        ps.norms.end(mini.loss_mask_BT)
    if not finite:  # what the skipped rows' backward would have done: every data-parallel rank skips the step
        params[0].grad = torch.full_like(params[0], float("nan"))
    if dp is not None:
        dp.reduce_grads(params)


def _note_grad_direction(optimizer, state: UpdateState, stats: dict[str, list[float]]) -> None:
    """`update/grad_cos_prev`: the gradient the update's first optimizer step applied (still in `.grad`:
    after the fault seam and clipping; a skipped step left none) against the previous update's
    first, on their sketches (kept in `state`, so a resumed run measures what it would have). First steps
    only: later ones of an update re-use its batch (epochs)."""
    t0 = time.perf_counter()
    sketch = compute_grad_sketch([p.grad for p in optimizer.param_groups[0]["params"]])
    cos = compute_cosine(sketch, state.grad_sketch)
    if cos == cos:
        stats.setdefault("update/grad_cos_prev", []).append(cos)
    if sketch is not None:
        state.grad_sketch = sketch
    stats.setdefault("time", []).append(time.perf_counter() - t0)


MAX_STATS = ("update/frozen_frac", "update/moments_changed", "update/moments_spread", "update/moments_steps",
             "update/moments_rewound")


def _note_optimizer_state(optimizer, state: UpdateState, stats: dict[str, list[float]]) -> None:
    """Before an optimizer step (after the fault seam): the settings it will use, and whether the
    state it starts from is what the previous step left (`update/moments_changed`, `_scale`)."""
    t0 = time.perf_counter()
    for k, v in compute_hparams(optimizer).items():
        stats.setdefault(k, []).append(v)
    for k, v in (compute_moment_change(state.moments, compute_moment_sketch(optimizer)) or {}).items():
        stats.setdefault(k, []).append(v)
    stats.setdefault("time", []).append(time.perf_counter() - t0)


def _probe_before(ctx: UpdateContext, batch: TrainBatch, old_all: torch.Tensor | None):
    """(probe rows, their log-probs before the update) for `update/logp_gain`, or None."""
    rows = choose_probe_rows(batch.advantages_BT, batch.loss_mask_BT, probe_size(batch.num_seqs))
    if rows is None:
        return None
    if old_all is not None:
        return rows, old_all[rows]
    # fused (one pass, one mini-batch): the training forward scores every row before the only optimizer
    # step - `_run_minibatch` fills these from it instead of a second forward (half the probe's cost)
    return rows, torch.zeros_like(batch.rollout_logp_BT[rows])


def _probe_results(ctx: UpdateContext, batch: TrainBatch, probe, ps: _Pass, fused: bool) -> dict[str, float]:
    """The probes' metrics (tether.train.probes) once the update is done."""
    out: dict[str, float] = {}
    if probe is not None:
        rows, before = probe
        sub, t = batch.select(rows), ctx.train
        after = compute_batch_logprobs(ctx.policy, sub, ctx.temperature, t.micro_batch_tokens, t.pack_sequences,
                                       t.share_prefix)
        out.update(compute_logp_progress(before, after, sub.advantages_BT, sub.loss_mask_BT))
    for key, xs in (ps.stats or {}).items():
        out[key] = max(xs) if key in MAX_STATS else sum(xs) if key == "time" else sum(xs) / len(xs)
    if ps.norms is not None:
        out.update(ps.norms.result())
    out["update/kl_pre"] = float("nan") if fused else ps.pre_kl
    out["update/kl_pre_sampler"] = float("nan") if fused else ps.pre_sampler.result()
    return out


def _step(optimizer, scheduler, params, train: TrainConfig, state: UpdateState, stats=None) -> float:
    return do_guarded_step(optimizer, scheduler, params, train.grad_clip, train.max_bad_steps, state, stats)
