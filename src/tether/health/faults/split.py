"""The benchmark's tuned and held-out fault kinds: a fixed list, so the split cannot drift.

Detector thresholds, diagnosis predictions and the confidence calibration are tuned on the
runs of `TUNED` only (and on healthy runs). `HELD_OUT` kinds were written with the rest of issue
41's faults and are run only to be scored: `tether faultbench` reports them separately
(`results.json`: `held_out`, `tuned`), and `--split tuned` runs the tuned half alone. The 32
kinds of earlier rounds were tuned on then, so they belong to the tuned half; the held-out half
is taken from the new kinds, half of them, including two outside the diagnosis taxonomy.

A kind in neither list (a user's `--fault module:Class`) is scored as `other`.
"""

from __future__ import annotations

# issue 16 / 19 kinds (tuned in those rounds)
EARLIER = (
    "advantage_double_norm", "advantage_noise", "advantage_sign_flip", "clip_disabled", "data_repetition",
    "duplicate_prompts", "entropy_bonus", "eos_masked", "epoch_overuse", "exploitable_judge", "generation_cut",
    "group_mixing", "group_split", "label_corruption", "logprob_noise", "low_temperature", "lr_spike", "nan_reward",
    "nonfinite_grads", "partial_sync", "prompt_truncation", "reward_errors", "reward_hack_bonus", "reward_inverted",
    "reward_loophole", "reward_misindexed", "reward_noise", "rollout_topk", "sampler_mismatch", "shuffled_labels",
    "slow_reward", "stale_weights",
)
# issue 41's new kinds, tuned on
NEW_TUNED = ("mask_shift", "trainer_forward_mismatch", "kl_detached", "frozen_params", "answer_leak", "norm_wrong",
             "weight_decay_negative", "loss_sign_flip")
# issue 41's new kinds, never tuned on
HELD_OUT = ("ref_is_policy", "hidden_lr_crash", "reward_shuffled", "sampler_buffers", "duplicate_samples",
            "adam_state_corrupt", "old_logp_shuffled", "grad_accum_leak")
TUNED = EARLIER + NEW_TUNED


def split_of(fault: str) -> str:
    """`tuned`, `held_out` or `other` (a fault in neither fixed list)."""
    return "tuned" if fault in TUNED else "held_out" if fault in HELD_OUT else "other"


__all__ = ["EARLIER", "HELD_OUT", "NEW_TUNED", "TUNED", "split_of"]
