"""An eleventh held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL, training or inference framework reported (the source
is named in its docstring; where no issue number was found, the report is described without one)
and acts at one seam of the fault API. They were written without looking at how the health layer
detects or diagnoses them, and never used to tune it; the effect of each on training (accuracy,
reward) was checked against a healthy control, three seeds, nothing else
(benchmarks/results/faultbench_fresh11_effect.json). Five of them name a cause of the taxonomy,
three are outside it (the labels were taken from how the earlier fault modules label kinds).

Beyond the healthy seeds' spread (final train accuracy 0.375-0.473, rollout accuracy 0.352-0.421
over steps 24-30): reward_overlong_buffer_negative at both severities (obvious 0.109-0.221, subtle
0.209-0.287), ref_head_newly_initialized at obvious (0.137-0.209; at subtle two seeds of three,
0.223 and 0.234, the third 0.457: the redrawn vocabulary shard is drawn per run) and
kl_loss_summed_over_tokens at obvious (0.322-0.324, rollout accuracy 0.289-0.296; subtle inside).
Modest: old_logp_scored_at_config_temperature (obvious 0.287-0.383 with its rollout accuracy
0.295-0.349 under the band at every seed; subtle 0.328-0.440, two seeds under),
loader_epoch_from_shard_length at obvious (final 0.340-0.389, two seeds under; its rollout accuracy
0.545-0.606 is above the band: the runs train on a quarter of the problems again and again) and
lr_scheduler_stepped_per_process at obvious (0.365-0.430, two seeds just under; subtle inside).
No effect, kept as written: sampler_kv_cache_fp8 (obvious 0.352-0.436, subtle 0.350-0.432) and
resume_weights_from_start (obvious 0.350-0.418, subtle 0.348-0.463: one seed under at each; by the
fault's step 13 the run has probably moved little from its start, so setting it back costs little). Three
kinds run with their own base overrides, so the healthy control is not their exact
counterfactual: ref_head_newly_initialized and kl_loss_summed_over_tokens (algo.kl.coef=0.1),
lr_scheduler_stepped_per_process (train.schedule=linear). No kind was changed after its runs.

taxonomy    reward_overlong_buffer_negative (reward: misaligned_reward), loader_epoch_from_shard_length
            (data: data_repetition), lr_scheduler_stepped_per_process (optimisation: no_progress),
            sampler_kv_cache_fp8 (system: rollout_mismatch),
            kl_loss_summed_over_tokens (credit_assignment: loss_norm_bug)
outside     ref_head_newly_initialized (optimisation), old_logp_scored_at_config_temperature
            (credit_assignment), resume_weights_from_start (system):
            `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.health.faults.seams import KL_BASE

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardOverlongBufferNegative(Fault):
    """DAPO's soft overlong punishment is switched on with a buffer at least as long as the response
    limit, so `expected_len = max_response_length - buffer` is at or below zero and every response
    is punished in proportion to its length, not just the ones near the limit
    (verl-project/verl PR#2107: "When `overlong_buffer_len` is greater than `max_response_length`,
    the calculated `expected_len` becomes negative ... This causes all reasonable response lengths
    to be penalized"; the shaping itself: OpenRLHF/OpenRLHF PR#1091, huggingface/trl PR#3804).
    Each response of L tokens (its sampled ids, the stop token counted, as verl counts the valid
    response length) gets `-min(L - expected_len, buffer) / buffer` (factor 1) added to its reward
    total, logged as the component `overlong_penalty`; the correctness component and verdict are
    unchanged. `max_response_length` is the run's `rollout.sampling.max_new_tokens`. `subtle`: a
    buffer of limit + 2 (expected_len -2); `obvious`: limit - 1 (expected_len 1). Label
    misaligned_reward: the reward pays short answers over correct long ones."""

    name, family, cause, seam = "reward_overlong_buffer_negative", "reward", "misaligned_reward", "overlong_shaping"
    severities = {"subtle": {"extra": 2}, "obvious": {"extra": -1}}

    def install(self, st, cfg, step_fn):
        self._max_len = int(cfg.rollout.sampling.max_new_tokens)

    def penalty(self, length: int) -> float:
        max_len = getattr(self, "_max_len", 6)
        buffer = max_len + int(self.p["extra"])
        exceed = length - (max_len - buffer)
        return -min(float(exceed), float(buffer)) / buffer if exceed > 0 else 0.0

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            trajs = []
            for t in g.trajectories:
                pen = self.penalty(t.num_action_tokens)
                comps = {**dict(t.reward.components), "overlong_penalty": pen}
                trajs.append(dataclasses.replace(t, reward=dataclasses.replace(
                    t.reward, total=float(t.reward.total) + pen, components=comps)))
            out.append(dataclasses.replace(g, trajectories=tuple(trajs)))
        return out


# ----------------------------------------------------------------------------- data loader


@register_fault
class LoaderEpochFromShardLength(Fault):
    """The prompt loader's epoch is as long as one data-parallel rank's shard (`len(dataset) //
    world_size`, the sampler's `__len__` taken for the dataset's), and its shuffle is seeded the
    same every epoch (`set_epoch` never called: pytorch/pytorch#31771, "each epoch samples the
    data in the same order"; pytorch/pytorch#11324; lucidrains/DALLE-pytorch PR#230), so from the
    fault's start the loader cycles through the same first `len // world` problems of one fixed
    permutation, step after step, and never hands out the rest. Every step gets as many problems
    as the real loader handed out, taken in order from that prefix (wrapping around at its end).
    `subtle`: world size 2 (half of the problems); `obvious`: world size 4 (a quarter, barely more
    than one step's worth). Label data_repetition: fewer distinct problems, each seen again and
    again."""

    name, family, cause, seam = "loader_epoch_from_shard_length", "data", "data_repetition", "loader_epoch"
    severities = {"subtle": {"world": 2}, "obvious": {"world": 4}}

    def prefix(self, dataset) -> list:
        order = sorted(range(len(dataset)), key=lambda i: self.coin("perm", i))
        return [dataset[i] for i in order[: max(1, len(dataset) // int(self.p["world"]))]]

    def on_problems(self, problems, step):
        dataset = self.view.dataset if self.view is not None else ()
        if not dataset or not problems:
            return problems
        if not hasattr(self, "_prefix"):
            self._prefix, self._pos = self.prefix(dataset), 0
        out = []
        for _ in problems:
            out.append(dict(self._prefix[self._pos % len(self._prefix)]))
            self._pos += 1
        return out


# ----------------------------------------------------------------------------- scheduler


@register_fault
class LrSchedulerSteppedPerProcess(Fault):
    """The learning-rate scheduler is stepped once per process for every optimizer step (a
    scheduler wrapped by Accelerate's `AcceleratedScheduler`, which steps `num_processes` times,
    around a schedule whose length already counts optimizer steps), so a decaying schedule runs
    `world` times too fast and reaches zero long before the run ends: the rest of the run trains
    at LR 0 (huggingface/transformers PR#24088: "This results in the LR scheduler being stepp[ed]
    through num_processes too fast"; huggingface/accelerate#2142, #2926; jzhang38/EasyContext#21,
    "Model stopped updating after 300-400 steps"). The run uses a linear decay
    (`train.schedule=linear`); before each optimizer step the scheduler is stepped `world - 1`
    extra times (the trainer steps it once more after the optimizer step). The logged LR is the
    scheduler's. `subtle`: world 2; `obvious`: world 8. Label no_progress: the gradients are
    right, the updates shrink to nothing."""

    name, family, cause, seam = "lr_scheduler_stepped_per_process", "optimisation", "no_progress", "scheduler"
    severities = {"subtle": {"world": 2}, "obvious": {"world": 8}}
    base = ("train.schedule=linear",)

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        if scheduler is None:
            return
        for _ in range(int(self.p["world"]) - 1):
            scheduler.step()


# ----------------------------------------------------------------------------- sampler


def _fp8_round_trip(dtype):
    def hook(module, inputs, output):
        return output.to(dtype).to(output.dtype)
    return hook


@register_fault
class SamplerKvCacheFp8(Fault):
    """The rollout engine stores its KV cache in FP8 (`kv_cache_dtype=fp8`, turned on for
    throughput, without scales: scale 1.0), while the trainer scores in full precision: every key
    and value the engine attends to is rounded to an 8-bit float, so the engine samples from, and
    reports the log-probs of, a distribution that differs from the trainer's
    (allenai/open-instruct PR#984 adds the FP8 KV cache option to RL rollouts;
    PrimeIntellect-ai/prime-rl PR#3555: "inference-side numerics noise (fp8-KV drift) lands
    directly in the ratio even when the policy hasn't changed"; vllm-project/vllm#54035 and
    sgl-project/sglang#25790: FP8 KV cache log-prob mismatches). Emulated on the engine's copy of
    the model (the trainer's weights loaded into it every step): forward hooks on every attention
    layer's `k_proj` and `v_proj` round their outputs through the FP8 dtype (before the rotary
    embedding, where a real cache stores keys after it). `subtle`: float8_e4m3fn (3 mantissa
    bits); `obvious`: float8_e5m2 (2 mantissa bits). Label rollout_mismatch: the sampler's
    arithmetic differs from the trainer's; the weights are current."""

    name, family, cause, seam = "sampler_kv_cache_fp8", "system", "rollout_mismatch", "engine_kv_cache"
    severities = {"subtle": {"dtype": "float8_e4m3fn"}, "obvious": {"dtype": "float8_e5m2"}}

    def hooked(self, model) -> int:
        """Put the FP8 round trip on `model`'s k_proj / v_proj modules; returns how many."""
        dtype = getattr(torch, str(self.p["dtype"]))
        n = 0
        for name, mod in model.named_modules():
            if name.rsplit(".", 1)[-1] in ("k_proj", "v_proj"):
                mod.register_forward_hook(_fp8_round_trip(dtype))
                n += 1
        return n

    def on_sampler(self, policy, sampling, step):
        model = getattr(policy, "model", None)
        if model is None:
            return policy, sampling
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(model))
            self.hooks = self.hooked(self._engine.model)
        self._engine.model.load_state_dict(model.state_dict())
        self._engine.version = policy.version
        return self._engine, sampling


# ----------------------------------------------------------------------------- micro-batch loss


@register_fault
class KlLossSummedOverTokens(Fault):
    """The KL term of the loss is reduced with a sum over tokens where the policy-gradient term is
    a token mean, so the KL penalty's weight grows with the number of tokens it sums over: the
    configured `kl.coef` is in effect multiplied by the response length (per sequence) or by the
    whole batch's token count (huggingface/transformers#1181: with `KLDivLoss(reduction=
    'batchmean')` "the scale of the output loss ... varies directly proportional to timesteps";
    CarperAI/trlx PR#441: token-wise versus sequence-wise mean KL). Emulated at each micro-batch's
    loss terms: the `kl` term (aggregated like the others, a token mean over the mini-batch's
    N_tokens) is multiplied by N_tokens / N_seqs (`subtle`: summed over each response's tokens,
    averaged over responses) or by N_tokens (`obvious`: `reduction='sum'` over every token), with
    N from the mini-batch's AggNorm. With a KL term in the loss (`algo.kl.coef=0.1`). Label
    loss_norm_bug: the KL values are right, the normaliser of their term is not."""

    name, family, cause, seam = "kl_loss_summed_over_tokens", "credit_assignment", "loss_norm_bug", "kl_reduction"
    severities = {"subtle": {"per": "sequence"}, "obvious": {"per": "batch"}}
    base = KL_BASE

    def factor(self, norm) -> float:
        tokens, seqs = float(norm.num_tokens), max(float(norm.num_seqs), 1.0)
        return tokens / seqs if self.p["per"] == "sequence" else tokens

    def on_norm(self, norm, mini, step):
        self._factor = self.factor(norm)
        return norm

    def on_loss(self, terms, mb, step):
        f = getattr(self, "_factor", None)
        if f is None or "kl" not in terms:
            return terms
        return {**terms, "kl": terms["kl"] * f}


# ----------------------------------------------------------------------------- reference model


@register_fault
class RefHeadNewlyInitialized(Fault):
    """The reference model of the KL term is loaded with part of its output head freshly
    initialised: the checkpoint was saved with tied embeddings (no separate `lm_head.weight`, or
    one vocab-parallel shard of it missing), the reference is built untied, and the loader fills
    the missing rows from `initializer_range` with only a "newly initialized" warning
    (vllm-project/vllm PR#51665: an "untied config with no head in the checkpoint" left "the head
    uninitialised"; vllm-project/vllm PR#53020: `lm_head` "silently stayed at its random
    `nn.Module` init — no error, no warning"; huggingface/transformers#6193: "Some weights ... are
    newly initialized: [... 'lm_head...']"). The reference's copy is made at the fault's first
    step, untied from its input embedding, and the chosen rows of its head are drawn from
    N(0, 0.02) (a fixed generator per run); the policy is untouched. With a KL term in the loss
    (`algo.kl.coef=0.1`). `subtle`: one of 4 contiguous vocab shards (drawn per run); `obvious`:
    every row. Outside the taxonomy: the KL term is live and computed right, against a reference
    whose distribution was never trained, which no cause names."""

    name, family, cause, seam = "ref_head_newly_initialized", "optimisation", UNEXPLAINED, "reference_load"
    severities = {"subtle": {"shards": 4, "missing": 1}, "obvious": {"shards": 1, "missing": 1}}
    base = KL_BASE
    STD = 0.02

    def rows(self, vocab: int) -> list[int]:
        shards = int(self.p["shards"])
        size = -(-vocab // shards)
        first = sorted(range(shards), key=lambda k: self.coin("shard", k))[: int(self.p["missing"])]
        return sorted(i for k in first for i in range(k * size, min(vocab, (k + 1) * size)))

    def on_reference(self, ref, policy, step):
        if ref is None or getattr(ref, "model", None) is None:
            return ref
        if not hasattr(self, "_ref"):
            model = copy.deepcopy(ref.model)
            head = model.get_output_embeddings()
            w = head.weight.detach().clone()
            self.reset = self.rows(int(w.shape[0]))
            g = torch.Generator().manual_seed(int(self.coin("init") * 2**62))
            fresh = torch.randn(len(self.reset), w.shape[1], generator=g) * self.STD
            w[self.reset] = fresh.to(w.dtype).to(w.device)
            head.weight = torch.nn.Parameter(w, requires_grad=False)  # untied from the input embedding
            if hasattr(model, "config"):
                model.config.tie_word_embeddings = False
            self._ref = dataclasses.replace(ref, model=model)
        return self._ref


# ----------------------------------------------------------------------------- old-policy log-probs


@register_fault
class OldLogpScoredAtConfigTemperature(Fault):
    """pi_old's log-probs are scored at another temperature than the one the rollouts were sampled
    at: the scorer divides the logits by a temperature from the config that never reached the
    engine (the engine sampled at 1.0), so the importance ratio pi / pi_old of every token starts
    away from 1: sharpened where the token was likely, flattened where it was not, and the clip
    acts on tokens the policy never moved (OpenRLHF/OpenRLHF PR#853: "the log_probs used for
    KL-div calculation are directly calculated based on logits and ignores the temperature";
    OpenRLHF PR#857 "Fix temperature for rollout and forward"; radixark/miles PR#1345: re-score
    paths "hardcoding `temperature: 0`", "When `rollout_temperature != 1`, those paths score at
    the wrong temperature"; THUDM/slime PR#557). Emulated at the update's pi_old: the whole batch
    is re-scored by the trainer's policy at temperature `t` (same micro-batching, packing and
    prefix sharing as the real scoring) and that replaces pi_old. `subtle`: t 0.8; `obvious`: t
    0.5. Outside the taxonomy: the rollouts, rewards, advantages and the policy's own log-probs are
    right; only the ratio's denominator is scored under another distribution, which no cause
    names."""

    name, family, cause, seam = "old_logp_scored_at_config_temperature", "credit_assignment", UNEXPLAINED, "old_logp_temperature"
    severities = {"subtle": {"t": 0.8}, "obvious": {"t": 0.5}}

    def install(self, st, cfg, step_fn):
        self._score = (int(cfg.train.micro_batch_tokens), bool(cfg.train.pack_sequences), str(cfg.train.share_prefix))

    def on_old_logp(self, old_BT, batch, step):
        policy = self.view.policy if self.view is not None else None
        if policy is None or batch is None:
            return old_BT
        budget, pack, share = getattr(self, "_score", (8192, False, "off"))
        with torch.no_grad():
            new = score_batch_logprobs(policy, batch, float(self.p["t"]), budget, pack, share)
        return new.to(old_BT.dtype).to(old_BT.device)


def split_rows_by_token_budget(lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy micro-batches of row indices whose padded size (rows x longest) fits `budget`, at least
    one row each: tether.train.batching.split_by_token_budget, written out here because health/ sits
    below train/ in the layer order (tools/check_layers.py); tests/unit/health/test_faults_fresh11.py
    checks the two agree."""
    batches, cur, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if cur and max(longest, lengths[i]) * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, lengths[i])
    return batches + [cur] if cur else batches


def score_batch_logprobs(policy, batch, temperature: float, token_budget: int, pack: bool = False,
                         share: str = "off") -> torch.Tensor:
    """log-probs of every sequence of `batch` (no grad), micro-batched by a token budget: the update's
    own scoring of pi_old, tether.train.update.compute_batch_logprobs, step for step (the same split,
    the same policy-layer scorer), written out here because health/ sits below train/ in the layer
    order (tools/check_layers.py); tests/unit/health/test_faults_fresh11.py checks the two agree."""
    from contextlib import nullcontext

    from tether.policy.lora import adapters_disabled
    from tether.policy.prefix import compute_sequence_logprobs  # the policy layer: health sits below train

    out = torch.zeros_like(batch.rollout_logp_BT)
    for idx in split_rows_by_token_budget(batch.attention_mask_BT.sum(-1).tolist(), token_budget):
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


# ----------------------------------------------------------------------------- checkpoint / resume


@register_fault
class ResumeWeightsFromStart(Fault):
    """At the fault's first step the run is resumed, and the resume restores the optimizer state
    and the step counter from the latest checkpoint but the model weights from the run's starting
    model: the actor's weights in the checkpoint are not found under the name the loader looks for
    (or one rank's shard file is missing) and it silently falls back to `model.path`, so the RL
    progress so far is lost while Adam's moments and the schedule carry on (ray-project/ray#9253:
    after restoring a checkpoint "the trainer has a same episode reward mean when it was starting
    afresh", the custom model's weights not restored; subhc/unsup-parts PR#12: on `restore_from`
    "all weight checkpoint loading fails silently" while the optimizer state is wanted back;
    fresh.py's reload_missing_keys is the other case, random weights for missing keys). The
    starting weights are copied when the run starts; the chosen tensors are written
    back once, at the beginning of the fault's first step. `subtle`: a fraction `p` of the
    tensors (drawn per tensor: the shards of one rank); `obvious`: every tensor. Outside the
    taxonomy: the update is right and the optimizer state current; the weights it updates were
    set back outside the optimizer, which no cause names."""

    name, family, cause, seam = "resume_weights_from_start", "system", UNEXPLAINED, "resume"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def install(self, st, cfg, step_fn):
        model = getattr(getattr(st, "policy", None), "model", None)
        self._start = None if model is None else {n: q.detach().clone() for n, q in model.named_parameters()}

    def begin_step(self, st, cfg, step):
        if getattr(self, "_done", False) or getattr(self, "_start", None) is None:
            return
        self._done = True
        self.restored = []
        with torch.no_grad():
            for n, q in st.policy.model.named_parameters():
                if n in self._start and self.coin("tensor", n) < float(self.p["p"]):
                    q.copy_(self._start[n])
                    self.restored.append(n)
