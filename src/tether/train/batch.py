"""A step's trajectory groups -> the train batch: reward shaping, compact filtering, padded
sequences, KL-in-reward, critic values, the ReMax baseline and the advantages (`tether.algos`)."""

from __future__ import annotations

from typing import Callable

import torch

from tether.algos import ADVANTAGES, AdvantageInputs, compute_advantages, compute_kl_in_reward
from tether.algos.config import AlgoConfig
from tether.health import compute_advantage_alignment, compute_mask_coverage, compute_token_agreement
from tether.policy.config import SamplingConfig
from tether.rewards.config import RewardConfig
from tether.train.batching import build_records, pad_records
from tether.train.credit import compute_step_fields
from tether.train.groups import apply_reward_shaping, compute_compact_weights
from tether.train.config import TrainConfig
from tether.train.state import RLState
from tether.train.update import compute_batch_logprobs
from tether.types import TrainBatch, TrajectoryGroup


def make_train_batch(st: RLState, groups: list[TrajectoryGroup], a: AlgoConfig, sampling: SamplingConfig,
                     reward: RewardConfig, train: TrainConfig,
                     greedy_baseline: Callable[[list[TrajectoryGroup]], torch.Tensor] | None = None,
                     ) -> tuple[TrainBatch, dict[str, float]]:
    """Groups -> padded sequences -> advantages (and KL-in-reward, critic values, ReMax baseline).

    `greedy_baseline(groups) -> [G]`: the reward of one greedy rollout per problem (ReMax; the
    recipe passes its rollout's, `tether.rollout.compute_greedy_baseline`); asked only when the
    estimator needs it."""
    metrics: dict[str, float] = {}
    groups = apply_reward_shaping(groups, a, sampling.max_new_tokens)
    groups, weights, cm = compute_compact_weights(groups, a.compact_filter)
    metrics.update(cm)
    records = build_records(groups, weights, mask_invalid=reward.on_error == "mask")
    p = pad_records(records, st.policy.pad_id)
    temp = sampling.temperature
    token_rewards, values, baseline = p.token_rewards_BT, None, None
    ref = st.faults.on_reference(st.ref)  # seam: the reference model
    if ref is not None and a.kl.placement == "reward" and st.update.kl_coef > 0:
        stub = TrainBatch(p.input_ids_BT, p.attention_mask_BT, p.loss_mask_BT, p.rollout_logp_BT,
                          torch.zeros_like(p.rollout_logp_BT), p.group_B, p.traj_B, kept_BT=p.kept_BT)
        ref_logp = compute_batch_logprobs(ref, stub, temp, train.micro_batch_tokens)
        token_rewards, kl_BT = compute_kl_in_reward(token_rewards, p.rollout_logp_BT, ref_logp, p.loss_mask_BT,
                                                    st.update.kl_coef, a.kl.estimator, a.kl.clamp)
        metrics["kl_reward"] = float(kl_BT.sum() / p.loss_mask_BT.sum().clamp(min=1))
    if st.critic is not None:
        with torch.no_grad():
            values = st.critic(p.input_ids_BT.to(st.policy.device), p.attention_mask_BT.to(st.policy.device)).float().cpu()
    if ADVANTAGES.facts(a.advantage.name).needs_greedy_baseline:
        if greedy_baseline is None:
            raise ValueError(f"algo.advantage.name={a.advantage.name} needs a greedy baseline: pass greedy_baseline")
        baseline = greedy_baseline(groups)[p.group_B]
    adv = compute_advantages(AdvantageInputs(
        scores_B=p.scores_B, token_rewards_BT=token_rewards, mask_BT=p.loss_mask_BT, group_B=p.group_B,
        traj_B=p.traj_B, valid_B=p.valid_B, values_BT=values, baseline_B=baseline, **compute_step_fields(groups, p)),
        a.advantage)
    adv = st.faults.on_advantages(adv, p.group_B)  # seam: credit assignment
    batch = TrainBatch(p.input_ids_BT, p.attention_mask_BT, p.loss_mask_BT, p.rollout_logp_BT, adv.advantages_BT,
                       p.group_B, p.traj_B, adv.returns_BT, values, kept_BT=p.kept_BT)  # kept: the sampling mask
    # the engine's ids and their layout, kept apart from anything that edits the batch in place
    sampled_ids_BT, sampled_attn_BT = p.input_ids_BT.clone(), p.attention_mask_BT.clone()
    batch = st.faults.on_batch(batch)  # seam: the loss's inputs (loss mask, advantages, rollout log-probs)
    # the checks read the batch the loss will see, after every fault seam
    mask = batch.loss_mask_BT > 0
    metrics["advantage/mean"] = float(batch.advantages_BT[mask].mean()) if mask.any() else 0.0
    metrics["advantage/abs_mean"] = float(batch.advantages_BT[mask].abs().mean()) if mask.any() else 0.0
    metrics.update(compute_advantage_alignment(batch.advantages_BT, p.scores_B, batch.loss_mask_BT, p.group_B))
    if p.turn_BT is not None and batch.loss_mask_BT.shape == p.turn_BT.shape:  # per position: sampled vs trained
        metrics.update(compute_mask_coverage(batch.loss_mask_BT, p.turn_BT >= 0,
                                             torch.tensor([r.weight > 0 for r in records])))
    if p.turn_BT is not None:  # the loss scores the sampled context and tokens, whatever the layout
        metrics.update(compute_token_agreement(batch.input_ids_BT, batch.attention_mask_BT, sampled_ids_BT,
                                               sampled_attn_BT, p.turn_BT >= 0))
    metrics["batch/sequences"], metrics["batch/loss_tokens"] = float(batch.num_seqs), float(batch.num_loss_tokens)
    metrics["reward/masked_invalid"] = float((~p.valid_B).sum())
    return batch, metrics
