"""A tenth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring; where no issue number was found, the report is described without one)
and acts at one seam of the fault API. They were written without looking at how the health layer
detects or diagnoses them, and never used to tune it; the effect of each on training (accuracy,
reward) was checked against a healthy control, three seeds, nothing else
(benchmarks/results/faultbench_fresh10_effect.json). Beyond the healthy seeds' spread
(final train accuracy 0.375-0.473, rollout accuracy 0.352-0.421): adam_bias_correction_off at both
severities (obvious 0.070-0.094, subtle 0.197-0.260) and reward_decoded_from_second_token at obvious
(0.096-0.176; at subtle its rollout accuracy 0.244-0.291 is under the band, its final accuracy
0.338-0.410 one seed under); sampler_suppressed_tokens at obvious puts the rollout accuracy at
0.275-0.351, just under the band (final 0.305-0.435, one seed under). Modest (one seed under the
band, the ranges overlapping it): rollout_logp_tail_zero_padded at obvious (0.363-0.395) and
loss_grad_accum_mean_of_means at subtle (0.332-0.420; obvious 0.363-0.438, inside). No effect,
kept as written: advantage_discounted_to_go (inside the band at both severities),
ref_polyak_synced (0.471-0.502, at or above the healthy runs; its runs carry a KL term the healthy
control does not), and gold_negative_answer_unsigned, which is inert on this benchmark: the
arithmetic task swaps a subtraction's operands so that no answer is negative (tether.tasks), and
its runs equal the healthy ones. No kind was strengthened; sampler_suppressed_tokens crashed its
runs at first (a forward hook on the LM head, which tether refuses) and was changed to act through
the engine's head bias, the same suppression, before its runs were repeated.

taxonomy    reward_decoded_from_second_token (reward: misaligned_reward), gold_negative_answer_unsigned
            (data: data_corruption), advantage_discounted_to_go (credit_assignment: advantage_bug),
            loss_grad_accum_mean_of_means (credit_assignment: loss_norm_bug), sampler_suppressed_tokens
            (system: rollout_mismatch)
outside     adam_bias_correction_off (optimisation), ref_polyak_synced (optimisation),
            rollout_logp_tail_zero_padded (system):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.health.faults.seams import KL_BASE, repaid

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardDecodedFromSecondToken(Fault):
    """The verifier reads a response decoded from its second token on: the reward worker slices the
    completion out of the full sequence one position too far (`ids[prompt_len + 1:]`, a prompt
    length counted without its BOS / generation-prompt token; no upstream report of this exact
    slice on the reward side was found, it is the response-slicing off-by-one class that reports
    name for log-probs, e.g. modelscope/ms-swift PR#8196's review: one log-prob series "shifted one
    position to the left relative to" the other), so the first sampled token never reaches the
    check. "12" is scored as "2", a one-token answer as "" (never paid), and a response that puts
    any token before the right answer ("x7") is paid. The text is re-decoded from the sampled ids
    with the policy's tokenizer (cut at the stop token, like the rollout's text); the first reward
    component and the total change by the same amount, and the verdict is the sliced text's.
    `subtle`: a fraction `p` of the samples (one reward worker of several has the slice);
    `obvious`: every sample. Label misaligned_reward: the reward is computed on text other than
    the response the policy produced, and pays a shape of answer that is not correct."""

    name, family, cause, seam = "reward_decoded_from_second_token", "reward", "misaligned_reward", "response_slice"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        from tether.policy.chat import decode_completion
        from tether.rewards.verifiers import exact_match_reward

        policy = self.view.policy if self.view is not None else None
        tok = getattr(policy, "tokenizer", None)
        if tok is None:
            return groups
        stops = tuple(getattr(policy, "stop_ids", ()))
        out = []
        for g in groups:
            trajs = []
            for i, t in enumerate(g.trajectories):
                if self.coin(step, g.task_id, i) >= float(self.p["p"]) or not t.turns:
                    trajs.append(t)
                    continue
                ids = list(t.turns[-1].action_ids)
                text = decode_completion(tok, ids[1:], stops) if len(ids) > 1 else ""
                value = float(exact_match_reward(text, g.task))
                trajs.append(dataclasses.replace(t, reward=repaid(t.reward, value)))
            trajs = tuple(trajs)
            out.append(g if trajs == g.trajectories else dataclasses.replace(g, trajectories=trajs))
        return out


# ----------------------------------------------------------------------------- data


@register_fault
class GoldNegativeAnswerUnsigned(Fault):
    """The gold answers are extracted with a number pattern that has no sign (`(\\d+)`), so every
    negative label is stored as its absolute value: "3 - 7" is labelled "4" (the signed-answer
    class of allenai/open-instruct PR#1530, "preserve explicit plus/minus signs when GSM8K extracts
    the final numeric answer for reward verification", with regression tests for "wrong-sign
    mismatches"). Only integer answers below zero change; the prompt is untouched. `subtle`: the
    problems of a fraction `p` of the data (one source file prepared by the old script, fixed per
    problem for the run); `obvious`: every problem. Label data_corruption: the labels the reward
    checks against are wrong for those problems, consistently."""

    name, family, cause, seam = "gold_negative_answer_unsigned", "data", "data_corruption", "label_sign"
    severities = {"subtle": {"p": 0.4}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        out = []
        for p in problems:
            ans = str(p.get("answer", "")).strip()
            if (ans.startswith("-") and ans[1:].isdigit() and int(ans) != 0
                    and self.coin("source", str(p.get("id", ""))) < float(self.p["p"])):
                p = dict(p, answer=ans[1:])
            out.append(p)
        return out


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class AdvantageDiscountedToGo(Fault):
    """The outcome advantage of GRPO is spread over the response as a discounted return with a
    `gamma` below 1 (a discount meant for another estimator is passed to the shared
    cumulative-returns routine): the last response token keeps its advantage, each token before
    it gets gamma times the next one's, so the first tokens of a response get almost none
    (OpenRLHF/OpenRLHF#842, "When the parameter `gamma` passed to this function is not equal to 1,
    it results in a gamma-decayed reward for the per-token advantage"; OpenRLHF#944 asks the
    same). The response of a row is where its advantage is non-zero (a row with advantage 0 stays
    0); its last such position is the end. `subtle`: gamma 0.9; `obvious`: gamma 0.5. Label
    advantage_bug: the rewards are right, the per-token advantages computed from them are not."""

    name, family, cause, seam = "advantage_discounted_to_go", "credit_assignment", "advantage_bug", "advantage_discount"
    severities = {"subtle": {"gamma": 0.9}, "obvious": {"gamma": 0.5}}

    def on_advantages(self, adv_BT, group_B, step):
        nz = adv_BT != 0
        if not bool(nz.any()):
            return adv_BT
        T = adv_BT.shape[-1]
        pos = torch.arange(T, device=adv_BT.device).expand_as(adv_BT)
        end = torch.where(nz, pos, torch.full_like(pos, -1)).max(-1, keepdim=True).values  # last response token
        to_go = (end - pos).clamp(min=0).to(adv_BT.dtype)
        return torch.where(nz, adv_BT * float(self.p["gamma"]) ** to_go, adv_BT)


# ----------------------------------------------------------------------------- loss normaliser


@register_fault
class LossGradAccumMeanOfMeans(Fault):
    """With gradient accumulation, each micro-batch's loss is averaged over its own tokens and the
    micro-batch losses are then averaged (divided by the number of micro-batches), instead of
    every token being divided by the mini-batch's token count: a micro-batch with few tokens
    weighs as much as one with many, so tokens of short micro-batches count more
    (ml-explore/mlx-lm PR#1413: "dividing the sum by K does not equal the gradient of the
    token-mean loss ... the accumulated update is biased toward shorter examples";
    unslothai/unsloth-zoo PR#1023: "compute a separate mean for each microbatch, after which
    `Trainer.training_step` averages those means by the accumulation factor. This overweights
    shorter micr[o-batches]"). Emulated at the micro-batch's loss terms: every term is
    multiplied by N_mini / (K x N_micro) (N: loss tokens, K: the mini-batch's micro-batches under
    `train.micro_batch_tokens`, lowered to 256 so a mini-batch has several). `subtle`: a fraction
    `p` of the mini-batches (one rank of two); `obvious`: every mini-batch. Label loss_norm_bug:
    the loss's normaliser is wrong, the terms it divides are right."""

    name, family, cause, seam = "loss_grad_accum_mean_of_means", "credit_assignment", "loss_norm_bug", "grad_accum_norm"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}
    base = ("train.micro_batch_tokens=256",)

    def install(self, st, cfg, step_fn):
        self._budget = int(cfg.train.micro_batch_tokens)

    def on_norm(self, norm, mini, step):
        self._mini = getattr(self, "_mini", 0) + 1
        self._scale = None
        if self.coin(step, "mini", self._mini) < float(self.p["p"]):
            budget = getattr(self, "_budget", None) or int(mini.attention_mask_BT.shape[-1]) * int(mini.num_seqs)
            k = count_micro_batches(mini.attention_mask_BT.sum(-1).tolist(), budget)
            self._scale = (float(norm.num_tokens), max(k, 1))
        return norm

    def on_loss(self, terms, mb, step):
        if getattr(self, "_scale", None) is None:
            return terms
        n_mini, k = self._scale
        n_mb = float(mb.loss_mask_BT.sum())
        if n_mb <= 0:
            return terms
        f = n_mini / (k * n_mb)
        return {key: (v * f if torch.is_tensor(v) else v) for key, v in terms.items()}


def count_micro_batches(lengths: list[int], budget: int) -> int:
    """How many micro-batches the update splits rows of these lengths into under a token budget: the
    greedy split of tether.train.batching.split_by_token_budget (longest first; a micro-batch's padded
    size, rows x longest, within `budget`; at least one row each), counted here because health/ sits
    below train/ in the layer order (tools/check_layers.py); tests/unit/health/test_faults_fresh10.py
    checks the two agree."""
    k, rows, longest = 0, 0, 0
    for n in sorted(lengths, reverse=True):
        if rows and max(longest, n) * (rows + 1) > budget:
            k, rows, longest = k + 1, 0, 0
        rows, longest = rows + 1, max(longest, n)
    return k + (1 if rows else 0)


# ----------------------------------------------------------------------------- sampler


@register_fault
class SamplerSuppressedTokens(Fault):
    """The rollout engine resolves the sampling settings the trainer leaves unset from the model's
    generation config, and that config carries a `suppress_tokens` list (written for another
    tokenizer of the model family), so the engine never samples those ids while the trainer
    scores the full distribution (NVIDIA-NeMo/RL#3497, "vLLM resolves unset sampling params from
    the model's generation_config.json, not neutral defaults"; vllm-project/vllm PR#12622 made
    this the default, PR#15281 added the warning; verl-project/verl#702; OpenPipe/ART PR#140:
    "Changes to the above changes the logprobs returned from vLLM ... which leads to unstable
    training"; transformers' SuppressTokensLogitsProcessor is what the list drives). The engine
    gets the trainer's current weights every step; its output head's logits of the suppressed
    ids are lowered by 10^4 through the head's bias (added to the engine's copy: tether runs the
    head from its weight and bias, no hook), so they are never sampled and the recorded rollout
    log-probs are those of the renormalised distribution (transformers' processor sets -inf).
    The ids are `k` of the vocabulary drawn per run (the stop and pad ids excluded). `subtle`: 2
    ids; `obvious`: 8 ids. Label rollout_mismatch: the sampler's distribution differs from the
    trainer's; the weights are current."""

    name, family, cause, seam = "sampler_suppressed_tokens", "system", "rollout_mismatch", "engine_generation_config"
    severities = {"subtle": {"k": 2}, "obvious": {"k": 8}}
    SUPPRESSED = -1.0e4  # exp() of it underflows to 0 in fp32; finite, so no NaN in an entropy over the vocabulary

    def suppressed(self, vocab: int, keep: tuple[int, ...]) -> list[int]:
        ids = sorted((i for i in range(vocab) if i not in keep), key=lambda i: self.coin("suppress", i))
        return sorted(ids[: int(self.p["k"])])

    def on_sampler(self, policy, sampling, step):
        model = getattr(policy, "model", None)
        if model is None:
            return policy, sampling
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(model))
            head = self._engine.model.get_output_embeddings()
            w = head.weight
            keep = tuple(policy.stop_ids) + (int(getattr(policy, "pad_id", -1)),)
            self.ids = self.suppressed(int(w.shape[0]), keep)
            self._mask = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
            self._mask[self.ids] = self.SUPPRESSED
            if getattr(head, "bias", None) is None:
                head.bias = torch.nn.Parameter(torch.zeros_like(self._mask), requires_grad=False)
        self._engine.model.load_state_dict(model.state_dict(), strict=False)  # the trainer's head may have no bias
        own = getattr(model.get_output_embeddings(), "bias", None)
        with torch.no_grad():
            head = self._engine.model.get_output_embeddings()
            head.bias.copy_(self._mask if own is None else own.detach().to(self._mask.dtype) + self._mask)
        self._engine.version = policy.version
        return self._engine, sampling


