"""A twelfth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring; where no report of the exact mechanism was found, that is said) and acts
at one seam of the fault API, eight different seams. They were written without looking at how the
health layer detects or diagnoses them, and never used to tune it; the effect of each on training
(accuracy, reward) was checked against a healthy control, nothing else
(benchmarks/results/faultbench_fresh12_effect.json). Five of them name a cause of the taxonomy,
three are outside it (the labels were taken from the cause list's names and families only).

Beyond the healthy seeds' spread (final train accuracy 0.375-0.473, rollout accuracy 0.352-0.421
over steps 24-30; 30 steps, faults from step 13, seeds 0-2): rollout_n_not_forwarded at both
severities (obvious 0.186-0.266, subtle 0.232-0.291), trainer_dropout_left_on at both (obvious
0.248-0.307; subtle 0.320-0.344, its rollout accuracy 0.334-0.346 under the band at every seed),
loader_prompts_repeated_before_sampling at obvious (0.219-0.328; subtle 0.377-0.428 inside, but its
rollout accuracy 0.321-0.329 under the band at every seed), optimizer_step_skipped_on_overflow at
obvious (0.320-0.336; subtle 0.361-0.375, at the band's edge, rollout accuracy 0.338-0.344 just
under) and rollouts_trained_from_stale_queue at obvious (0.207-0.342; subtle 0.291-0.398, two seeds
under). No effect, kept as written: advantage_clipped_at_ratio_range (obvious 0.334-0.416, one seed
under; subtle 0.375-0.432), eos_replaced_by_pad_in_trainer_batch (obvious 0.379-0.400; subtle
0.342-0.428, one seed under: its stop decision is no longer trained, but probably the SFT start
already stops after its short answers) and old_logp_from_previous_step_buffer (obvious
0.354-0.410, subtle 0.342-0.443, one seed under at each). No kind has its own base overrides (the
healthy control is each one's counterfactual); no kind crashed and none was changed after its runs.

taxonomy    rollout_n_not_forwarded (data: no_signal), loader_prompts_repeated_before_sampling
            (data: duplicate_problems), trainer_dropout_left_on (system: rollout_mismatch),
            optimizer_step_skipped_on_overflow (optimisation: no_progress),
            advantage_clipped_at_ratio_range (credit_assignment: advantage_bug)
outside     rollouts_trained_from_stale_queue (system), eos_replaced_by_pad_in_trainer_batch (system),
            old_logp_from_previous_step_buffer (credit_assignment):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault

FRESH12 = ("rollout_n_not_forwarded", "loader_prompts_repeated_before_sampling", "trainer_dropout_left_on",
           "optimizer_step_skipped_on_overflow", "advantage_clipped_at_ratio_range",
           "rollouts_trained_from_stale_queue", "eos_replaced_by_pad_in_trainer_batch",
           "old_logp_from_previous_step_buffer")

# ----------------------------------------------------------------------------- run settings


@register_fault
class RolloutNNotForwarded(Fault):
    """The number of samples per prompt never reaches the rollout engine: the engine's own `n`
    (default 1, or a small value from another config block) is used instead of the configured
    group size, so every group holds one or two samples and GRPO's group-relative advantage is
    zero for every group of one and for every group of two that agrees
    (google/tunix#122: "`RolloutConfig.n` doesn't seem to be used by `VanillaRollout.generate()` ...
    always returning a single response for a given prompt"; GAIR-NLP/ToRL#14: "this param was set to
    1 in rollout ... only one rollout per question is actually considered"). From the fault's first
    step the run-settings value `rollout.n` is set to `n` (a config fault, put in force once and
    logged as a settings change); the number of problems per step is unchanged. `subtle`: n 2;
    `obvious`: n 1. Label no_signal: the groups carry no reward variance to learn from."""

    name, family, cause, seam = "rollout_n_not_forwarded", "data", "no_signal", "group_size_config"
    severities = {"subtle": {"n": 2}, "obvious": {"n": 1}}

    def begin_step(self, st, cfg, step):
        if getattr(self, "_done", False):
            return
        self._done = True
        self.set(st, "rollout.n", int(self.p["n"]))


# ----------------------------------------------------------------------------- data loader


@register_fault
class LoaderPromptsRepeatedBeforeSampling(Fault):
    """The prompt batch is repeated before it reaches a sampler that repeats it again: the loader
    (or the trainer) expands each problem `k` times for the group, and the engine then samples `n`
    per prompt as well, so one problem fills `k` groups of the step while the step's budget of
    problems is unchanged: a step trains on `P / k` distinct problems, each `k` times over
    (verl-project/verl PR#2881: the HF rollout used `num_return_sequences=n` on a batch already
    repeated by the trainer, "so the original code in huggingface rollout will generate n^2
    responses for each prompt"; SkyworkAI/Skywork-OR1#48: "Wouldn't this extra repeat cause each
    prompt to be evaluated by n * n times?"). Emulated at the loader: of the P problems it hands out,
    the first ceil(P / k) are kept and each is repeated `k` times in place (copies), cut to P; the
    others of the step are never seen. `subtle`: k 2; `obvious`: k 8 (four distinct problems a
    step). Label duplicate_problems: the same problem several times in one step."""

    name, family, cause, seam = "loader_prompts_repeated_before_sampling", "data", "duplicate_problems", "prompt_repeat"
    severities = {"subtle": {"k": 2}, "obvious": {"k": 8}}

    def on_problems(self, problems, step):
        k = int(self.p["k"])
        return [dict(problems[i // k]) for i in range(len(problems))]


# ----------------------------------------------------------------------------- the trainer's forward


@register_fault
class TrainerDropoutLeftOn(Fault):
    """Dropout is left on in the trainer's gradient forward (the model is in train mode with a
    config that carries a dropout rate), while the sampler and the no-grad scoring of pi_old run
    without it: the loss's log-probs are noisy and the PPO ratio is not 1 on the first mini-batch
    (huggingface/trl PR#3234, "[GRPO] Adds option to disable dropout", quoting: "with dropout
    activated, the log probabilities of tokens will not be reproducible ... causing the ratios of the
    PPO to be not 1s during the first epoch, causing PPO optimization problems"; huggingface/trl#744
    and PR#1540 on disabling dropout for the policy and reference). Emulated with forward hooks
    on every decoder layer's `mlp` and `self_attn` (their outputs: the residual-branch dropout of
    GPT-2-style models) that drop each element with probability `p` and scale the rest by 1/(1-p),
    only while gradients are on and the fault is active; the masks come from the fault's own
    generator (the run's RNGs are untouched). `subtle`: p 0.1; `obvious`: p 0.3. Label
    rollout_mismatch: a trainer-only layer, the sampler's forward differs from the trainer's."""

    name, family, cause, seam = "trainer_dropout_left_on", "system", "rollout_mismatch", "train_mode_dropout"
    severities = {"subtle": {"p": 0.1}, "obvious": {"p": 0.3}}
    TARGETS = ("mlp", "self_attn")

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "_gen"):
            self._gen = torch.Generator().manual_seed(int(self.coin("dropout") * 2**62))
        p = float(self.p["p"])
        keep = (torch.rand(x.shape, generator=self._gen) >= p).to(device=x.device, dtype=x.dtype)
        return x * keep / (1.0 - p)

    def hooked(self, model, step_fn) -> int:
        """Put the dropout hooks on `model`; returns how many."""
        def hook(module, args, out):
            if not (torch.is_grad_enabled() and self.active(step_fn())):
                return out
            if isinstance(out, tuple):
                return (self.dropout(out[0]),) + tuple(out[1:])
            return self.dropout(out)

        n = 0
        for name, mod in model.named_modules():
            if name.rsplit(".", 1)[-1] in self.TARGETS:
                mod.register_forward_hook(hook)
                n += 1
        return n

    def install(self, st, cfg, step_fn):
        model = getattr(getattr(st, "policy", None), "model", None)
        self.hooks = 0 if model is None else self.hooked(model, step_fn)


# ----------------------------------------------------------------------------- the optimizer step


@register_fault
class OptimizerStepSkippedOnOverflow(Fault):
    """Mixed-precision training whose dynamic loss scaler keeps finding an overflow: the optimizer
    step is skipped (the gradients are dropped, Adam's state and step count do not move) while the
    learning-rate scheduler and the training loop carry on and the run logs nothing alarming
    (deepspeedai/DeepSpeed#697, "Model doesn't learn with fp16.enabled = true: [Rank 0] Overflow
    detected. Skipping step. Attempted loss scale: 1, reducing to 1"; deepspeedai/DeepSpeed#931,
    `step=10, skipped=6`). Before each optimizer step, with probability `p` (a fixed draw per step
    and call), every parameter's gradient is set to None, so torch's optimizer skips every tensor;
    the scheduler still steps. `subtle`: p 0.6 (the scale recovers now and then); `obvious`: p 1.0
    (the scale is stuck at its minimum). Label no_progress: the update never reaches the weights."""

    name, family, cause, seam = "optimizer_step_skipped_on_overflow", "optimisation", "no_progress", "loss_scaler"
    severities = {"subtle": {"p": 0.6}, "obvious": {"p": 1.0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        self._calls = getattr(self, "_calls", 0) + 1
        if self.coin("skip", step, self._calls) >= float(self.p["p"]):
            return
        self.skipped = getattr(self, "skipped", 0) + 1
        for group in optimizer.param_groups:
            for q in group["params"]:
                q.grad = None


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class AdvantageClippedAtRatioRange(Fault):
    """The advantages are clipped to [-c, c] with `c` taken from the PPO ratio's clip range (0.2)
    instead of the advantage clip it was meant for (a bound of the order of 5-10 standard deviations
    that never bites): almost every non-zero advantage is cut to +-c, so a rare correct answer in a
    group of wrong ones is paid no more than each wrong one is charged, and the size of the learning
    signal no longer follows how surprising the outcome was. The advantage-clip knob is real
    (kvablack/ddpo-pytorch#12: `advantages = torch.clamp(sample["advantages"], -adv_clip_max,
    adv_clip_max)` next to `clip_range`); clip ranges mixed up between their two conventions are too
    (ChenmienTan/RL2 PR#21: "Clip range should be [1 - eps, 1 + eps], not [eps, 1 + eps]"); no report
    of this exact mix-up was found. Emulated at the advantages: `adv.clamp(-c, c)` on every
    position (zeros stay zero). `subtle`: c 0.5; `obvious`: c 0.2. Label advantage_bug: the
    estimator's output is wrong while the rewards and the mask are right. On the benchmark's task it
    did not move training beyond the healthy spread at either severity (three seeds; kept as
    written: the advantages keep their signs, and Adam probably undoes much of their scale)."""

    name, family, cause, seam = "advantage_clipped_at_ratio_range", "credit_assignment", "advantage_bug", "advantage_clip"
    severities = {"subtle": {"c": 0.5}, "obvious": {"c": 0.2}}

    def on_advantages(self, adv_BT, group_B, step):
        c = float(self.p["c"])
        return adv_BT.clamp(-c, c)


# ----------------------------------------------------------------------------- rollout queue


@register_fault
class RolloutsTrainedFromStaleQueue(Fault):
    """The rollout queue between the sampler and the trainer is consumed oldest-first while the
    sampler runs ahead, so each step trains on groups sampled `delay` steps earlier, by an older
    policy, with their own (consistent) rewards and log-probs, while the fresh groups wait in the
    queue (radixark/miles PR#2030: "FIFO consumption means training always eats the oldest, stalest
    data — with no bound and no visibility"; agentscope-ai/Trinity-RFT PR#382: "For FIFO queue: if
    trainer is slower than explorer, the queue will become longer and longer ... staleness of
    samples for training also keep increasing"). Each step's groups go into a queue; once it holds
    more than `delay` batches the oldest is taken out and trained on; until then the oldest one in
    the queue is trained on again (the first faulty step's groups, `delay` + 1 times in all).
    `subtle`: delay 1; `obvious`: delay 4. Outside the taxonomy: the engine's weights are current
    and every record is right; the trainer is handed data from an older policy, which no cause
    names."""

    name, family, cause, seam = "rollouts_trained_from_stale_queue", "system", UNEXPLAINED, "rollout_queue"
    severities = {"subtle": {"delay": 1}, "obvious": {"delay": 4}}

    def on_rollouts(self, groups, step):
        if not hasattr(self, "_queue"):
            self._queue = []
        self._queue.append(list(groups))
        if len(self._queue) > int(self.p["delay"]):
            return self._queue.pop(0)
        return list(self._queue[0])


# ----------------------------------------------------------------------------- the loss's inputs


@register_fault
class EosReplacedByPadInTrainerBatch(Fault):
    """The trainer's batch carries the pad id where the sampler emitted its stop token: the collate
    step that builds the targets appends or writes the pad token at the end of each response (or
    rewrites stop ids as padding because the two were once the same token), so the loss trains the
    pad token at the position where the policy sampled the end of its answer, and the stop token is
    never reinforced or discouraged (ludwig-ai/ludwig PR#3945: "we used pad token at the end of
    target tensor ... during generation, Gemma cannot produce an eos token, so generation never
    stops"; mlabonne/llm-course#33 and huggingface/alignment-handbook#127 for the pad == eos form).
    In a fraction `p` of the rows (drawn per step and row), every position in the loss mask whose id
    is one of the policy's stop ids gets the pad id; the mask, advantages and rollout log-probs are
    unchanged. `subtle`: p 0.3; `obvious`: p 1.0. Outside the taxonomy: the mask covers exactly
    the sampled positions, but the ids the loss scores there are not the sampled ones. On the
    benchmark's task it did not move training beyond the healthy spread (three seeds; kept as
    written: probably because the SFT start already ends its short answers and 18 steps do not
    un-learn it)."""

    name, family, cause, seam = "eos_replaced_by_pad_in_trainer_batch", "system", UNEXPLAINED, "target_ids"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        policy = self.view.policy if self.view is not None else None
        if policy is None:
            return batch
        stops = torch.tensor(sorted(int(s) for s in policy.stop_ids), dtype=batch.input_ids_BT.dtype)
        rows = torch.tensor([self.coin(step, "row", b) < float(self.p["p"]) for b in range(batch.num_seqs)])
        hit = torch.isin(batch.input_ids_BT, stops) & (batch.loss_mask_BT > 0) & rows[:, None]
        if not bool(hit.any()):
            return batch
        ids = torch.where(hit, torch.full_like(batch.input_ids_BT, int(policy.pad_id)), batch.input_ids_BT)
        return dataclasses.replace(batch, input_ids_BT=ids)


# ----------------------------------------------------------------------------- old-policy log-probs


@register_fault
class OldLogpFromPreviousStepBuffer(Fault):
    """pi_old's log-probs come from a buffer that keeps the previous step's values: the old-log-prob
    tensor is allocated once, keyed by the row's position in the batch, and refreshed only when it is
    missing, so from the second step on row b's ratio divides by the log-probs of whichever sequence
    sat at row b one step earlier (tensorforce/tensorforce#312 and thu-ml/tianshou#745 report PPO
    ratios computed against the wrong old log-probs; the shape of keeping them in an attribute between
    calls is the fix proposed in abhisheksuran/Reinforcement_Learning#4, `self.old_probs = None ...
    This variable will stock old probability`; no report of this exact stale buffer was found).
    Each step's true pi_old is kept; in a fraction `p` of the rows (drawn per step and row) the
    returned pi_old is the previous step's row b, cut or zero-padded to this step's length (row b
    absent last step: left as is). The first faulty step passes through. `subtle`: p 0.3; `obvious`:
    p 1.0. Outside the taxonomy: the rollouts, rewards and advantages are right; only the ratio's
    denominator belongs to another sequence, which no cause names. On the benchmark's task it did
    not move training beyond the healthy spread (three seeds, one under at each severity; kept as
    written: a wrong ratio rescales or clips a token's gradient, it never turns its sign)."""

    name, family, cause, seam = "old_logp_from_previous_step_buffer", "credit_assignment", UNEXPLAINED, "old_logp_buffer"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_old_logp(self, old_BT, batch, step):
        prev, self._prev = getattr(self, "_prev", None), old_BT.detach().clone()
        if prev is None:
            return old_BT
        out = old_BT.clone()
        B, T = old_BT.shape
        t = min(T, prev.shape[1])
        for b in range(min(B, prev.shape[0])):
            if self.coin(step, "row", b) < float(self.p["p"]):
                out[b] = 0.0
                out[b, :t] = prev[b, :t].to(out.dtype)
        return out
