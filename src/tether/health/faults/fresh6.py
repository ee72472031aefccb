"""A sixth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring) and acts at one seam of the fault API. They were written without
looking at how the health layer detects or diagnoses them, and never used to tune it; the effect
of each on training (accuracy, reward) was checked against a healthy control, three seeds, nothing
else (benchmarks/results/faultbench_fresh6_effect.json: adam_state_reordered and
old_logp_sequence_sum show no effect beyond the healthy seeds' spread at either severity).

taxonomy    reward_length_sorted (reward: misaligned_reward), loo_filter_keeps_majority
            (data: no_signal), loo_advantage_spike (credit_assignment: advantage_bug),
            sync_merge_accumulates (system: rollout_mismatch)
outside     grad_flat_offset (optimisation), adam_state_reordered (optimisation),
            old_logp_sequence_sum (credit_assignment), prefix_cache_collision (system):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardLengthSorted(Fault):
    """The reward service sorts the completions it scores by length (to batch similar lengths
    together) and returns its scores in that sorted order; the caller writes them back in its own
    order, so sample k gets the score of the k-th shortest completion of the chunk (the unsort
    that was skipped or clobbered: mead-ml/mead-baseline PR#677, "an output was actually an
    output from a different element in the batch"; vllm#394 "Input and output orders are
    different"; deepspeedai/DeepSpeed-MII PR#384, outputs in finishing order, "especially obvious
    when the generated outputs are of varying lengths"). Unlike `reward_shuffled` (an order
    mix-up inside each group) the sort runs over a chunk of the whole step's samples, so scores
    land on samples of other prompts; the whole RewardResult (total, components, verdict) moves,
    as it comes back from the service as one record. Samples are taken in the step's order and cut
    into chunks of `chunk`. `subtle`: a fraction `p` of the chunks of 32 go through the sorting
    path (one of several scoring workers); `obvious`: the step's samples are one chunk, sorted.
    Label misaligned_reward: real scores, attached to the wrong samples."""

    name, family, cause, seam = "reward_length_sorted", "reward", "misaligned_reward", "reward"
    severities = {"subtle": {"chunk": 32, "p": 0.3}, "obvious": {"chunk": 0, "p": 1.0}}

    def on_rollouts(self, groups, step):
        slots = [(gi, i) for gi, g in enumerate(groups) for i in range(len(g.trajectories))]
        size = int(self.p["chunk"]) or len(slots)
        rewards = {s: groups[s[0]].trajectories[s[1]].reward for s in slots}
        moved = dict(rewards)
        for c, lo in enumerate(range(0, len(slots), max(size, 1))):
            chunk = slots[lo:lo + size]
            if self.coin(step, "chunk", c) >= float(self.p["p"]):
                continue
            order = sorted(chunk, key=lambda s: groups[s[0]].trajectories[s[1]].num_action_tokens)  # stable
            for dest, src in zip(chunk, order):
                moved[dest] = rewards[src]
        out = []
        for gi, g in enumerate(groups):
            trajs = tuple(t if moved[(gi, i)] is t.reward else dataclasses.replace(t, reward=moved[(gi, i)])
                          for i, t in enumerate(g.trajectories))
            out.append(g if trajs == g.trajectories else dataclasses.replace(g, trajectories=trajs))
        return out


# ----------------------------------------------------------------------------- data


@register_fault
class LooFilterKeepsMajority(Fault):
    """The dynamic-sampling filter decides per sample, on the sample's peers (its group without
    it), whether the group is "trivial": a sample whose peers all share one reward is dropped, so in
    a group where a single sample differs from the others the filter drops exactly that sample and
    keeps the identical rest (NVIDIA-NeMo/RL PR#4158, review: with the leave-one-out mask, for
    rewards "[0.0] + [0.95] * 7 ... the new filter drops only the losing rollout and retains seven
    identical winners. When GRPO recomputes their baselines after filtering, all seven advantages
    become zero, eliminating the useful mixed-reward training"). The group that survives has one
    reward, hence no learning signal; the groups of a lone correct answer (the hard problems) lose
    it, and so do those of a lone wrong one. `subtle`: the reported filter (k = 1: a lone
    dissenting sample) on a fraction `p` of the groups (one of several rollout workers runs the new
    filter); `obvious`: every group, and a minority of up to k = 3 of the 8 samples is dropped (a
    stronger form than the report: the first effect check, k = 1 on every group, moved
    final_train_acc by less than the healthy seeds' spread; see the effect file). Label no_signal: the learning signal of those groups
    is gone while the tasks are neither all solved nor all failed; arguable (the mechanism is a
    filter acting on samples, which the cause's description does not name)."""

    name, family, cause, seam = "loo_filter_keeps_majority", "data", "no_signal", "grouping"
    severities = {"subtle": {"p": 0.5, "k": 1}, "obvious": {"p": 1.0, "k": 3}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            rewards = [t.reward.total for t in g.trajectories]
            rare = min(set(rewards), key=rewards.count)
            n = rewards.count(rare)
            # two rewards, the rarer held by at most k samples: with k = 1, each of those has "trivial" peers
            few = len(set(rewards)) == 2 and n <= int(self.p["k"]) and 2 * n < len(rewards)
            drop = [few and r == rare for r in rewards]
            if not any(drop) or all(drop) or self.coin(step, g.task_id) >= float(self.p["p"]):
                out.append(g)
                continue
            out.append(dataclasses.replace(g, trajectories=tuple(t for t, d in zip(g.trajectories, drop) if not d)))
        return out


# ----------------------------------------------------------------------------- credit assignment


def _row_values(adv_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] each row's advantage: the mean of its nonzero entries, 0 when none; [B, T] bool nonzero)."""
    nz = adv_BT != 0
    return (adv_BT * nz).sum(-1) / nz.sum(-1).clamp(min=1), nz


@register_fault
class LooAdvantageSpike(Fault):
    """The advantage is normalised by the leave-one-out standard deviation of the sample's peers
    with a tiny epsilon, and a sample whose peers all share one value gets (A - mean_peers) / (0 +
    eps): an advantage thousands of times its group's (NVIDIA-NeMo/RL PR#4158 "Fix spike in LOO
    normed advantage", the leave-one-out baseline with std normalisation; the spike hits the lone
    correct sample of a hard group and the lone wrong one of an easy group). Only those samples
    change; the rest of each group keeps its advantage (same sign as before, so the spike points
    the right way but drowns every other sample's gradient once the update is clipped).
    `subtle`: eps = 1e-2 (a spike of ~100x); `obvious`: eps = 1e-6 (the default of a
    `std + eps` written for a batch-level std). Label advantage_bug: an advantage estimator bug;
    the rewards and the groups are right."""

    name, family, cause, seam = "loo_advantage_spike", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"eps": 1e-2}, "obvious": {"eps": 1e-6}}

    def on_advantages(self, adv_BT, group_B, step):
        v, nz = _row_values(adv_BT)
        new = v.clone()
        for g in torch.unique(group_B).tolist():
            rows = (group_B == g).nonzero().squeeze(-1)
            if len(rows) < 3:
                continue
            for i in rows.tolist():
                peers = v[rows[rows != i]]
                gap = float(v[i] - peers.mean())
                spread = float(peers.std(unbiased=False))  # 0 up to float32 rounding of equal advantages
                if spread < 1e-6 * (1.0 + abs(float(peers.mean()))) and abs(gap) > 1e-6:
                    new[i] = gap / float(self.p["eps"])
        if torch.equal(new, v):
            return adv_BT
        return torch.where(nz, new[:, None].to(adv_BT.dtype).expand_as(adv_BT), adv_BT)


@register_fault
class OldLogpSequenceSum(Fault):
    """pi_old's scoring pass returns each sequence's log-probability (the sum over its response
    tokens) in every token slot: a sequence scorer written for DPO reused where per-token values
    were expected (walkinglabs/hands-on-modern-rl#75: the GRPO example "took the already summed
    result to compute ratio, clip and KL, so each answer keeps only one ratio"; the summed value
    is right for DPO, wrong for a per-token ratio). The current policy's log-probs stay per token,
    so every ratio exp(logp_t - sum_s logp_s) is above 1 (far above for long or unlikely answers):
    positive-advantage tokens are clipped out of the gradient, negative ones are pushed with
    inflated weight, and the rollout correction exp(old - rollout) is shrunk. `subtle`: a fraction
    `p` of the rows (the rows a packed-sequence path scores); `obvious`: every row. Outside the
    taxonomy: the sampler and the trainer agree, and rewards, advantages and mask are right; what
    is wrong is the granularity of pi_old, which no cause names."""

    name, family, cause, seam = "old_logp_sequence_sum", "credit_assignment", UNEXPLAINED, "old_logp"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_old_logp(self, old_BT, batch, step):
        mask = batch.loss_mask_BT.to(old_BT.device) > 0
        rows = torch.tensor([self.coin(step, int(t)) < float(self.p["p"]) for t in batch.seq_traj_B.tolist()],
                            device=old_BT.device)
        seq = (old_BT * mask).sum(-1, keepdim=True).expand_as(old_BT)
        return torch.where(rows[:, None] & mask, seq, old_BT)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class GradFlatOffset(Fault):
    """The gradients are reduced into one flat buffer and read back per tensor at offsets computed
    with a wrong size for the tensors before it: each tensor's gradient view starts `shift`
    elements too far per preceding tensor (deepspeedai/DeepSpeed PR#8277, the ZeRO flat-buffer
    offsets computed from `param.numel()` of a placeholder, which "returns 1 rather than the
    original parameter size"; NVIDIA/Megatron-LM PR#4328, `param_index_map` offsets of packed
    buffers). Tensor i receives the flat gradient from its own start + i x `shift`: its elements
    get their neighbours' gradients and its last elements the next tensor's first ones (zeros past
    the end). The policy's parameter group only. `subtle`: the misalignment starts in the last
    quarter of the tensors (the last bucket); `obvious`: from the second tensor on. Outside the
    taxonomy: every gradient value is a correct value of a correct loss, delivered to the wrong
    element, which no cause names."""

    name, family, cause, seam = "grad_flat_offset", "optimisation", UNEXPLAINED, "gradients"
    severities = {"subtle": {"shift": 1, "from": 0.75}, "obvious": {"shift": 1, "from": 0.0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        group = [q for q in optimizer.param_groups[0]["params"] if q.grad is not None]
        if len(group) < 2:
            return
        flat = torch.cat([q.grad.detach().reshape(-1) for q in group])
        first = max(1, int(len(group) * float(self.p["from"])))
        start = 0
        for i, q in enumerate(group):
            n = q.numel()
            if i >= first:
                off = start + (i - first + 1) * int(self.p["shift"])
                piece = flat[off:off + n]
                if piece.numel() < n:
                    piece = torch.cat([piece, flat.new_zeros(n - piece.numel())])
                q.grad.copy_(piece.view_as(q.grad))
            start += n


@register_fault
class AdamStateReordered(Fault):
    """Adam's state is restored by position into a parameter list whose order changed: the saved
    state of the tensor at position i is loaded into the tensor now at position i (pytorch#1489
    "Optimizer should track parameter names and not id": "the loaded optimizer's state for p1 will
    be mapped to p2 and vice-versa"; PingoLH/CenterNet-HarDNet#10, a dict iteration order that
    differs between runs "would confuse the tensor id mapping"; facebookresearch/fairscale#380).
    Tensors of different shapes would fail loudly at the next step, so the silent case is among
    tensors of one shape (q/k/v/o projections, gate/up, the norms): within each shape class the
    moments are rotated by one tensor (a refactor that declares one module before another). The
    policy's parameter group only; lr, betas and step counts are untouched. `subtle`: one resume,
    at the fault's start; `obvious`: a preemptible job that resumes before every training step,
    each resume rotating the state once more (the first effect check had a resume every 2 steps
    and moved neither final_train_acc nor rollout accuracy, so it was made stronger once). Outside the taxonomy: the moments are correct moments
    of another tensor (the update's direction follows another tensor's gradient history, its
    per-element size another tensor's scale); arguably lr_too_high for the elements that receive
    a smaller second moment, but no cause names the misattribution."""

    name, family, cause, seam = "adam_state_reordered", "optimisation", UNEXPLAINED, "optimizer_state"
    severities = {"subtle": {"every": 0}, "obvious": {"every": 1}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        every, seen = int(self.p["every"]), self.__dict__.setdefault("_resumed", set())
        # one resume per due step (a step runs several optimizer steps); every=0: the first one only
        if step in seen or (every == 0 and seen) or (every and (step - self.start) % every):
            return
        seen.add(step)
        classes: dict[tuple, list] = {}
        for q in optimizer.param_groups[0]["params"]:
            if q in optimizer.state:
                classes.setdefault(tuple(q.shape), []).append(q)
        for same in classes.values():
            if len(same) > 1:
                states = [optimizer.state[q] for q in same]
                for q, s in zip(same, states[-1:] + states[:-1]):
                    optimizer.state[q] = s


# ----------------------------------------------------------------------------- system


_LORA_TARGETS = ("q_proj", "v_proj")  # peft's default LoRA target modules for Llama


@register_fault
class SyncMergeAccumulates(Fault):
    """The weight sync merges the trainer's adapter delta into the rollout engine's weights without
    undoing the previous merge, so every sync adds the whole delta again (huggingface/peft PR#1355
    "Make merging of adapter weights idempotent": "if a user calls merge multiple times ... the
    delta weights are added again and again", which can happen "even if the user does not
    explicitly call merge twice"; radixark/miles PR#1087, base weights exported with the merged
    LoRA weights, "causing correctness issue"). The delta of a tensor is its change since the
    fault's start (the adapter's base); the engine holds base + the sum of every delta synced so
    far: right at the first sync, then further off at each. The other tensors are synced right;
    the engine reports the trainer's version. `subtle`: the attention q/v projections (peft's
    default LoRA targets for Llama); `obvious`: every weight matrix of the layers
    ("all-linear"). Label rollout_mismatch: the engine runs weights the sync converted wrong;
    arguably stale_weights, but the engine's weights are neither the current nor an old version."""

    name, family, cause, seam = "sync_merge_accumulates", "system", "rollout_mismatch", "weight_sync"
    severities = {"subtle": {"targets": _LORA_TARGETS}, "obvious": {"targets": ("layers.",)}}

    def _targeted(self, name: str, q: torch.Tensor) -> bool:
        return q.dim() == 2 and "layers." in name and any(t in name for t in self.p["targets"])

    def on_sampler(self, policy, sampling, step):
        live = dict(policy.model.named_parameters())
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
            self._base = {n: q.detach().clone() for n, q in live.items() if self._targeted(n, q)}
        with torch.no_grad():
            for n, q in self._engine.model.named_parameters():
                if n in self._base:
                    q.add_(live[n].detach() - self._base[n])  # merge again, never unmerged
                else:
                    q.copy_(live[n].detach())
            for (n, b), (_, lb) in zip(self._engine.model.named_buffers(), policy.model.named_buffers()):
                b.copy_(lb)
        self._engine.version = policy.version
        return self._engine, sampling


@register_fault
class PrefixCacheCollision(Fault):
    """The rollout engine's prefix cache keys its blocks by a weak hash of the prompt, so a request
    whose prompt collides with a cached one is decoded from the other prompt's cached keys and
    values, while the engine reports the request's own prompt ids (openvinotoolkit/openvino.genai
    #3722 "Hash collision in prefix KV cache silently reuses wrong KV block"; vllm-project/vllm
    PR#12621, prefix-cache hash collisions, sha256 later the default; NVIDIA/Megatron-LM PR#4158, a
    polynomial rolling hash with algebraic collisions). Emulated per step: colliding problems of
    equal prompt length are paired, each is generated from its partner's prompt, and the
    trajectories carry the problem's own prompt ids and are scored against its own answer (what
    the engine returns). `subtle`: a fraction `p` of the pairs collide (a hash with a few bits);
    `obvious`: every pair (a key that depends on the prompt's length only). Outside the taxonomy:
    the weights, the sampling settings and the forward are the same on both sides; the sampler
    conditioned on another input than the one it reports, which no cause names (arguably
    rollout_mismatch, whose forwards differ, here by their input)."""

    name, family, cause, seam = "prefix_cache_collision", "system", UNEXPLAINED, "prompt_cache"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        self._swapped: dict[str, str] = {}  # task id -> the id of the partner whose prompt it ran on
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(problems):
            by_len.setdefault(len(str(p.get("prompt", ""))), []).append(i)
        out = list(problems)
        for idx in by_len.values():
            for a, b in zip(idx[0::2], idx[1::2]):
                pa, pb = problems[a], problems[b]
                if pa.get("prompt") == pb.get("prompt") or self.coin(step, pa.get("id"), pb.get("id")) >= float(self.p["p"]):
                    continue
                out[a], out[b] = dict(pa, prompt=pb["prompt"]), dict(pb, prompt=pa["prompt"])
                self._swapped[str(pa["id"])], self._swapped[str(pb["id"])] = str(pb["id"]), str(pa["id"])
        self._prompts = {str(p["id"]): p.get("prompt") for p in problems}
        return out

    def on_rollouts(self, groups, step):
        swapped = getattr(self, "_swapped", {})
        ctx = {g.task_id: g.trajectories[0].turns[0].context_ids for g in groups if g.trajectories}
        out = []
        for g in groups:
            partner = swapped.get(str(g.task_id))
            if partner is None or partner not in ctx:
                out.append(g)
                continue
            own = ctx[partner]  # the partner ran on this problem's prompt: these are its ids
            trajs = tuple(dataclasses.replace(t, turns=(dataclasses.replace(t.turns[0], context_ids=own),) + t.turns[1:])
                          for t in g.trajectories)
            out.append(dataclasses.replace(g, trajectories=trajs, task=dict(g.task, prompt=self._prompts[str(g.task_id)])))
        return out