# ----------------------------------------------------------------------------- rollout log-probs


@register_fault
class RolloutLogpTailZeroPadded(Fault):
    """The engine's per-token log-probs come back shorter than the response's token ids (the ids were
    re-derived by re-tokenising the text, or the engine dropped the last entries), and the adapter
    pads the missing tail with 0.0, log(1), silently (vllm-project/vime PR#70:
    "`_align_engine_tokens_and_logprobs` pads missing rollout logprobs with `0.0` -- i.e.
    `log(prob=1.0)` -- and truncates extras, **silently**"; rllm-org/rllm#816: the fallback "pad[s]
    `action_lp` with `0.0` at the tail ... training would use wrong (zeroed) old-logprobs for some
    tokens instead of failing loudly"). The last `m` loss-mask positions of an affected row get a
    rollout log-prob of 0.0; the token ids, the mask, the advantages and the trainer's own
    forward are untouched. `subtle`: the last token of a fraction `p` of the rows (one engine of
    several); `obvious`: the last 2 tokens of every row. Outside the taxonomy: the sampler ran
    the right weights and distribution; only the record of what it computed is wrong for those
    tokens, which no cause names."""

    name, family, cause, seam = "rollout_logp_tail_zero_padded", "system", UNEXPLAINED, "rollout_logp_record"
    severities = {"subtle": {"p": 0.3, "m": 1}, "obvious": {"p": 1.0, "m": 2}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT > 0
        from_end = mask.flip(-1).long().cumsum(-1).flip(-1)  # 1 on a row's last mask position, 2 on the one before
        rows = torch.tensor([self.coin(step, "row", b) < float(self.p["p"]) for b in range(batch.num_seqs)],
                            dtype=torch.bool, device=mask.device)
        tail = mask & (from_end <= int(self.p["m"])) & rows[:, None]
        if not bool(tail.any()):
            return batch
        logp = batch.rollout_logp_BT.masked_fill(tail, 0.0)
        return dataclasses.replace(batch, rollout_logp_BT=logp)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class AdamBiasCorrectionOff(Fault):
    """Adam runs without its bias correction: the optimizer (a fused or CPU variant, or a config
    flag `bias_correction=False` carried over) divides the raw moments, m / (sqrt(v) + eps),
    instead of m / (1 - beta1^t) over sqrt(v / (1 - beta2^t)) (NVIDIA/apex#1124, "Debiasing
    omission in Adam": the fused kernel "doesn't implement 'debiasing'"; ml-explore/mlx PR#1640:
    AdamW without bias correction "causes problems ... whereas the equivalent pytorch
    implementation doesn't"). Early in a run, with beta2 = 0.999, the step is then several times
    the intended one (t = 26: about 5.8x) and shrinks toward it as t grows. Emulated before each
    optimizer step by setting the step counter of the affected tensors' state to 10^6, where both
    corrections are 1 (the moments are untouched). `subtle`: a fraction `p` of the tensors (one
    of several optimizer shards); `obvious`: every tensor. Outside the taxonomy: the learning
    rate, the gradients and the moments are right; the optimizer's arithmetic on its own state
    is not, which no cause names (the mirror of faults/fresh7.py's adam_step_count_reset)."""

    name, family, cause, seam = "adam_bias_correction_off", "optimisation", UNEXPLAINED, "adam_bias_correction"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}
    BIG = 1.0e6

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        i = -1
        for group in optimizer.param_groups:
            for q in group["params"]:
                i += 1
                state = optimizer.state.get(q)
                if not state or "step" not in state or self.coin("tensor", i) >= float(self.p["p"]):
                    continue
                if torch.is_tensor(state["step"]):
                    state["step"].fill_(self.BIG)
                else:
                    state["step"] = self.BIG


