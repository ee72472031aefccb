"""An eighth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring) and acts at one seam of the fault API. They were written without
looking at how the health layer detects or diagnoses them, and never used to tune it; the effect
of each on training (accuracy, reward) was checked against a healthy control, three seeds, nothing
else (benchmarks/results/faultbench_fresh8_effect.json: reward_call_broadcast,
gold_answer_digit_pattern, adam_moments_low_precision and grad_clip_per_tensor move training beyond
the healthy seeds' spread at obvious, not at subtle; norm_counts_padding, length_cap_counts_prompt,
grad_sign_compressed and loss_mask_position_weighted show no effect beyond that spread at either
severity and were kept as written; gold_answer_digit_pattern was strengthened once, see its
docstring).

taxonomy    reward_call_broadcast (reward: misaligned_reward), gold_answer_digit_pattern
            (data: data_corruption), norm_counts_padding (credit_assignment: loss_norm_bug),
            length_cap_counts_prompt (system: truncation)
outside     adam_moments_low_precision (optimisation), grad_clip_per_tensor (optimisation),
            grad_sign_compressed (optimisation), loss_mask_position_weighted (credit_assignment):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import dataclasses
import re

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardCallBroadcast(Fault):
    """A reward function called on a chunk of completions returns one value instead of one per
    completion, and the caller broadcasts it to every completion of the call (huggingface/trl
    PR#6534, fixing #6533: "a reward function that returns a single value produces a `(1,)` tensor
    that PyTorch silently broadcasts to every completion, so a broken reward function corrupts
    training with no warning"). The step's samples are taken in order and cut into calls of
    `chunk`; in an affected call every sample gets the first sample's whole RewardResult (total,
    components, verdict). A call of 4 is half a group of 8, so groups keep some variance (between
    their halves). `subtle`: a fraction `p` of the calls (one reward function of several, taking
    one code path); `obvious`: every call. Label misaligned_reward: a real score, attached to
    samples it was not computed for."""

    name, family, cause, seam = "reward_call_broadcast", "reward", "misaligned_reward", "reward_batching"
    severities = {"subtle": {"chunk": 4, "p": 0.3}, "obvious": {"chunk": 4, "p": 1.0}}

    def on_rollouts(self, groups, step):
        slots = [(gi, i) for gi, g in enumerate(groups) for i in range(len(g.trajectories))]
        size = max(int(self.p["chunk"]), 1)
        moved = {}
        for c, lo in enumerate(range(0, len(slots), size)):
            chunk = slots[lo:lo + size]
            if self.coin(step, "call", c) < float(self.p["p"]):
                first = groups[chunk[0][0]].trajectories[chunk[0][1]].reward
                moved.update({s: first for s in chunk[1:]})
        out = []
        for gi, g in enumerate(groups):
            trajs = tuple(dataclasses.replace(t, reward=moved[(gi, i)]) if (gi, i) in moved else t
                          for i, t in enumerate(g.trajectories))
            out.append(g if trajs == g.trajectories else dataclasses.replace(g, trajectories=trajs))
        return out


# ----------------------------------------------------------------------------- data

_NUMBER = re.compile(r"^\s*-?(\d)\d*\s*$")


@register_fault
class GoldAnswerDigitPattern(Fault):
    """The gold answers are extracted from the dataset with a number pattern that has no sign and
    reads one digit, so a negative label loses its minus sign and a multi-digit label keeps only
    its first digit ("-3" becomes "3", "81" becomes "8") while the prompt is unchanged
    (allenai/open-instruct PR#1530 "Fix GSM8K reward parsing for signed answers": "preserve
    explicit plus/minus signs when GSM8K extracts the final numeric answer ... wrong-sign
    mismatches"; modelscope/ms-swift PR#10163: the pattern `[0-1](?:\\.\\d+)?` "reads `Reward: 10` as
    1 ... and cannot parse negative scores"). Strengthened once: the first effect check had the
    sign loss alone (`gold_answer_unsigned`), which never fires on the benchmark's task (its
    subtraction puts the larger operand first: no answer is negative) and left every run identical
    to its healthy seed; the one-digit read of the ms-swift report was added. Only integer answers
    with a sign or more than one digit change; the rest pass through. `subtle`: a fraction `p` of
    those problems (one data source of several goes through the faulty extractor); `obvious`: all
    of them. Label data_corruption: the labels the reward checks against are wrong for those
    problems."""

    name, family, cause, seam = "gold_answer_digit_pattern", "data", "data_corruption", "answer_parse"
    severities = {"subtle": {"p": 0.4}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        out = []
        for p in problems:
            ans = str(p.get("answer", ""))
            m = _NUMBER.match(ans)
            if m and m.group(1) != ans.strip() and self.coin(p.get("id")) < float(self.p["p"]):  # a problem's source is fixed
                p = dict(p, answer=m.group(1))
            out.append(p)
        return out


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class NormCountsPadding(Fault):
    """The token-mean loss is divided by a count that includes positions outside the loss mask:
    `subtle` counts every real (attention-mask) token of the mini-batch, prompt included;
    `obvious` counts every position of the padded [B, T] mini-batch, padding included (d2l-ai/d2l-en
    PR#2707: `.mean(dim=1)` "divides each sample's loss by `num_steps` (the full sequence length),
    including padding positions whose weight is 0. The result is artificially small by a factor
    proportional to the padding fraction"; meta-pytorch/torchtune PR#1875 "Normalize CE loss by
    total number of (non-padding) tokens"). Only `num_tokens` changes (`num_seqs`, `max_len`
    stay): the gradient shrinks by a factor that varies with the batch's prompt and padding share,
    step by step. Label loss_norm_bug: the loss's normaliser is wrong; the mask, the advantages
    and the log-probs are right."""

    name, family, cause, seam = "norm_counts_padding", "credit_assignment", "loss_norm_bug", "normaliser"
    severities = {"subtle": {"count": "attention"}, "obvious": {"count": "padded"}}

    def on_norm(self, norm, mini, step):
        if self.p["count"] == "padded":
            n = float(mini.attention_mask_BT.numel())
        else:
            n = float(mini.attention_mask_BT.sum())
        return dataclasses.replace(norm, num_tokens=max(n, norm.num_tokens))


@register_fault
class LossMaskPositionWeighted(Fault):
    """The loss mask handed to the loss is the running count of the mask along the sequence
    (`mask.cumsum(-1)`, the idiom that builds position ids) instead of the mask itself
    (alibaba/ChatLearn PR#341 "[bugfix] fix position_ids and loss_mask computation", the two
    computed together and mixed up). The weights are kept on the mask's support (the sampled
    tokens; a cumsum would also leave the last count on the padding after a row's response):
    token k of a row's response weighs k (`subtle`:
    1 + (k - 1) x `slope`, a partial mix-up; `obvious`: k). The normaliser is computed from the
    weighted mask (the update computes it after this seam). Outside the taxonomy: the mask covers
    exactly the sampled tokens and each token's credit has the right sign; what is wrong is a
    per-position weight that grows along the response, which no cause names."""

    name, family, cause, seam = "loss_mask_position_weighted", "credit_assignment", UNEXPLAINED, "token_weights"
    severities = {"subtle": {"slope": 0.25}, "obvious": {"slope": 1.0}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT
        k = mask.cumsum(-1)
        w = (1.0 + (k - 1.0) * float(self.p["slope"])) * (mask > 0)
        return dataclasses.replace(batch, loss_mask_BT=w.to(mask.dtype))


# ----------------------------------------------------------------------------- system


def _prompt_tokens(policy, prompt: str) -> int:
    tok = getattr(policy, "tokenizer", None)
    if tok is None:
        return len(prompt)
    return len(tok.encode(prompt, add_special_tokens=False))


@register_fault
class LengthCapCountsPrompt(Fault):
    """The engine is given a total-length cap (prompt + response) with the value meant for the
    response alone, so the response budget of the step's batch becomes the cap minus its longest
    prompt (the `max_length` / `max_new_tokens` confusion: meta-llama/llama#993, where one
    `total_len` "set as ... min(params.max_seq_len, max_gen_len + max_prompt_len)" decides every
    prompt's budget of the batch; huggingface/text-generation-inference#65, "input_length +
    max_new_tokens" against one total limit). Answers longer than the budget are cut (and scored
    as cut). The prompts' length is their token count under the policy's tokenizer. `subtle`: the
    cap is the response budget + `slack` tokens (a cap that was raised a little but still counts
    the prompt); `obvious`: the response budget itself. At least one token is always left."""

    name, family, cause, seam = "length_cap_counts_prompt", "system", "truncation", "engine_limits"
    severities = {"subtle": {"slack": 3}, "obvious": {"slack": 0}}

    def on_problems(self, problems, step):
        self._prompts = [str(p.get("prompt", "")) for p in problems]
        return problems

    def on_sampler(self, policy, sampling, step):
        longest = max((_prompt_tokens(policy, p) for p in getattr(self, "_prompts", [])), default=0)
        cap = int(sampling.max_new_tokens) + int(self.p["slack"])
        budget = max(1, min(int(sampling.max_new_tokens), cap - longest))
        return policy, sampling.model_copy(update={"max_new_tokens": budget})


# ----------------------------------------------------------------------------- optimisation


def _policy_grads(optimizer) -> list[torch.Tensor]:
    return [q for q in optimizer.param_groups[0]["params"] if q.grad is not None]


@register_fault
class GradClipPerTensor(Fault):
    """Gradient clipping is applied tensor by tensor (each tensor's gradient scaled to a norm of
    at most `max_norm`) instead of on the global norm (huggingface/transformers PR#614, fixing
    #581: "norm-based gradient clipping was being done per param group ... different from global
    norm grad clipping"; clab/dynet#1374 "dynet clips gradients separately for each parameters";
    NYUMedML/headCT_foundation#3, a `clip_gradients` that "performs clipping per parameter"). The
    run's own global clip still follows, so the update's size stays bounded; what changes is the
    direction: every tensor whose gradient is larger than `max_norm` is shrunk to it, the others
    keep theirs, and the large tensors lose their share. The policy's parameter group only.
    `subtle`: `max_norm` 0.1; `obvious`: 0.01 (a per-tensor value set as if it were the global
    one of a model with many tensors). Outside the taxonomy: every gradient is a correct
    gradient of a correct loss, rescaled per tensor, which no cause names."""

    name, family, cause, seam = "grad_clip_per_tensor", "optimisation", UNEXPLAINED, "grad_clip"
    severities = {"subtle": {"max_norm": 0.1}, "obvious": {"max_norm": 0.01}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        cap = float(self.p["max_norm"])
        for q in _policy_grads(optimizer):
            n = float(q.grad.norm())
            if n > cap:
                q.grad.mul_(cap / (n + 1e-6))


@register_fault
class GradSignCompressed(Fault):
    """The gradients go through a 1-bit compression (each element's sign, times the tensor's mean
    absolute value) with no error feedback, so the compression error is dropped every step
    instead of carried to the next (pytorch/pytorch PR#48670, gradient compression that needs
    "an optional error feedback for PowerSGD -- storing the difference (i.e., the local error
    caused by compression) between the input gradient ... and the gradient after decompression,
    and reinserting it at the next iteration"; deepspeedai/DeepSpeed PR#353, 1-bit Adam's
    `compensated_server_m` error compensation; jasperzhong/read-papers-and-code#37 on "Error
    Feedback Fixes SignSGD": pure sign "loses magnitude" and may not converge). Per tensor: g ->
    sign(g) x mean|g|. The policy's parameter group only. `subtle`: a fraction `p` of the tensors
    (the buckets that go through the compressed path); `obvious`: every tensor. Outside the
    taxonomy: the gradient's signs are right and its scale is right per tensor, but the
    per-element magnitudes are gone, which no cause names."""

    name, family, cause, seam = "grad_sign_compressed", "optimisation", UNEXPLAINED, "grad_comm"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        for i, q in enumerate(_policy_grads(optimizer)):
            if self.coin("tensor", i) < float(self.p["p"]):  # a tensor's bucket is fixed for the run
                q.grad.copy_(torch.sign(q.grad) * q.grad.abs().mean())


@register_fault
class AdamMomentsLowPrecision(Fault):
    """Adam's moments (exp_avg, exp_avg_sq) are stored in a low-precision type and rounded to it
    after every update (NVIDIA-NeMo/Automodel PR#2248: "the AdamW EMA buffers (`exp_avg` and
    `exp_avg_sq`) are also stored in bf16 ... bf16 has only a 7-bit mantissa, so small EMA updates
    can be rounded away even though the values themselves are still in range. Symptoms range from
    silent degradation - slower convergence"; meta-pytorch/torchtune#2254 "Very bad convergence
    with bf16"). The rounding is applied before each optimizer step to the moments the previous
    steps left, so each new step starts from rounded moments. The policy's parameter group only;
    lr, betas and step counts are untouched. `subtle`: bfloat16; `obvious`: float8 e4m3 (3
    mantissa bits, an 8-bit optimizer state without its per-block scales; values past its range
    saturate). Outside the taxonomy: nothing is non-finite and the gradients are right; the
    optimizer's memory loses precision, which no cause names."""

    name, family, cause, seam = "adam_moments_low_precision", "optimisation", UNEXPLAINED, "optimizer_state"
    severities = {"subtle": {"dtype": "bfloat16"}, "obvious": {"dtype": "float8_e4m3fn"}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        dt = getattr(torch, str(self.p["dtype"]))
        top = torch.finfo(dt).max
        for q in optimizer.param_groups[0]["params"]:
            s = optimizer.state.get(q) or {}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in s:
                    s[key].copy_(s[key].clamp(-top, top).to(dt).to(s[key].dtype))
