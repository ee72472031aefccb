"""A fourth held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL or training framework reported (the source is named
in its docstring) and acts at one seam of the fault API. They were written without looking at how
the health layer detects or diagnoses them, and never used to tune it; the effect of each on
training (accuracy, reward) was checked once against a healthy control, nothing else
(benchmarks/results/faultbench_fresh4_effect.json).

taxonomy    reward_cached_by_prompt (reward: misaligned_reward), finished_rows_masked
            (credit_assignment: loss_mask_bug), adam_eps_inflated (optimisation: no_progress),
            sync_quantised (system: rollout_mismatch)
outside     loader_sorted_by_answer (data), ref_from_base (optimisation), trainer_prompt_prefix
            (system), old_logp_unshifted (credit_assignment): `cause = UNEXPLAINED`, no cause of
            the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault

# ----------------------------------------------------------------------------- reward


@register_fault
class RewardCachedByPrompt(Fault):
    """The reward service caches its results under a key that leaves out the completion: the key
    is the prompt (the task id) and the sample's index in its group, so a prompt scored before gets
    the rewards its samples earned the last time, whatever the new samples say. The failure class
    of a cache key missing part of the scored input (opensearch-project/search-relevance#525: the
    judge cache keyed without the model, so another model's ratings come back; JudgeArena#36,
    keying a judge cache on a descriptor rather than the judge's input). The cache starts empty at
    the fault's start; a prompt's first sighting is scored and stored, later ones are hits until
    the entry expires after `ttl` steps (`subtle`: 3 steps, so only prompts that come back soon;
    `obvious`: never). The cached result is the whole RewardResult, the verifier's verdict
    included. Label misaligned_reward: real rewards, attached to other samples (those of an
    earlier rollout of the same prompt). Not remediable: no action of the catalogue clears the
    service's cache."""

    name, family, cause, seam = "reward_cached_by_prompt", "reward", "misaligned_reward", "reward"
    severities = {"subtle": {"ttl": 3}, "obvious": {"ttl": None}}

    def on_rollouts(self, groups, step):
        cache = self.__dict__.setdefault("_cache", {})
        ttl, out = self.p["ttl"], []
        for g in groups:
            hit = cache.get(g.task_id)
            fresh = hit is not None and (ttl is None or step - hit[0] <= int(ttl))
            if fresh and len(hit[1]) == len(g.trajectories):
                g = dataclasses.replace(g, trajectories=tuple(dataclasses.replace(t, reward=r)
                                                              for t, r in zip(g.trajectories, hit[1])))
            else:
                cache[g.task_id] = (step, tuple(t.reward for t in g.trajectories))
            out.append(g)
        return out


# ----------------------------------------------------------------------------- credit assignment


def _last_loss_token(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] id of each row's last loss token, [B] whether the row has any loss token)."""
    mask = batch.loss_mask_BT > 0
    T = mask.shape[1]
    last = (T - 1) - mask.flip(-1).long().argmax(-1)
    return batch.input_ids_BT.gather(1, last[:, None])[:, 0], mask.any(-1)


@register_fault
class FinishedRowsMasked(Fault):
    """The trainer decides which completions were truncated by comparing the last sampled token
    with one end-of-sequence id, while the engine stops on several (trl PR#7039: generation stops
    on every id of `generation_config.eos_token_id`, the GRPO trainer checks
    `tokenizer.eos_token_id` only, so a completion that ended on the other id counts as truncated
    and `mask_truncated_completions` drops it from the loss). Every completion the engine ended
    on a stop token is masked out of the loss (its loss mask zeroed); the truncated ones, which
    end on an ordinary token, keep theirs. `subtle`: a fraction `p` of the rows (the prompts
    whose turn ends on the other id); `obvious`: all of them. Label loss_mask_bug: the loss mask
    does not cover the sampled tokens of those rows."""

    name, family, cause, seam = "finished_rows_masked", "credit_assignment", "loss_mask_bug", "loss_mask"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def on_batch(self, batch, step):
        stop_ids = tuple(getattr(getattr(self.view, "policy", None), "stop_ids", ()) or ())
        last, has = _last_loss_token(batch)
        finished = has & torch.isin(last, torch.tensor(stop_ids, dtype=last.dtype, device=last.device))
        rows = torch.tensor([self.coin(step, "row", b) < self.p["p"] for b in range(last.shape[0])], device=last.device)
        drop = finished & rows
        if not bool(drop.any()):
            return batch
        return dataclasses.replace(batch, loss_mask_BT=batch.loss_mask_BT.masked_fill(drop[:, None], 0.0))


@register_fault
class OldLogpUnshifted(Fault):
    """pi_old's scoring pass gathers each token's log-prob from the logits of its own position
    instead of the previous one: log P(x_t | x_<=t), the distribution that predicts the *next*
    token, evaluated at x_t (AI-Hypercomputer/maxtext#2103: log-probs "computed as log P(token[t] |
    tokens[0..t]) (same-position logits) ... This off-by-one alignment makes real tokens look
    extremely unlikely"; lucidrains/PaLM-rlhf-pytorch#31, the shift of the action logits, "turns
    out there was a bug"; prime-rl PR#1525, a review that found trainer log-probs one position off
    the inference log-probs). The rollout log-probs, the mask and the advantages are right, and
    the loss's own forward is aligned; only the ratio's denominator (and the importance weights
    built from it) is scored misaligned. `subtle`: the rows of one code path (a fraction `p`);
    `obvious`: all rows. Outside the taxonomy: the sampler's and the trainer's forwards are the
    same and the advantages, rewards and mask are right; what is wrong is the alignment of pi_old's
    logits with its labels, which no cause names."""

    name, family, cause, seam = "old_logp_unshifted", "credit_assignment", UNEXPLAINED, "old_logp"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}

    def install(self, st, cfg, step_fn):
        self._temperature = float(cfg.rollout.sampling.temperature)

    def on_old_logp(self, old_BT, batch, step):
        rows = torch.tensor([self.coin(step, "row", b) < self.p["p"] for b in range(old_BT.shape[0])], device=old_BT.device)
        if not bool(rows.any()):
            return old_BT
        model = self.view.policy.model
        dev = next(model.parameters()).device
        same = torch.zeros_like(old_BT)
        with torch.no_grad():
            for s in range(0, old_BT.shape[0], 32):  # bounded memory: a few rows at a time
                sel = slice(s, s + 32)
                T = int(batch.attention_mask_BT[sel].sum(-1).max())
                ids = batch.input_ids_BT[sel, :T].to(dev)
                logits = model(input_ids=ids, attention_mask=batch.attention_mask_BT[sel, :T].long().to(dev)).logits
                lp = torch.log_softmax(logits.float() / self._temperature, -1).gather(-1, ids[..., None])[..., 0]
                same[sel, :T] = lp.to(old_BT)
        hit = (batch.loss_mask_BT.to(old_BT.device) > 0) & rows[:, None]
        return torch.where(hit, same, old_BT)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class AdamEpsInflated(Fault):
    """The optimizer's epsilon comes from a config written for another framework or unit: Adam
    runs with eps = 1e-1 instead of 1e-8 (mlpnlp-nmt PR#4: "the default eps value of the Adam
    optimizer (0.1) is too large ... the training does not work well when using eps=0.1";
    balancap/SSD-Tensorflow#385, an `opt_epsilon` default of 1.0). Each element's step is
    lr x m / (sqrt(v) + eps): with gradients far smaller than eps the update shrinks by orders of
    magnitude, while the logged learning rate is the configured one. `subtle`: eps = 1e-4 (about
    the size of a gradient element here, so steps roughly halve); `obvious`: eps = 1e-1. The
    policy's parameter group only. Label no_progress: a hidden scale keeps the update from
    reaching the weights. Not remediable: the catalogue has no action that resets eps."""

    name, family, cause, seam = "adam_eps_inflated", "optimisation", "no_progress", "optimizer_state"
    severities = {"subtle": {"eps": 1e-4}, "obvious": {"eps": 1e-1}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        optimizer.param_groups[0]["eps"] = float(self.p["eps"])


def _base_init(model: torch.nn.Module, fault: Fault, p: float) -> list[str]:
    """Re-initialise a fraction `p` of `model`'s tensors as the untrained base was (normal with
    the config's initializer_range for matrices, ones for norm gains, zeros for biases), from a
    generator seeded by the fault's coin; returns their names (at least one)."""
    named = list(model.named_parameters())
    chosen = [(n, q) for n, q in named if fault.coin("base", n) < p] or [named[len(named) // 2]]
    gen = torch.Generator().manual_seed(int(fault.coin("init") * 2**62))
    std = float(getattr(getattr(model, "config", None), "initializer_range", 0.02))
    with torch.no_grad():
        for n, q in chosen:
            if q.dim() >= 2:
                q.copy_(torch.randn(q.shape, generator=gen, dtype=torch.float32).to(q) * std)
            else:
                q.fill_(0.0 if n.endswith("bias") else 1.0)
    return [n for n, _ in chosen]


KL_BASE = ("algo.kl.coef=0.1",)  # a KL anchor in the loss (the reference: the starting weights)


@register_fault
class RefFromBase(Fault):
    """The KL reference is loaded from the base model the SFT started from instead of the SFT
    checkpoint RL starts from (trl#1340: with pretrained SFT adapters, PPOTrainer used the base
    model as the reference, "the log_probs deviate quite significantly, leading to very high
    starting KL and unstable training"). Here the base before SFT is an untrained
    initialisation of the same architecture, so the reference's tensors are re-initialised as
    the base was. `subtle`: a fraction `p` of the reference's tensors (a partial load: the other
    keys of the SFT checkpoint matched); `obvious`: all. The policy, rewards and data are
    untouched. Outside the taxonomy: kl_inactive is an anchor that does nothing; this one is
    active and pulls the policy towards the wrong model."""

    name, family, cause, seam = "ref_from_base", "optimisation", UNEXPLAINED, "reference"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 1.0}}
    base = KL_BASE

    def on_reference(self, ref, policy, step):
        if ref is None:
            return ref
        if not hasattr(self, "_ref"):
            model = copy.deepcopy(ref.model)
            self.reinitialised = _base_init(model, self, float(self.p["p"]))
            self._ref = dataclasses.replace(ref, model=model)
        return self._ref


# ----------------------------------------------------------------------------- data


def _answer_key(problem) -> tuple:
    """Sort key of a problem by its gold answer: numbers by value, then text."""
    answer = str(problem.get("answer", ""))
    try:
        return (0, float(answer), str(problem.get("prompt", "")))
    except ValueError:
        return (1, 0.0, answer)


@register_fault
class LoaderSortedByAnswer(Fault):
    """The loader stops shuffling and the data file is sorted by its answer column (a dataset
    written by a group-by on the label, read by a DataLoader whose `shuffle` defaults to False:
    ultralytics/yolov5#761, fixed in PR#5623, training without shuffling until then;
    joaoamcarvalho/mpd-public#6 "whether the argument shuffle=True is missing"). From the
    fault's start each step's problems are the next window of the training set in answer order,
    so one step's batch shares one or two answers and the next step's the following ones; every
    problem still comes once per pass. `subtle`: the first fraction `p` of each step's slots
    (one of four loader workers unshuffled); `obvious`: every slot. Outside the taxonomy: the
    problems are correct, distinct and not repeated more than a shuffled pass repeats them; what
    is wrong is their order (the batches are not a sample of the data), which no data cause
    names. On the benchmark's one-digit arithmetic its effect on accuracy was within one seed's
    noise (benchmarks/results/faultbench_fresh4_effect.json): group-relative advantages make the
    order of the problems matter little there."""

    name, family, cause, seam = "loader_sorted_by_answer", "data", UNEXPLAINED, "data"
    severities = {"subtle": {"p": 0.25}, "obvious": {"p": 1.0}}

    def on_problems(self, problems, step):
        if not hasattr(self, "_sorted"):
            data = self.view.dataset if self.view is not None else ()
            self._sorted = sorted((dict(p) for p in data), key=_answer_key)
        data, k = self._sorted, len(problems)
        if not data or not k:
            return problems
        n = min(k, int(round(k * float(self.p["p"]))))
        at = (step - self.start) * k
        return [data[(at + i) % len(data)] for i in range(n)] + list(problems[n:])


# ----------------------------------------------------------------------------- system


def _quantise(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """`w` through a per-tensor-scaled low-precision format and back: "fp8" (e4m3, scale =
    absmax / 448) or "int4" (symmetric, scale = absmax / 7)."""
    x = w.detach().float()
    amax = x.abs().max().clamp(min=1e-12)
    if fmt == "fp8":
        s = amax / 448.0
        return ((x / s).to(torch.float8_e4m3fn).float() * s).to(w.dtype)
    s = amax / 7.0
    return ((x / s).round().clamp(-8, 7) * s).to(w.dtype)


@register_fault
class SyncQuantised(Fault):
    """The weight sync converts every weight matrix to the rollout engine's low-precision format
    with one scale per tensor, while the trainer keeps full precision and scores with it (verl's
    `rollout.quantization=fp8` path and vllm#17272, FP8 online quantisation of synced bf16
    weights; UniRL#94 reports naive FP8 rollouts against BF16 training costing 2.9-10.3% reward
    unless the gap is corrected). `subtle`: fp8 e4m3 with a per-tensor scale; `obvious`: a 4-bit
    format (symmetric int4, per-tensor scale). Vectors (norm gains) arrive as they are. The
    engine gets the trainer's current weights every step and reports the trainer's version.
    Label rollout_mismatch: the sampler's forward differs from the trainer's (numerics, weights
    converted by the sync); the weights are current (not stale_weights)."""

    name, family, cause, seam = "sync_quantised", "system", "rollout_mismatch", "weight_sync"
    severities = {"subtle": {"format": "fp8"}, "obvious": {"format": "int4"}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        with torch.no_grad():
            for p_eng, p in zip(self._engine.model.parameters(), policy.model.parameters()):
                p_eng.copy_(_quantise(p, self.p["format"]) if p.dim() >= 2 else p)
        self._engine.version = policy.version
        return self._engine, sampling


SYSTEM_TURN = "<|im_start|>system\n<|im_end|>\n"  # an empty system turn of the ChatML template


@register_fault
class TrainerPromptPrefix(Fault):
    """The trainer's token ids of a prompt start with special tokens the engine's did not: the
    prompt is tokenised twice along different paths and one of them adds a BOS, or renders the
    chat template's default system turn (trl#3853 "vllm prepends two BOS for Llama" with "a
    significant drop in reward"; vllm PR#16976 and PR#27517: a chat-templated string re-tokenised
    with `add_special_tokens=True` gets a second BOS). The trainer's batch gets the extra tokens
    in front of every row (outside the loss mask, no advantage, no rollout log-prob); the
    response tokens, rewards and advantages are the sampled ones. `subtle`: one BOS (the
    end-of-text token, this tokenizer's BOS stand-in); `obvious`: an empty system turn. Outside
    the taxonomy: the sampler's and the trainer's forwards are the same function on the same
    weights; it is the context the trainer conditions the sampled tokens on that differs."""

    name, family, cause, seam = "trainer_prompt_prefix", "system", UNEXPLAINED, "batch"
    severities = {"subtle": {"prefix": "bos"}, "obvious": {"prefix": "system"}}

    def _prefix_ids(self) -> list[int]:
        if not hasattr(self, "_ids"):
            tok = getattr(getattr(self.view, "policy", None), "tokenizer", None)
            if tok is None:
                self._ids = []
            elif self.p["prefix"] == "bos":
                self._ids = [int(tok.eos_token_id)]
            else:
                self._ids = [int(i) for i in tok.encode(SYSTEM_TURN, add_special_tokens=False)]
        return self._ids

    def on_batch(self, batch, step):
        ids = self._prefix_ids()
        if not ids:
            return batch
        B, k = batch.input_ids_BT.shape[0], len(ids)

        def pad(x, value):  # value None: the prefix's token ids
            if x is None:
                return None
            head = (torch.tensor(ids, dtype=x.dtype, device=x.device).expand(B, k) if value is None
                    else torch.full((B, k), value, dtype=x.dtype, device=x.device))
            return torch.cat([head, x], dim=1)

        return dataclasses.replace(
            batch, input_ids_BT=pad(batch.input_ids_BT, None), attention_mask_BT=pad(batch.attention_mask_BT, True),
            loss_mask_BT=pad(batch.loss_mask_BT, 0), rollout_logp_BT=pad(batch.rollout_logp_BT, 0),
            advantages_BT=pad(batch.advantages_BT, 0), returns_BT=pad(batch.returns_BT, 0),
            old_values_BT=pad(batch.old_values_BT, 0), kept_BT=pad(batch.kept_BT, 0))
