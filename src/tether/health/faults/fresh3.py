"""A third held-out set of fault kinds (issue 41), written by other hands than the diagnosis's.

Each kind is modelled on a bug users of an RL or training framework reported (the source is named
in its docstring) and acts at one seam of the fault API. They were written without looking at how
the health layer detects or diagnoses them, and never used to tune it; the effect of each on
training (accuracy, reward) was checked once against a healthy control, nothing else.

taxonomy    reward_silent_timeout (reward: noisy_reward), old_logp_nan (optimisation:
            numerical_instability), advantage_credit_cut (credit_assignment: advantage_bug),
            prompt_symbols_stripped (data: data_corruption), sampler_dropout (system: rollout_mismatch)
outside     token_ids_shifted (system), grad_garbage_rows (optimisation), ratio_vs_reference
            (credit_assignment): `cause = UNEXPLAINED`, no cause of the taxonomy describes their mechanism
"""

from __future__ import annotations

import copy
import dataclasses
import re

import torch

from tether.health.faults import UNEXPLAINED, Fault, register_fault
from tether.types import Outcome


def _generator(fault: Fault, step: int, key: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded from the fault's coin (never touches the run's RNGs)."""
    return torch.Generator(device=device).manual_seed(int(fault.coin(step, key) * 2**62))


# ----------------------------------------------------------------------------- reward


@register_fault
class RewardSilentTimeout(Fault):
    """The math verifier runs under a timeout that also counts the time a check waits in the
    executor queue; when a burst of rollouts finishes together, checks time out and the rubric
    silently scores them 0 (verifiers PR#831: "falsely marking answers with 0 reward"). No error
    is raised, so nothing is tagged invalid: a fraction `p` of the samples, correct or not, is
    scored 0 and counted wrong. Only correct answers lose anything, so the reward is one-sidedly
    noisy (false negatives). Label noisy_reward: correct answers are not reliably paid. Not
    remediable: no action of the catalogue fixes the verifier's timeout."""

    name, family, cause, seam = "reward_silent_timeout", "reward", "noisy_reward", "reward"
    severities = {"subtle": {"p": 0.3}, "obvious": {"p": 0.9}}

    def on_rollouts(self, groups, step):
        out = []
        for g in groups:
            trajs = tuple(self._timed_out(t) if t.reward.outcome == Outcome.OK
                          and self.coin(step, g.task_id, i) < self.p["p"] else t for i, t in enumerate(g.trajectories))
            out.append(dataclasses.replace(g, trajectories=trajs))
        return out

    @staticmethod
    def _timed_out(t):
        r = t.reward
        zero = dataclasses.replace(r, total=0.0, components={k: 0.0 for k in r.components},
                                   correct=None if r.correct is None else False)
        return dataclasses.replace(t, reward=zero)


# ----------------------------------------------------------------------------- optimisation


@register_fault
class OldLogpNaN(Fault):
    """pi_old's scoring pass returns NaN for some sampled tokens: it marks tokens it cannot score
    (vocabulary padding, a "bad words" logit mask the sampler did not apply) with a -inf
    sentinel, and the log-softmax of a row whose logits are all masked, or a later
    `-inf - -inf`, turns it into NaN (open-instruct PR#1817: an invalid-logprob sentinel where
    `-inf - -inf = nan`; trl#7221: `0 * -inf` NaNs in the loss). A log-ratio clamp does not stop
    NaN (slime PR#2198). `p`: the fraction of the batch's loss tokens hit. Label
    numerical_instability: the loss and gradient go non-finite on the steps a hit lands on. Not
    remediable: a lower LR does not remove the NaN."""

    name, family, cause, seam = "old_logp_nan", "optimisation", "numerical_instability", "old_logp"
    severities = {"subtle": {"p": 0.002}, "obvious": {"p": 0.03}}

    def on_old_logp(self, old_BT, batch, step):
        gen = _generator(self, step, "nan")
        hit = (torch.rand(old_BT.shape, generator=gen) < self.p["p"]).to(old_BT.device) & (batch.loss_mask_BT > 0)
        return old_BT.masked_fill(hit, float("nan"))


@register_fault
class GradGarbageRows(Fault):
    """Rows of the gradient buffers are left uninitialised: a backward kernel allocates its output
    with `empty` and never writes some rows (FBGEMM PR#5754, `at::empty` gradient rows of
    truncated segments "propagate into upstream gradients"), or a reduction pads a bucket with
    unzeroed memory (DeepSpeed PR#291). A fraction `p` of the rows of every matrix gets finite
    garbage of `scale` x the tensor's gradient RMS, fresh each step, in place of its gradient.
    Outside the taxonomy: the update reaches the weights at a normal size and nothing is
    non-finite, but part of it points nowhere the loss asked for."""

    name, family, cause, seam = "grad_garbage_rows", "optimisation", UNEXPLAINED, "optimizer"
    severities = {"subtle": {"p": 0.03, "scale": 1.0}, "obvious": {"p": 0.6, "scale": 10.0}}

    def before_optimizer_step(self, optimizer, scheduler, params, step):
        self._calls = getattr(self, "_calls", 0) + 1
        gen = _generator(self, step, f"garbage{self._calls}")
        for p in params:
            if p.grad is None or p.dim() < 2:
                continue
            g = p.grad
            rows = torch.rand(g.shape[0], generator=gen) < self.p["p"]
            if not rows.any():
                continue
            rms = g.detach().float().pow(2).mean().sqrt().clamp(min=1e-12)
            junk = torch.randn((int(rows.sum()),) + tuple(g.shape[1:]), generator=gen) * float(rms) * self.p["scale"]
            with torch.no_grad():
                g[rows.to(g.device)] = junk.to(g)


# ----------------------------------------------------------------------------- credit assignment


@register_fault
class AdvantageCreditCut(Fault):
    """The per-token advantages are built for a response length from another config and
    zero-padded (`adv[:, :L]` then padded to the batch's width, the response-length slicing
    class of bugs of slime PR#2255, where a slice that disagrees with the mask silently keeps
    the wrong span): only the first `keep` response tokens of a row carry its advantage, the
    rest of the response gets none while the loss mask still covers it. `subtle`: the rows of
    one worker's shard (a fraction `p`); `obvious`: every row. Label advantage_bug: the
    estimator's output is wrong while the rewards and the mask are right."""

    name, family, cause, seam = "advantage_credit_cut", "credit_assignment", "advantage_bug", "advantage"
    severities = {"subtle": {"p": 0.4, "keep": 1}, "obvious": {"p": 1.0, "keep": 1}}

    def on_batch(self, batch, step):
        mask = batch.loss_mask_BT > 0
        rows = torch.tensor([self.coin(step, "row", b) < self.p["p"] for b in range(mask.shape[0])], device=mask.device)
        late = mask.long().cumsum(-1) > int(self.p["keep"])  # past the first `keep` response tokens
        cut = late & mask & rows[:, None]
        return dataclasses.replace(batch, advantages_BT=batch.advantages_BT.masked_fill(cut, 0.0))


@register_fault
class RatioVsReference(Fault):
    """The importance ratio's denominator is the reference model's log-prob instead of pi_old's
    (a variable mix-up between `ref_log_prob` and `old_log_prob`, PRIME-RL/PRIME#45
    "old_log_probs VS ref_log_probs"; DeepSeekRL-Extended#5, a ratio taken against the wrong
    model): the PPO ratio becomes pi / pi_ref, so clipping acts as a trust region around the
    starting weights rather than the sampling policy, and tokens the policy already moved
    away from the start are clipped out (or, for negative advantages, pushed by the full
    ratio). `subtle`: a fraction `p` of the rows (one branch of the loss code); `obvious`: all.
    The reference is the policy's weights when the run's faults are set up. Outside the
    taxonomy: kl_inactive is about the KL term; here the KL term is untouched and the
    policy-gradient's ratio is anchored to the wrong model."""

    name, family, cause, seam = "ratio_vs_reference", "credit_assignment", UNEXPLAINED, "old_logp"
    severities = {"subtle": {"p": 0.4}, "obvious": {"p": 1.0}}

    def install(self, st, cfg, step_fn):
        from tether.policy.reference import make_reference

        self._ref = make_reference(st.policy)
        self._temperature = float(cfg.rollout.sampling.temperature)
        self._rows = 16

    def on_old_logp(self, old_BT, batch, step):
        from tether.policy.prefix import compute_sequence_logprobs  # the policy layer: health sits below train

        rows = torch.tensor([self.coin(step, "row", b) < self.p["p"] for b in range(old_BT.shape[0])], device=old_BT.device)
        if not rows.any():
            return old_BT
        ref_BT = torch.zeros_like(old_BT)
        with torch.no_grad():
            for start in range(0, old_BT.shape[0], self._rows):  # bounded memory: a few rows at a time
                sel = slice(start, start + self._rows)
                T = int(batch.attention_mask_BT[sel].sum(-1).max())
                lp, _ = compute_sequence_logprobs(self._ref, batch.input_ids_BT[sel, :T], batch.attention_mask_BT[sel, :T],
                                                  batch.seq_group_B[sel], self._temperature,
                                                  needed_BT=batch.loss_mask_BT[sel, :T] > 0)
                ref_BT[sel, :T] = lp.float().to(old_BT.device)
        return torch.where(rows[:, None], ref_BT, old_BT)


# ----------------------------------------------------------------------------- data


_MARKDOWN = re.compile(r"[*_`]")  # emphasis and code marks
_PUNCTUATION = re.compile(r"[^\w\s]")  # everything but word characters and spaces


@register_fault
class PromptSymbolsStripped(Fault):
    """A text-cleaning step of data prep strips characters the prompts need: `subtle`, a
    markdown cleaner that removes emphasis marks (`*`, `_`, backticks), so "3*4=" becomes
    "34="; `obvious`, a normaliser that keeps only word characters and spaces, so every operator
    and the "=" go (promptfoo PR#2212 "strip prompt asterisks"; punctuation-stripping cleaners
    applied to math text). The gold answers are untouched. Label data_corruption: damaged
    prompts."""

    name, family, cause, seam = "prompt_symbols_stripped", "data", "data_corruption", "data"
    severities = {"subtle": {"pattern": "markdown"}, "obvious": {"pattern": "punctuation"}}

    def on_problems(self, problems, step):
        pat = _MARKDOWN if self.p["pattern"] == "markdown" else _PUNCTUATION
        return [dict(p, prompt=pat.sub("", p["prompt"])) if isinstance(p.get("prompt"), str) else p for p in problems]


# ----------------------------------------------------------------------------- system


_DROPPED = ("mlp", "self_attn")  # the sub-blocks whose outputs a dropout layer follows in a decoder block


@register_fault
class SamplerDropout(Fault):
    """The rollout engine generates with the model in train mode, so dropout is active while
    sampling (trl#155: generate() not run in eval mode; unsloth-zoo PR#832: rollouts "from a
    randomly masked sub-network"), while the trainer scores with dropout off. The engine gets
    the trainer's current weights every step; each decoder block's attention and MLP outputs
    are dropped at rate `p` (fresh masks per step). Label rollout_mismatch: the sampler's and
    the trainer's forwards differ; the weights are current (not stale_weights). Not remediable:
    importance correction reweights the samples but the engine keeps sampling a noisy policy."""

    name, family, cause, seam = "sampler_dropout", "system", "rollout_mismatch", "sampler"
    severities = {"subtle": {"p": 0.05}, "obvious": {"p": 0.5}}

    def on_sampler(self, policy, sampling, step):
        if not hasattr(self, "_engine"):
            self._engine = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
            for name, mod in self._engine.model.named_modules():
                if name.rsplit(".", 1)[-1] in _DROPPED:
                    mod.register_forward_hook(self._drop)
        self._engine.model.load_state_dict(policy.model.state_dict())
        self._engine.version = policy.version
        self._step, self._gens = step, {}
        return self._engine, sampling

    def _drop(self, module, args, out):
        first = out[0] if isinstance(out, tuple) else out
        dev = first.device
        if dev not in self._gens:
            self._gens[dev] = _generator(self, self._step, f"dropout{dev}", dev)
        keep = (torch.rand(first.shape, generator=self._gens[dev], device=dev) >= self.p["p"]).to(first.dtype)
        dropped = first * keep / (1.0 - self.p["p"])
        return (dropped,) + tuple(out[1:]) if isinstance(out, tuple) else dropped


@register_fault
class TokenIdsShifted(Fault):
    """The trainer gets the sampled response through a vocabulary map that differs from the
    engine's by one added token: every response id at or above the added token's position is
    one higher in the trainer's batch than the id the engine sampled (vllm#32228: engine token
    ids that the tokenizer maps elsewhere; SkyRL#123 and trl PR#5238: trainers that re-derive
    ids instead of taking the engine's). The rewards, the advantages and the sampler's
    log-probs belong to the sampled tokens; the loss raises the probability of the shifted
    ones. `subtle`: the rows of one engine replica (a fraction `p`); `obvious`: all rows. Ids
    whose shift would leave the vocabulary keep theirs. Outside the taxonomy: the sampler's and
    the trainer's forwards are the same function on the same weights; it is the tokens the
    trainer is handed that differ from the sampled ones."""

    name, family, cause, seam = "token_ids_shifted", "system", UNEXPLAINED, "batch"
    severities = {"subtle": {"p": 0.25, "at": 0}, "obvious": {"p": 1.0, "at": 0}}

    def on_batch(self, batch, step):
        ids = batch.input_ids_BT
        rows = torch.tensor([self.coin(step, "row", b) < self.p["p"] for b in range(ids.shape[0])], device=ids.device)
        config = getattr(getattr(getattr(self.view, "policy", None), "model", None), "config", None)
        vocab = int(getattr(config, "vocab_size", 0) or (int(ids.max()) + 2))
        shift = (batch.loss_mask_BT > 0) & rows[:, None] & (ids >= int(self.p["at"])) & (ids + 1 < vocab)
        return dataclasses.replace(batch, input_ids_BT=torch.where(shift, ids + 1, ids))
