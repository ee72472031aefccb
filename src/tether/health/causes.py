"""The diagnosis taxonomy: each root cause and what it predicts for every signal.

A cause's `fingerprint` maps detector signatures (a detector, or `detector:rule`) to a weight:
a positive weight is a signal the cause predicts will move (how strongly its firing argues for
the cause), a negative one a signal that argues against it. A weight of `HALLMARK` (2) or more
marks a signal the cause produces first and by itself; a cause is named only when one of its
hallmarks fired (a side effect alone - a drifting norm under a too-high LR - names nothing). Every signal a cause does not list
with a positive weight it predicts stays quiet; the signals in `quiet` are the ones whose
movement rules the cause out (a mechanism that cannot produce them). `regression` and
`accuracy_drop` are outcomes (`DOWNSTREAM`): any fault can cost accuracy, so they are neither
evidence a cause leaves unexplained nor, alone, a cause's hallmark.

The fingerprints encode how each failure shows in telemetry (docs/health/README.md, "What each
cause predicts"; docs/design.md, correctness rules 3-8, 12, 16 and 17): they were written from the
mechanisms, then the weights were adjusted on the tuned half of the fault benchmark
(tether.health.faults.split) only.
"""

from __future__ import annotations

from dataclasses import dataclass

DOWNSTREAM = frozenset({"regression", "accuracy_drop"})
HALLMARK = 2.0
# signals only a broken update/trainer forward/loss makes move: an update-size, reward or data
# cause predicts none of them
_UPDATE_INTERNALS = ("forward_mismatch", "loss_norm", "kl_probe", "progress:frozen", "progress:against", "loss_mask",
                     "grad_memory", "token_ids", "optimizer_state")
# the counter reset apart from the moments: bias correction restarts - neither a too-large update nor a frozen one
_OPTIMIZER_SETTINGS = ("optimizer_state:eps", "optimizer_state:hparams", "optimizer_state:counter")


@dataclass(frozen=True)
class Cause:
    name: str
    family: str  # reward | optimisation | credit_assignment | data | system
    title: str
    fingerprint: dict[str, float]
    actions: tuple[str, ...] = ()  # remediation candidates, in order (tether.health.remediation)
    advice: str = ""
    quiet: tuple[str, ...] = ()  # signals that must not move under this cause

    def predicts(self, key: str) -> bool:
        return self.fingerprint.get(key, 0.0) > 0

    def hallmark(self, key: str) -> bool:
        return self.fingerprint.get(key, 0.0) >= HALLMARK


CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause("lr_too_high", "optimisation", "update size too large (learning rate, clipping off, too many epochs)",
          # a gradient spike alone is not an oversized update (Adam's step does not scale with the gradient):
          # the update itself must show it (KL, update size, fast progress, drift)
          {"grad_spike": 1, "kl_explosion": 4, "kl_explosion:sustained": -2, "update_size": 4, "clip_saturation": 2,
           "entropy_explosion": 1, "nonfinite": 1, "regression": 0.5, "accuracy_drop": 0.5, "length": 0.3,
           "progress:fast": 4, "param_drift": 0.5,
           # more epochs per batch: the update phase takes that many times longer (a slow reward/env is not this)
           "stall:update": 1,
           # Adam's second moments shrunk or lost between steps, or extra optimizer steps: every update larger, at
           # the same LR
           "optimizer_state:shrunk": 4, "optimizer_state:extra_steps": 4},
          ("restore_optimizer_state", "restore_clip", "lower_epochs", "lower_lr", "lower_lr_x10", "raise_kl"),
          "lower train.lr (or raise warm-up), keep PPO clipping on, fewer epochs per batch, add a KL anchor",
          # changed betas / weight decay are not an update-size problem at the configured LR
          quiet=tuple(q for q in _UPDATE_INTERNALS if q != "optimizer_state") + _OPTIMIZER_SETTINGS + (
              "optimizer_state:grown", "optimizer_state:foreign", "optimizer_state:rounded", "progress:stalled", "logp_floor",
              "logp_gap", "stale_weights", "sampler_state")),
    Cause("numerical_instability", "optimisation", "non-finite loss or gradient",
          {"nonfinite": 4, "grad_spike": 0.5}, ("lower_lr",),
          "check log-ratio clamps, masked positions before exp, the reward for NaN; lower the LR"),
    Cause("entropy_collapse", "optimisation", "exploration collapsed (temperature too low, entropy penalty)",
          # a lower sampling temperature scales every logit change by 1/T: the per-update KL stays up while
          # the weights move as usual (no spike, no fast progress)
          {"entropy_collapse": 3, "no_signal": 0.5, "length:collapse": 0.3, "kl_explosion:sustained": 1},
          ("raise_temperature",), "raise rollout temperature, clip-higher, Clip-Cov/KL-Cov, an entropy bonus",
          quiet=_UPDATE_INTERNALS + ("duplicates",)),
    Cause("entropy_explosion", "optimisation", "entropy blow-up (entropy bonus / clip-higher too permissive)",
          # noise-like answers do not stop: longer, cut at the limit; an entropy term in the loss pulls the update
          # against the advantage-weighted objective (the surrogate is no longer all the loss)
          {"entropy_explosion": 3, "length:blowup": 0.3, "regression": 0.3, "kl_explosion": -1.5,
           "kl_explosion:sustained": 1.5, "grad_spike": -1, "truncation": 0.3, "progress:against": 0.5},
          ("drop_entropy_bonus", "raise_kl", "lower_lr"), "lower algo.entropy_coef or clip_high; add a KL anchor",
          quiet=tuple(q for q in _UPDATE_INTERNALS if q != "progress:against")),
    Cause("no_progress", "optimisation", "the update does not reach the weights (frozen tensors, a hidden LR scale)",
          # an eps grown past sqrt(v) or second moments grown between steps divide every step: a hidden LR scale
          {"progress:frozen": 6, "progress:stalled": 5, "optimizer_state:eps": 4, "optimizer_state:grown": 4}, (),
          "check that every trainable tensor is in the optimizer with requires_grad, and the LR the optimizer "
          "actually steps with (scheduler, per-micro-batch stepping, world-size scaling)",
          quiet=("kl_explosion", "update_size", "progress:fast", "grad_spike", "clip_saturation", "optimizer_state:shrunk",
                 "optimizer_state:hparams", "optimizer_state:foreign", "optimizer_state:extra_steps",
                 "optimizer_state:counter", "optimizer_state:rounded")),
    Cause("kl_inactive", "optimisation", "the KL anchor does nothing (its term carries no gradient, or the "
          "reference follows the policy)",
          {"kl_probe": 6}, (),
          "compute the KL term with gradients to the policy; keep the reference a frozen copy of the starting "
          "weights (LoRA: adapters off)",
          # a reference that jumped away pulls the policy somewhere: the anchor acts, towards the wrong model
          quiet=("kl_probe:moved",)),
    Cause("exploitable_reward", "reward", "the reward pays for something other than correctness (reward hacking)",
          {"reward_hacking": 3, "reward_hacking:component": 2, "reward_noise:auc": 1, "length": 1, "entropy_collapse": 0.3,
           # a loophole that pays for volume (length, filler) spreads the policy over the filler: entropy rises
           "entropy_explosion": 0.5, "proxy_reward": -2},
          ("downweight_component", "raise_kl"), "fix the loophole in the verifier / shaping term; down-weight it",
          quiet=_UPDATE_INTERNALS),
    Cause("learned_reward_exploited", "reward", "a learned reward (reward model, judge) is being exploited: "
          "it no longer agrees with the verifier on held-out probes",
          {"learned_reward": 5, "learned_reward:agreement": 3, "reward_hacking": 0.5, "proxy_reward": 8},
          ("downweight_component", "halt"),
          "stop RL against it (DeepSeek-R1 caps RM-based RL), retrain the RM on the policy's recent samples, "
          "or mix in a verifiable reward; down-weight the component"),
    Cause("noisy_reward", "reward", "noisy or mis-scaled reward (correct answers not reliably paid)",
          # correct answers left unpaid make their problems look unsolvable (`data_shift:unsolvable`)
          {"reward_noise": 2, "reward_noise:correct_unpaid": 4, "reward_noise:inconsistent": 4, "reward_hacking": 1,
           "regression": 0.5, "data_shift:unsolvable": 0.5, "reward_linkage": -5, "proxy_reward": -3}, (),
          "check the verifier / judge on labelled samples; increase n or use a stricter verifier",
          # correct answers underpaid by another term of the reward while its correctness term ranks them first
          # is a reward that scores something else (`reward_noise:component`), not a noisy verifier
          quiet=_UPDATE_INTERNALS + ("reward_linkage:routed", "reward_noise:component")),
    Cause("misaligned_reward", "reward", "the reward scores the wrong thing (inverted, or attached to the wrong samples)",
          {"reward_linkage": 2, "reward_linkage:linkage": 6, "reward_linkage:inverted": 6, "reward_linkage:routed": 6,
           "reward_noise:component": 6, "reward_noise": 0.5, "regression": 0.3, "accuracy_drop": 0.3}, ("halt",),
          "check the reward's sign and that each reward record is indexed by the sample it scores",
          quiet=_UPDATE_INTERNALS),
    Cause("reward_failures", "reward", "reward function failing (errors, time-outs, invalid values)",
          {"error_surge": 4, "stall": 0.5}, (),
          "see reward/error_rate and samples' error fields; fix the reward service"),
    Cause("advantage_bug", "credit_assignment", "advantage sign / estimator bug",
          {"advantage_misalignment": 4, "advantage_invariants": 4, "regression": 0.5, "accuracy_drop": 0.3}, ("halt",),
          "check the advantage estimator: advantages must rise with reward inside a group"),
    Cause("grouping_bug", "credit_assignment", "samples grouped with the wrong prompt",
          {"group_integrity": 5, "group_structure:size": 6, "advantage_invariants": 0.5}, ("halt",),
          "samples of one prompt must share one group id (uid), and a group holds rollout.n samples"),
    Cause("loss_mask_bug", "credit_assignment", "the loss mask does not cover exactly the sampled tokens",
          # a mask over unsampled positions compares the trainer's log-probs there with no sampled log-prob
          # and a mask over padding counts tokens no micro-batch trains (the normaliser check), over zero-advantage
          # positions un-centres the advantages the loss sees (the advantage invariants)
          # and a mask that leaves tokens out of the loss leaves their gradient out (the update stalls; nothing moves
          # when it covers none)
          {"loss_mask": 5, "loss_mask:position": 2, "length": 0.5, "truncation": 0.5, "logp_floor": 0.5, "logp_gap": 0.5,
           "loss_norm": 1, "advantage_invariants": 1, "progress:frozen": 1, "progress:stalled": 1},
          ("halt",), "build the mask from lengths and stop reasons (never token values: pad may equal eos)",
          # the right positions weighed unequally: the coverage is exact, a per-token weight is the bug
          quiet=("loss_mask:weighted",)),
    Cause("loss_norm_bug", "credit_assignment", "the loss normaliser does not count each token of the mini-batch once",
          {"loss_norm": 6}, ("halt",),
          "compute the aggregation's denominators once per mini-batch over its whole loss mask (tether.algos.agg_loss)"),
    Cause("data_corruption", "data", "corrupted data (wrong labels, damaged prompts)",
          # a regression that no optimisation, reward or credit signal explains points at the data
          # rewritten gold answers (cast, re-formatted) move the answers' statistics too
          {"data_shift:prompt": 3, "data_shift:unsolvable": 3, "regression": 2, "accuracy_drop": 1, "no_signal": 0.3,
           "data_shift:answers": 1},
          ("halt",), "inspect samples/step_*.jsonl.gz: prompts and gold answers",
          quiet=_UPDATE_INTERNALS + ("progress:stalled", "answer_leak")),
    Cause("answer_leakage", "data", "the prompts carry their gold answers",
          {"answer_leak": 6, "data_shift:prompt": 1}, ("halt",),  # the leaked answer lengthens the prompts
          "the prompt template must not include the target field; check the data preparation's columns"),
    Cause("data_repetition", "data", "the data loader repeats the same problems",
          # the repeated problems can also meet themselves among the fresh ones of a step
          # repeated problems give alike gradients step after step
          {"data_shift:repeat": 4, "group_structure:duplicate": 0.5, "grad_memory": 0.5}, ("halt",),
          "check the loader's epoch/shuffle state"),
    Cause("duplicate_problems", "data", "the loader hands out the same problem several times in one step",
          # copies within a step of problems that are fresh every step: no repeats across steps
          {"group_structure:duplicate": 5}, ("halt",),
          # copies of a sample of the data are still a sample: the answers among the distinct problems stay
          "check the sampler / sharding: each rank must read a distinct shard of every batch",
          quiet=("data_shift:repeat", "data_shift:answers")),
    Cause("stale_weights", "system", "rollout engine runs stale weights (weight sync not delivered)",
          {"stale_weights": 5, "stale_weights:checksum": 3, "logp_gap": 1, "logp_gap:sawtooth": 4, "logp_floor": 0.5},
          ("halt",),
          "verify the weight-sync handshake (version + checksum) and probe log-probs after each sync",
          quiet=("forward_mismatch", "sampler_state", "stale_weights:foreign", "stale_weights:jump", "token_ids",
                 "logp_gap:shifted", "logp_floor:shifted", "logp_gap:zeroed", "logp_floor:zeroed")),
    Cause("rollout_mismatch", "system", "the sampler's and the trainer's forwards differ (sampling settings, numerics, "
          "non-parameter state, weights converted wrong by the sync, a trainer-only layer)",
          {"logp_gap": 3, "logp_floor": 3, "logp_gap:sawtooth": -2, "stale_weights": -3, "entropy_collapse": 0.3,
           "forward_mismatch": 5, "sampler_state": 6, "stale_weights:foreign": 9, "clip_saturation": 0.5, "kl_explosion": 0.5},
          ("enable_is_correction",),
          "align temperature/top-p/top-k, precision and the model's buffers between engine and trainer, and the "
          "trainer's gradient forward with its scoring pass; keep TIS/MIS on",
          # pi_old off while the training forward agrees with the sampler: no forward differs
          # log-probs that match one position over are the engine's own, misfiled: its forward does not differ;
          # a gap sitting on tokens recorded at log-prob 0.0 is a padded record, not a forward
          quiet=("loss_mask", "stale_weights:checksum", "loss_norm", "progress:frozen", "forward_mismatch:old_logp",
                 "grad_memory", "token_ids", "stale_weights:jump", "logp_gap:shifted", "logp_floor:shifted",
                 "logp_gap:zeroed", "logp_floor:zeroed")),
    Cause("sampler_duplicates", "system", "the sampler returns copies within a group (one seed per prompt)",
          {"duplicates": 6, "entropy_collapse": 0.5}, ("halt",),
          "seed every sample of a group separately (n samples per prompt must be independent draws)"),
    Cause("slow_component", "system", "a slow reward, environment or sync stalls the steps",
          {"stall": 4}, (), "see time/* per phase; scale the reward service or raise its concurrency"),
    Cause("truncation", "system", "generation limit too short: responses truncated",
          {"truncation": 3, "no_signal": 1.5, "length": 0.3}, ("raise_max_tokens", "raise_max_tokens_x4"),
          "raise rollout.sampling.max_new_tokens (or add overlong shaping)"),
    Cause("no_signal", "data", "no learning signal (tasks all solved or all failed)",
          # fewer samples a prompt than earlier in the run (the sampler no longer given rollout.n) leave more
          # groups all right or all wrong: no spread, and more problems with no correct sample
          {"no_signal": 2, "group_structure:shrunk": 4, "data_shift:unsolvable": 0.5}, (),
          "adjust task difficulty, raise rollout.n (check the sampler receives it), enable dynamic sampling"),
)}


def format_predictions() -> str:
    """The taxonomy as a markdown table (docs/health/README.md, "What each cause predicts"; a test
    keeps the page equal to it): per cause, its hallmarks, the other signals it predicts, the ones
    that weigh against it, and the ones that rule it out. Every signal in no column it predicts
    stays quiet."""
    def keys(c: Cause, pick) -> str:
        return ", ".join(f"`{k}`" for k, w in sorted(c.fingerprint.items(), key=lambda kv: -abs(kv[1])) if pick(w)) or "-"

    rows = ["| cause | family | hallmarks (one must fire to name it) | also predicts | weighs against | ruled out by |",
            "|---|---|---|---|---|---|"]
    for c in CAUSES.values():
        rows.append(f"| `{c.name}` | {c.family} | {keys(c, lambda w: w >= HALLMARK)} | {keys(c, lambda w: 0 < w < HALLMARK)} | "
                    f"{keys(c, lambda w: w < 0)} | {', '.join(f'`{k}`' for k in c.quiet) or '-'} |")
    return "\n".join(rows)


__all__ = ["CAUSES", "Cause", "DOWNSTREAM", "HALLMARK", "format_predictions"]