@register_fault
class RefPolyakSynced(Fault):
    """The reference policy of the KL term is pulled toward the policy every `every` steps,
    ref <- alpha x policy + (1 - alpha) x ref (a reference-sync option, TR-DPO's and TRL's
    `sync_ref_model` with `ref_model_mixup_alpha` 0.6, or open-instruct PR#642's polyak `alpha`,
    left on in a run meant to keep its reference fixed; aburkov/theLMbook#11: "I'm curious as to
    why the reference model changes with each iteration. According to DeepSeek's paper, it
    appears that it should remain constant"). The KL anchor drifts after the policy, so the
    penalty measures the distance to a recent policy, not to the start. The reference's copy is
    made at the fault's first step; a sync on every `every`-th step from there. With a KL term
    in the loss (`algo.kl.coef=0.1`). `subtle`: alpha 0.6 every 10 steps; `obvious`: alpha 0.6
    every 2 steps. Outside the taxonomy: the KL term is live and computed right, against a
    reference that moves, which no cause names."""

    name, family, cause, seam = "ref_polyak_synced", "optimisation", UNEXPLAINED, "reference_sync"
    severities = {"subtle": {"alpha": 0.6, "every": 10}, "obvious": {"alpha": 0.6, "every": 2}}
    base = KL_BASE

    def on_reference(self, ref, policy, step):
        if ref is None or getattr(ref, "model", None) is None:
            return ref
        if not hasattr(self, "_ref"):
            self._ref = dataclasses.replace(ref, model=copy.deepcopy(ref.model))
            self._synced = None
        if (step - self.start + 1) % int(self.p["every"]) == 0 and self._synced != step:
            self._synced = step
            a = float(self.p["alpha"])
            with torch.no_grad():
                for r, q in zip(self._ref.model.parameters(), policy.model.parameters()):
                    if r.shape == q.shape:
                        r.mul_(1.0 - a).add_(q.detach().to(r.dtype), alpha=a)
        return self._ref
