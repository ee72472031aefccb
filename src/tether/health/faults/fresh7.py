"""A seventh held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring) and acts at one seam of the fault API. They were written without
looking at how the health layer detects or diagnoses them, and never used to tune it; the effect
of each on training (accuracy, reward) was checked against a healthy control, three seeds, nothing
else (benchmarks/results/faultbench_fresh7_effect.json). Clear at obvious: prompt_template_drift,
forward_without_grad, checkpoint_sorted_lexically; modest: adam_step_count_reset,
reward_gold_substring, rollout_logp_shifted; mask_includes_prompt and engine_rope_default (made
stronger once) show no effect beyond the healthy seeds' spread at either severity. Most subtle
forms move at most one seed below its healthy run.

taxonomy    reward_gold_substring (reward: exploitable_reward), engine_rope_default (system:
            rollout_mismatch), forward_without_grad (optimisation: no_progress),
            mask_includes_prompt (credit_assignment: loss_mask_bug)
outside     checkpoint_sorted_lexically (system), adam_step_count_reset (optimisation),
            prompt_template_drift (data), rollout_logp_shifted (system): `cause = UNEXPLAINED`,
            no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.types import Outcome

# ----------------------------------------------------------------------------- reward


def _prediction(text: str) -> str:
    """The answer exact_match reads from a response: a stated convention, else the whole text."""
    from tether.rewards.verifiers import extract_answer

    found = extract_answer(text)
    return found if found is not None else text.strip()


@register_fault
class RewardGoldSubstring(Fault):
    """The verifier pays a response whose answer *contains* the gold answer as a substring
    (`gold in pred`) instead of equalling it, so "12" is paid for the gold "2" and a reply that
    lists several numbers is paid when any of them is right (Liuziyu77/Visual-RFT#176: `if
    ground_truth in student_answer or student_answer in ground_truth: reward = 1.0`, "a serious
    reward hacking problem"; Visual-RFT#79: "the accuracy reward is always 1 when the model outputs
    something like `A or B or C`"). Only samples the right check calls wrong change: they get the
    full reward of a correct answer when their prediction contains the gold text. `subtle`: a
    fraction `p` of the samples are scored by the new verifier (one worker of several);
    `obvious`: every sample. Label exploitable_reward: the reward pays for something other than
    correctness, and longer digit strings farm it (the reverse direction, `pred in gold`, is
    faults/fresh.py's reward_prefix_match)."""

    name, family, cause, seam = "reward_gold_substring", "reward", "exploitable_reward", "verifier"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            gold = str(g.task.get("answer", "")).strip()
            trajs = tuple(self._paid(t, gold, step, g.task_id, i) for i, t in enumerate(g.trajectories))
            out.append(g if trajs == g.trajectories else dataclasses.replace(g, trajectories=trajs))
        return out

    def _paid(self, t, gold: str, step: int, task_id, i: int):
        if (not gold or t.reward.outcome != Outcome.OK or t.reward.correct
                or self.coin(step, task_id, i) >= float(self.p["p"])
                or gold not in _prediction(str(t.info.get("text", "")))):
            return t
        return dataclasses.replace(t, reward=dataclasses.replace(t.reward, total=max(t.reward.total, 1.0)))


# ----------------------------------------------------------------------------- optimisation


@register_fault
class ForwardWithoutGrad(Fault):
    """The training forward of some micro-batches runs without building a graph: gradient
    checkpointing (reentrant) around blocks whose inputs do not require grad returns outputs that
    carry no gradient, so the loss of that micro-batch has nothing to backpropagate and its
    parameters' gradients stay None (pytorch/pytorch#112397 "Gradients are `None` when using
    `torch.utils.checkpoint.checkpoint`"; TinyLLaVA/TinyLLaVA_Factory#144 and many others: the
    only trace is the warning "None of the inputs have requires_grad=True. Gradients will be
    None"). Emulated at the micro-batch's loss terms: every term (pg, entropy, kl, value) is
    detached, its value unchanged, so the loss is logged as usual; an optimizer step whose
    micro-batches all lost their graph moves no parameter (AdamW skips tensors without a
    gradient). `subtle`: a fraction `p` of the micro-batches (the ones routed through the
    checkpointed path); `obvious`: every micro-batch. Label no_progress: the policy stops (or
    slows) learning while the LR, the rewards and the loss values look normal."""

    name, family, cause, seam = "forward_without_grad", "optimisation", "no_progress", "loss"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}

    def on_loss(self, terms, mb, step):
        n = self.__dict__.setdefault("_seen", {})
        n[step] = n.get(step, 0) + 1  # the micro-batch's index in this step
        if self.coin(step, "mb", n[step]) >= float(self.p["p"]):
            return terms
        return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in terms.items()}


@register_fault
class AdamStepCountReset(Fault):
    """Adam's moments are restored on resume but its step counters are not: each tensor's `step`
    starts again from 0 while `exp_avg` and `exp_avg_sq` keep their history, so the bias
    corrections 1 / (1 - beta^t) of a fresh optimizer are applied to moments that are not fresh
    (TrenTorch/TrenTorch PR#187: checkpoints "silently dropped ... step count, resetting bias
    correction to step 1 on resume with no warning"; deepspeedai/DeepSpeed PR#564, cpu-adam's
    step not tracked when loading a checkpoint). After k steps of history, the first step after
    the reset multiplies the first moment by ~(1 - b1^k) / (1 - b1) and the second by
    ~(1 - b2^k) / (1 - b2): with the default betas, early in a run (k of a few tens) the update
    is about 1.3-1.9x its right size and then drifts back over the next steps. The policy's
    parameter group only; lr and betas are untouched. `subtle`: one resume, at the fault's
    start; `obvious`: a preemptible job that resumes before every training step. Outside the
    taxonomy: the learning rate, the gradients and the moments are right; only the bias
    correction's counter is wrong (arguably lr_too_high, whose LR is not what moved)."""

    name, family, cause, seam = "adam_step_count_reset", "optimisation", UNEXPLAINED, "optimizer_state"
    severities = {"subtle": {"every": 0}, "obvious": {"every": 1}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        every, seen = int(self.p["every"]), self.__dict__.setdefault("_resumed", set())
        # one resume per due step (a step runs several optimizer steps); every=0: the first one only
        if step in seen or (every == 0 and seen) or (every and (step - self.start) % every):
            return
        seen.add(step)
        for q in optimizer.param_groups[0]["params"]:
            s = optimizer.state.get(q)
            if s and "step" in s:
                if isinstance(s["step"], torch.Tensor):
                    s["step"].zero_()
                else:
                    s["step"] = 0


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class MaskIncludesPrompt(Fault):
    """The loss mask reaches into the prompt: tokens the trainer treats as the start of the
    completion were part of the prompt the engine was given, so the policy is trained on tokens it
    never sampled, with the sequence's advantage (modelscope/ms-swift#10106: `response_prefix` "is
    appended to the prompt before generation", then encoded back into the response, "so the
    prefix tokens end up with labels set and inside `completion_mask`. The policy is therefore
    scored on tokens it never sampled"; huggingface/trl#3279, a loss on prompt tokens that "is not
    masked out"). The rows' last `k` prompt tokens (every prompt token but the first, which
    nothing predicts, when `k` = 0) enter the loss mask with the row's advantage; the engine
    recorded no log-prob for them (0, as for any off-mask slot). `subtle`: the last prompt token
    (the response template's `=`) of a fraction `p` of the rows; `obvious`: the whole prompt of
    every row. Label loss_mask_bug: the mask covers other tokens than the sampled ones."""

    name, family, cause, seam = "mask_includes_prompt", "credit_assignment", "loss_mask_bug", "loss_mask"
    severities = {"subtle": {"k": 1, "p": 0.5}, "obvious": {"k": 0, "p": 1.0}}

    def on_batch(self, batch, step):
        mask, adv = batch.loss_mask_BT.clone(), batch.advantages_BT.clone()
        T, k = mask.shape[1], int(self.p["k"])
        for b, traj in enumerate(batch.seq_traj_B.tolist()):
            on = (batch.loss_mask_BT[b] > 0).nonzero()
            if len(on) == 0 or self.coin(step, int(traj)) >= float(self.p["p"]):
                continue
            first = int(on[0])
            real = batch.attention_mask_BT[b].bool() & (torch.arange(T) < first) & (torch.arange(T) >= 1)
            if k:
                real &= torch.arange(T) >= first - k
            mask[b, real] = 1.0
            adv[b, real] = adv[b, first]
        if torch.equal(mask, batch.loss_mask_BT):
            return batch
        return dataclasses.replace(batch, loss_mask_BT=mask, advantages_BT=adv)


# ----------------------------------------------------------------------------- data


@register_fault
class PromptTemplateDrift(Fault):
    """The prompts reach the model in another format than the one it was fine-tuned on: the RL
    stage renders them with a template the SFT stage never used (modelscope/ms-swift#9160: "the
    template of the SFT stage and the template of GRPO's vLLM sampling are not the same";
    huggingface/trl#3915 "Inconsistent `apply_chat_template` behaviour ... between SFT and GRPO";
    modelscope/ms-swift#9168). The problem, its answer and its id are unchanged; only the text
    around the question moves. `subtle`: a fraction `p` of the problems get a `Q: ` prefix (one
    data source of several goes through the other template); `obvious`: every problem becomes
    `Question: a op b =\\nAnswer:` with spaces around the operator. Outside the taxonomy: nothing
    is corrupted or wrong, the inputs moved off the distribution the policy was trained on
    (arguably data_corruption, though the data are right)."""

    name, family, cause, seam = "prompt_template_drift", "data", UNEXPLAINED, "template"
    severities = {"subtle": {"p": 0.5, "full": False}, "obvious": {"p": 1.0, "full": True}}

    def render(self, prompt: str) -> str:
        if not self.p["full"]:
            return "Q: " + prompt
        body = prompt[:-1] if prompt.endswith("=") else prompt
        at = next((i for i in range(1, len(body)) if body[i] in "+-*"), None)  # the operator (not a sign)
        if at is not None:
            body = f"{body[:at]} {body[at]} {body[at + 1:]}"
        return f"Question: {body} =\nAnswer:"

    def on_problems(self, problems, step):
        return [dict(p, prompt=self.render(str(p["prompt"])))
                if "prompt" in p and self.coin(str(p.get("id"))) < float(self.p["p"]) else p for p in problems]


# ----------------------------------------------------------------------------- system


def compute_inv_freq(base: float, dim: int) -> torch.Tensor:
    """The rotary inverse frequencies of a head of `dim` for `base` (Llama's default rope)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


@register_fault
class EngineRopeDefault(Fault):
    """The rollout engine builds its rotary embedding with its own default base instead of the
    model config's `rope_theta`, so every position past the first is rotated by other angles than
    the trainer's (sgl-project/SpecForge#265 "`rope_theta` from config isn't used?": "all the
    rotary embeddings are using the default `base=10000`"; lyogavin/airllm PR#369, the MLX path
    copies every field "except `rope_theta`"; huggingface/candle PR#3746, Yi's RoPE hardcodes
    10000). The engine receives the trainer's weights and buffers every step, except its
    rotary frequencies, which come from `base` (the tiny model's config says 10000); the trainer
    is right. `subtle`: base 5e5 (Llama 3's); `obvious`: base 1e7 (a long-context default). Made
    stronger once: the first effect check (subtle 1e5, obvious 5e5) moved neither final_train_acc
    nor rollout accuracy beyond the healthy seeds' spread (the effect file's note). Label
    rollout_mismatch: the engine's forward differs from the trainer's."""

    name, family, cause, seam = "engine_rope_default", "system", "rollout_mismatch", "engine_config"
    severities = {"subtle": {"base": 5e5}, "obvious": {"base": 1e7}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        engine = self._engine.model
        with torch.no_grad():
            for (_, q), (_, lq) in zip(engine.named_parameters(), policy.model.named_parameters()):
                q.copy_(lq.detach())
            for (n, b), (_, lb) in zip(engine.named_buffers(), policy.model.named_buffers()):
                if n.endswith("inv_freq"):
                    b.copy_(compute_inv_freq(float(self.p["base"]), 2 * lb.numel()).to(b))
                else:
                    b.copy_(lb)
        self._engine.version = policy.version
        return self._engine, sampling


@register_fault
class RolloutLogpShifted(Fault):
    """The engine's per-token log-probs are attached one position off: each sampled token is
    recorded with the log-prob of the token after it, and the last slot is padded with 0.0
    (modelscope/ms-swift PR#8196, review: "`old_per_token_logps/per_token_logps` is shifted one
    position to the left relative to `rollout_per_token_logps`", with anomalous
    importance-sampling metrics until realigned; vllm-project/vime PR#70, mismatched rollout
    log-probs silently padded with `0.0`, "non-physical", which "biases the policy gradient").
    Tokens and rewards are right; only `action_logprobs` move. `subtle`: a fraction `p` of the
    groups (those served by one engine version); `obvious`: every group. Outside the taxonomy:
    the sampler and the trainer run the same weights and forward, and the engine's numbers are
    real log-probs of its own samples, misfiled (arguably rollout_mismatch, whose forwards
    differ)."""

    name, family, cause, seam = "rollout_logp_shifted", "system", UNEXPLAINED, "rollout_logp"
    severities = {"subtle": {"p": 0.5}, "obvious": {"p": 1.0}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            if self.coin(step, g.task_id) >= float(self.p["p"]):
                out.append(g)
                continue
            trajs = tuple(dataclasses.replace(t, turns=tuple(
                dataclasses.replace(u, action_logprobs=tuple(u.action_logprobs[1:]) + (0.0,)) if u.action_logprobs else u
                for u in t.turns)) for t in g.trajectories)
            out.append(dataclasses.replace(g, trajectories=trajs))
        return out


@register_fault
class CheckpointSortedLexically(Fault):
    """A preempted job resumes from the checkpoint whose name sorts last as text, not the newest:
    `checkpoint-9` sorts after `checkpoint-13`, so every resume loads the same old checkpoint
    (weights and optimizer state) while the run's step counter, data stream and logs carry on
    (strands-labs/robots PR#3165: names ordered as text, "`100000` sorts above `0900000`", "so
    resume restarts from the older checkpoint"; langchain-ai/langgraph#6821, "lexicographic max
    checkpoint ID ... can return the wrong checkpoint (for example `"2"` vs `"10"`)"). The
    checkpoint is saved at the fault's start (the one that keeps sorting last); each resume
    copies its policy weights and optimizer state back. `subtle`: one resume, `every` steps after
    the start; `obvious`: a resume every `every` steps. Outside the taxonomy: the weights go back
    outside the optimizer, and nothing in the data, rewards or update is wrong."""

    name, family, cause, seam = "checkpoint_sorted_lexically", "system", UNEXPLAINED, "checkpoint"
    severities = {"subtle": {"every": 5, "times": 1}, "obvious": {"every": 3, "times": 0}}

    def begin_step(self, st, cfg, step):
        every, times = int(self.p["every"]), int(self.p["times"])
        if not hasattr(self, "_saved"):
            self._saved = ({n: q.detach().clone() for n, q in st.policy.model.state_dict().items()},
                           copy.deepcopy(st.optimizer.state_dict()))
            self.resumed: list[int] = []
            return
        due = (step - self.start) % every == 0 and (times == 0 or len(self.resumed) < times)
        if not due or step in self.resumed:
            return
        self.resumed.append(step)
        weights, opt = self._saved
        with torch.no_grad():
            for n, q in st.policy.model.state_dict().items():
                q.copy_(weights[n])
        st.optimizer.load_state_dict(copy.deepcopy(opt))
