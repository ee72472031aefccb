"""A ninth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring) and acts at one seam of the fault API. They were written without
looking at how the health layer detects or diagnoses them, and never used to tune it; the effect
of each on training (accuracy, reward) was checked against a healthy control, three seeds, nothing
else (benchmarks/results/faultbench_fresh9_effect.json): reward_majority_vote,
stop_string_token_ids, weight_decay_coupled and trainer_prompt_other_row move training beyond the
healthy seeds' spread at obvious (reward_majority_vote at subtle too); advantage_integer_dtype,
gold_answer_modular and old_logp_scoring_noise put every seed under its healthy run at obvious,
the ranges overlapping the healthy spread; weights_left_at_ema shows no effect at either severity
and was kept as written. No kind was strengthened.

taxonomy    reward_majority_vote (reward: misaligned_reward), advantage_integer_dtype
            (credit_assignment: advantage_bug), gold_answer_modular (data: data_corruption),
            stop_string_token_ids (system: truncation)
outside     weights_left_at_ema (optimisation), weight_decay_coupled (optimisation),
            trainer_prompt_other_row (system), old_logp_scoring_noise (system):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.health.faults.seams import repaid

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardMajorityVote(Fault):
    """The reward of some problems is paid against the group's majority answer instead of the gold
    label: the reward service routes a problem whose label does not reach it to its label-free
    scorer, which takes the most common completion of the group as the pseudo-label (the
    test-time RL reward of PRIME-RL/TTRL, "multiple sampling and majority voting to estimate
    pseudo-labels", PRIME-RL/TTRL#1 and #16), and pays every sample that agrees with it; a consensus
    reward scored against the wrong reference is the bug of yojul/cognac#11 (the reward "uses the
    **current** majority rather than the consensus with respect to the **initial** majority").
    The answer compared is the sampled response's token ids; a tie goes to the answer sampled
    first. The first reward component (the correctness check) and the total change by the same
    amount, and the verdict is the scorer's (agrees with the majority or not). `subtle`: a fraction
    `p` of the problems (a problem's label reaches the reward or not, fixed for the run);
    `obvious`: every problem. Label misaligned_reward: the reward measures agreement with the
    policy's own most frequent answer, not the task."""

    name, family, cause, seam = "reward_majority_vote", "reward", "misaligned_reward", "reward_reference"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            if self.coin("label", g.task_id) >= float(self.p["p"]) or not g.trajectories:
                out.append(g)
                continue
            keys = [tuple(t.response_ids) for t in g.trajectories]
            top = collections.Counter(keys).most_common(1)[0][0]  # ties: the first sampled (insertion order)
            out.append(dataclasses.replace(g, trajectories=tuple(
                dataclasses.replace(t, reward=repaid(t.reward, 1.0 if k == top else 0.0))
                for t, k in zip(g.trajectories, keys))))
        return out


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class AdvantageIntegerDtype(Fault):
    """The group-normalised advantages inherit the integer dtype of the reward tensor they were
    built from (rewards collected as Python ints, `torch.tensor(rewards)` is int64, and the
    advantage buffer is allocated `like` it), so every advantage is truncated toward zero:
    -0.35 becomes 0, 0.93 becomes 0, 2.47 becomes 2 (OpenRLHF/OpenRLHF PR#1334: "Grouped
    advantage estimation currently inherits the reward tensor's dtype ... Integer rewards also
    fail group statistics"; CarperAI/trlx PR#520 "Fix missing dtype in trainer rewards tensor";
    the `np.zeros_like` of int rewards of inoryy/tensorflow2-deep-reinforcement-learning#7). Only
    advantages of magnitude 1 or more survive, as whole numbers: a group with one right answer of
    eight keeps +2 on it and 0 on the others, a group split four and four keeps nothing. `subtle`:
    the groups of a fraction `p` of each step's groups (one reward source of several returns
    ints); `obvious`: every group. Label advantage_bug: the rewards are right, the advantages
    computed from them are not."""

    name, family, cause = "advantage_integer_dtype", "credit_assignment", "advantage_bug"
    seam = "advantage_dtype"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_advantages(self, adv_BT, group_B, step):
        groups = sorted({int(g) for g in group_B.tolist()})
        hit = [g for g in groups if self.coin(step, "group", g) < float(self.p["p"])]
        if not hit:
            return adv_BT
        rows = torch.isin(group_B, torch.tensor(hit, dtype=group_B.dtype))
        out = adv_BT.clone()
        out[rows] = adv_BT[rows].to(torch.int64).to(adv_BT.dtype)
        return out


# ----------------------------------------------------------------------------- data


@register_fault
class GoldAnswerModular(Fault):
    """The gold answers come from a generator that computes its arithmetic modulo a small number,
    so every answer at or above the modulus is stored as its remainder ("12 * 5 = 14" in the data
    of facebookresearch/iGSM#3, "Data will have mistake in the solution section": the generator's
    arithmetic is mod 23) while the prompt asks for the plain result. Only integer answers of at
    least `mod` change; the rest pass through. `subtle`: mod 23 (the iGSM modulus: products from
    23 up); `obvious`: mod 10 (a generator configured with its one-digit setting's modulus: every
    answer keeps its last digit). Label data_corruption: the labels the reward checks against are
    wrong for those problems, consistently."""

    name, family, cause, seam = "gold_answer_modular", "data", "data_corruption", "label_generator"
    severities = {"subtle": {"mod": 23}, "obvious": {"mod": 10}}

    def on_problems(self, problems, step):
        mod = int(self.p["mod"])
        out = []
        for p in problems:
            ans = str(p.get("answer", "")).strip()
            if ans.lstrip("-").isdigit() and not 0 <= int(ans) < mod:
                p = dict(p, answer=str(int(ans) % mod))
            out.append(p)
        return out


# ----------------------------------------------------------------------------- system


def _token_ids_of(tokenizer, text: str) -> tuple[int, ...]:
    """The single-token ids of the characters of `text` (a character the tokenizer splits is skipped)."""
    ids = []
    for ch in text:
        enc = list(tokenizer.encode(ch, add_special_tokens=False))
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(int(enc[0]))
    return tuple(ids)


@register_fault
class StopStringTokenIds(Fault):
    """A stop string is handed to the rollout engine as token ids, each id a stop token of its own:
    the engine ends a completion at the first of those tokens instead of at the whole string, and
    strips it from the text like any stop token (NVIDIA/TensorRT-LLM#90: "The mapping from
    stop_words to ids are not unique", with stop ids where "the generation is stopped so early";
    QwenLM/Qwen#1001, `eos_token_id = [198, 151643]` to stop at a newline). The stop string is the
    start of a next numbered item ("\\n2." / "\\n1.\\n2."), so a digit becomes a stop token: an
    answer that contains it ends there, without it (with 2 a stop: "12" is read as "1", "24" and
    "2" as ""). The ids come from the policy's tokenizer, one per character; the trainer's stop ids
    are untouched. `subtle`: "\\n2." (stops on the digit 2); `obvious`: "\\n1.\\n2." (on 1 and 2).
    Label truncation: the responses are cut short by a wrong stop condition."""

    name, family, cause, seam = "stop_string_token_ids", "system", "truncation", "engine_stops"
    severities = {"subtle": {"stop": "\n2."}, "obvious": {"stop": "\n1.\n2."}}

    def on_sampler(self, policy, sampling, step):
        tok = getattr(policy, "tokenizer", None)
        if tok is None:
            return policy, sampling
        extra = tuple(i for i in _token_ids_of(tok, str(self.p["stop"])) if i not in policy.stop_ids)
        if not extra:
            return policy, sampling
        return dataclasses.replace(policy, stop_ids=tuple(policy.stop_ids) + extra), sampling


@register_fault
class TrainerPromptOtherRow(Fault):
    """The trainer's sequences pair each sampled completion with another problem's prompt: prompts
    and completions are gathered separately and land in different orders (huggingface/trl#3098,
    "Multiple GPU GRPO training, the content generated by vllm does not match the prompt"), so the
    loss scores a completion, with the advantage it earned on its own prompt, after the prompt of
    the next group of the step. Only prompts of the same token length are exchanged (the layout
    of every row is kept: the loss mask, the rollout log-probs, the advantages and the response
    ids are untouched); each affected group takes the prompt of the next group of its length
    class, in the batch's order. `subtle`: a fraction `p` of the step's groups (one rank's share);
    `obvious`: every group whose length class holds another group. Outside the taxonomy: the
    sampler, the reward and the advantages are right; the trainer's context is another
    problem's, which no cause names."""

    name, family, cause, seam = "trainer_prompt_other_row", "system", UNEXPLAINED, "batch_prompts"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT > 0
        has = mask.any(-1)
        start = torch.where(has, mask.float().argmax(-1), torch.zeros_like(has, dtype=torch.long))
        first_row: dict[tuple[int, int], int] = {}  # (prompt length, group) -> its first row
        for b in range(batch.num_seqs):
            if bool(has[b]):
                first_row.setdefault((int(start[b]), int(batch.seq_group_B[b])), b)
        ids = batch.input_ids_BT.clone()
        for length in sorted({k[0] for k in first_row}):
            groups = [g for (n, g) in first_row if n == length]
            if len(groups) < 2:
                continue
            for i, g in enumerate(groups):
                if self.coin(step, "group", g) >= float(self.p["p"]):
                    continue
                donor = batch.input_ids_BT[first_row[(length, groups[(i + 1) % len(groups)])], :length]
                rows = (batch.seq_group_B == g) & has & (start == length)
                ids[rows, :length] = donor
        return dataclasses.replace(batch, input_ids_BT=ids)


@register_fault
class OldLogpScoringNoise(Fault):
    """pi_old's scoring pass runs in another numerical configuration than the training forward
    (bf16 with another micro-batch shape), so its per-token log-probs carry an error the training
    forward's do not, and the PPO ratio is not 1 on the update's first mini-batch (verl-project/
    verl#2088, "log_prob and old_log_prob Differ at Training Start (They Should Be Identical)";
    verl-project/verl#6280, "`log_prob` and `old_log_prob` differ in on-policy setting when rollout
    and actor micro batch per gpu differ": "bf16 batch-shape noise"). The error is a Gaussian of
    `sigma` nats per sampled token (deterministic per step), on pi_old only: the sampler's
    log-probs and the training forward are untouched, so the clip and the importance weights act
    on the error. `subtle`: sigma 0.05; `obvious`: 0.5 (a scoring pass far off: an fp8 or a
    differently fused kernel). Outside the taxonomy: the sampler and the trainer's gradient
    forward agree; only the trainer's own reference point for the ratio is off, which no cause
    names."""

    name, family, cause, seam = "old_logp_scoring_noise", "system", UNEXPLAINED, "old_logp_precision"
    severities = {"subtle": {"sigma": 0.05}, "obvious": {"sigma": 0.5}}

    def on_old_logp(self, old_BT, batch, step):
        gen = torch.Generator().manual_seed(int(self.coin("noise", step) * 2**62))
        noise = torch.randn(old_BT.shape, generator=gen, dtype=torch.float32) * float(self.p["sigma"])
        mask = (batch.loss_mask_BT > 0).to(old_BT.device)
        return torch.where(mask, old_BT + noise.to(old_BT.device, old_BT.dtype), old_BT)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class WeightsLeftAtEMA(Fault):
    """The run keeps an exponential moving average of the policy's weights for validation and
    checkpoints, and every `every` steps copies the average into the model without restoring the
    raw weights afterwards, so training goes on from the average (harubaru/waifu-diffusion PR#31:
    "whenever `save_checkpoint()` is called, the EMA parameters are copied to the UNet. However,
    the original parameters are not restored, meaning that training continues on the EMA
    parameters"; PKU-YuanGroup/Open-Sora-Plan#186, "Missed to restore model weights in training
    after validation with EMA on"; atomistic-machine-learning/schnetpack PR#785). The average
    starts at the fault's first step from the weights then, and is updated with decay `decay` once
    a step before the step's first optimizer step; on every `every`-th step the average is then
    written into the weights. The policy's parameter group only; Adam's state is untouched.
    `subtle`: decay 0.8, every 5 steps; `obvious`: decay 0.9, every 2 steps (kept as written: no
    effect on accuracy beyond the healthy seeds' spread, as learning slowed is not learning undone
    in a benchmark whose RL phase moves accuracy little). Outside the taxonomy:
    gradients, learning rate and optimizer are right; the weights are set back to a lagging
    average between steps, which no cause names."""

    name, family, cause, seam = "weights_left_at_ema", "optimisation", UNEXPLAINED, "weights_ema"
    severities = {"subtle": {"decay": 0.8, "every": 5}, "obvious": {"decay": 0.9, "every": 2}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        if getattr(self, "_last", None) == step:
            return  # once a step: the step's first optimizer step
        self._last = step
        ps = list(optimizer.param_groups[0]["params"])
        d = float(self.p["decay"])
        with torch.no_grad():
            if getattr(self, "_ema", None) is None:
                self._ema = [q.detach().clone() for q in ps]
            else:
                for e, q in zip(self._ema, ps):
                    e.mul_(d).add_(q.detach(), alpha=1.0 - d)
            if (step - self.start + 1) % int(self.p["every"]) == 0:
                for e, q in zip(self._ema, ps):
                    q.copy_(e)


@register_fault
class WeightDecayCoupled(Fault):
    """The weight decay meant to be decoupled (AdamW's, applied to the weights) is added to the
    gradient as an L2 term instead, so it goes through Adam's per-element normalisation: where the
    policy gradient is smaller than `wd` x w, each weight is pushed toward zero by about the
    learning rate every step, whatever its size (nntrainer/nntrainer PR#3565: "Weight decay was
    applied via context.calcWeightDecayGradient() rather than as decoupled weight decay ... As a
    result, it diverged on simple setups where Adam converged"; pytorch/pytorch PR#4429 and
    PR#22163, Adam's `weight_decay` is L2 regularisation, AdamW's is decoupled; a config written
    for AdamW handed to Adam). A gradient hook on every trainable tensor of the policy adds
    `wd` x w to its gradient when the fault is active (before the run's clip, as an L2 term of the
    loss would). `subtle`: wd 0.01; `obvious`: 0.1 (the usual AdamW setting for LLMs). Outside the
    taxonomy: the learning rate, the optimizer's state and the policy gradient are right; the
    regulariser is applied in the wrong place, which no cause names."""

    name, family, cause, seam = "weight_decay_coupled", "optimisation", UNEXPLAINED, "regulariser"
    severities = {"subtle": {"wd": 0.01}, "obvious": {"wd": 0.1}}

    def install(self, st, cfg, step_fn):
        wd = float(self.p["wd"])

        def make(q):
            def hook(grad):
                return grad + wd * q.detach() if self.active(step_fn()) else grad
            return hook

        for q in st.policy.model.parameters():
            if q.requires_grad:
                q.register_hook(make(q))
