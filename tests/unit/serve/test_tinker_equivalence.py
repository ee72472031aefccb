"""One GRPO update through the Tinker API equals the same update through `tether train`'s update.

tether's side is `tether.train.update.run_update` with its defaults (GRPO advantages, PPO clip,
token-mean aggregation, truncated importance-sampling correction, AdamW, gradient clipping at 1.0)
on a batch sampled by tether's sampler; `train.share_prefix=off` and `train.pack_sequences=false`
(both documented as "same result", they only change the order of float operations). The Tinker side
is what a Tinker script writes for the same update: one datum per sequence (input = the sequence
less its last token, targets = the sequence shifted by one, `logprobs` = the sampler's), `ppo` with
tether's clip bounds, the advantages scaled by 1 / (loss tokens in the batch) since Tinker's loss
is a sum and token-mean divides by that count, then `optim_step` with AdamW's parameters. tether's
fused update (one epoch, one mini-batch) takes pi_old = the policy itself and corrects for the
sampler by min(exp(logp_old - logp_sampler), 2), which equals Tinker's ratio against the sampler's
log-probs while the ratio is below 2, as it is for on-policy samples.

The weights must agree to 1e-6 (fp32). Adam's first step is lr * g / (|g| + eps) per weight: a
gradient entry within ~eps of 0 turns the ~1e-11 rounding difference of two float orders into up to
lr * 1e-3. At lr = 1e-4 (configs/reverse.yaml's RL rate) that stays under the tolerance (measured
1.5e-8 to 1.4e-7 over four sampling seeds) while every weight moves by ~1e-4; at lr = 1e-3 the same
rounding reaches 1.4e-6 (and 5.8e-6 with prefix sharing and packing on).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

tinker = pytest.importorskip("tinker", reason="pip install -e '.[tinker]' (make test installs it)")
from tinker import types  # noqa: E402

LR, CLIP = 1e-4, 1.0  # reverse.yaml's RL learning rate (see the module docstring for why it matters)


def sample_batch(policy, tok):
    """2 prompts x 4 samples from tether's sampler, GRPO advantages from tether's registry."""
    from tether.algos import ADVANTAGES, AdvantageInputs
    from tether.config import AdvantageConfig, SamplingConfig
    from tether.policy.sampling import run_generate
    from tether.types import TrainBatch

    prompts = [tok.encode("hello"), tok.encode("the cat sat")]
    rows = [p for p in prompts for _ in range(4)]
    samples = run_generate(policy, rows, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(1))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    T = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), policy.pad_id, dtype=torch.long)
    attn, mask, rollout = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T), torch.zeros(B, T)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.token_ids)
        ids[i, :p + c] = torch.tensor(s.prompt_ids + s.token_ids)
        attn[i, :p + c], mask[i, p:p + c] = True, 1.0
        rollout[i, p:p + c] = torch.tensor(s.logprobs)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = ADVANTAGES["grpo"](AdvantageInputs(rewards, torch.zeros(B, T), mask, group, torch.arange(B),
                                             torch.ones(B, dtype=torch.bool)), AdvantageConfig()).advantages_BT
    return TrainBatch(ids, attn, mask, rollout, adv, group, torch.arange(B))


def tinker_datums(batch):
    n_tokens = float(batch.loss_mask_BT.sum())  # token_mean's denominator
    out = []
    for i in range(batch.num_seqs):
        L = int(batch.attention_mask_BT[i].sum())
        seq = batch.input_ids_BT[i, :L].tolist()
        out.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs={
            "target_tokens": seq[1:],
            "logprobs": batch.rollout_logp_BT[i, 1:L].tolist(),
            "advantages": (batch.advantages_BT[i, 1:L] * batch.loss_mask_BT[i, 1:L] / n_tokens).tolist()}))
    return out


def test_one_grpo_update_through_tinker_equals_tethers_update(tiny_dir, service, client):
    from tether.config import AlgoConfig, TrainConfig
    from tether.optim import build_optimizer
    from tether.policy.hf import load_policy
    from tether.train.update import UpdateContext, run_update

    algo, train = AlgoConfig(), TrainConfig(lr=LR, grad_clip=CLIP, share_prefix='off', pack_sequences=False)
    policy = load_policy(tiny_dir)
    batch = sample_batch(policy, policy.tokenizer)
    assert float(batch.advantages_BT.abs().sum()) > 0

    tc = client.create_lora_training_client(base_model="tiny", rank=0).result()  # rank 0: full weights
    pl = algo.policy_loss
    tc.forward_backward(tinker_datums(batch), "ppo", {"clip_low_threshold": 1 - pl.clip_low,
                                                      "clip_high_threshold": 1 + pl.clip_high}).result()
    tc.optim_step(types.AdamParams(learning_rate=LR, beta1=train.betas[0], beta2=train.betas[1], eps=1e-8,
                                   weight_decay=train.weight_decay, grad_clip_norm=CLIP)).result()
    path = tc.save_state("after-one-update").result().path

    optimizer = build_optimizer(policy.model.parameters(), lr=LR, weight_decay=train.weight_decay, betas=train.betas)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    metrics = run_update(UpdateContext(policy, optimizer, algo, train), batch)
    assert metrics["optimizer_steps"] == 1.0

    model_id, _, name = path.removeprefix("tinker://").split("/")
    saved = load_file(str(service.store.state_dir / model_id.replace(":", "-") / "weights" / name / "model.safetensors"))
    mine = policy.model.state_dict()
    moved = max(float((mine[k] - before[k]).abs().max()) for k in saved)
    diff = max(float((saved[k] - mine[k]).abs().max()) for k in saved)
    print(f"update moved the weights by up to {moved:.2e}; Tinker API vs tether differ by up to {diff:.2e}")
    assert moved > 50 * 1e-6  # the update moved the weights far more than the tolerance
    assert diff <= 1e-6, f"Tinker-API update and tether's update differ by {diff:.2e} (moved {moved:.2e})"
