"""clip_frac_rare / clip_frac_common (MiniMax-M1 arXiv 2506.13585 §3.1): PPO's clipped share split by
token rarity under pi_old, on a hand-made batch; PPO-clip drops the rare clipped token's gradient,
CISPO keeps it."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import POLICY_LOSSES, PolicyLossInputs
from tether.algos.losses import _rare_tokens
from tether.config import PolicyLossConfig


def _batch():
    # 10 masked tokens (+1 padded). pi_old probabilities: two rare ones (0.02, 0.05), eight common (0.9).
    # Lowest 20% of 10 tokens = the 2 rare ones. Ratios: both rare tokens rose a lot (r = 2.0, A > 0 ->
    # clipped high); one common token moved down with A < 0 (r = 0.5 -> clipped low); the rest r = 1.
    old_p = [0.02, 0.05] + [0.9] * 8
    ratios = [2.0, 2.0, 0.5] + [1.0] * 7
    advs = [1.0, 1.0, -1.0] + [1.0] * 7
    old = [math.log(p) for p in old_p] + [-1e4]
    logp = [o + math.log(r) for o, r in zip(old, ratios)] + [1e4]
    return PolicyLossInputs(
        logp_BT=torch.tensor([logp], dtype=torch.float64, requires_grad=True),
        old_logp_BT=torch.tensor([old], dtype=torch.float64),
        advantages_BT=torch.tensor([advs + [float("nan")]], dtype=torch.float64),
        mask_BT=torch.tensor([[1.0] * 10 + [0.0]], dtype=torch.float64),
    )


def test_rare_tokens_are_the_lowest_probability_quantile_of_masked_tokens():
    inp = _batch()
    rare = _rare_tokens(inp.old_logp_BT, inp.mask_BT > 0, q=0.2)
    assert rare[0].tolist() == [True, True] + [False] * 9  # the padded -1e4 position is not counted
    one = _rare_tokens(inp.old_logp_BT, inp.mask_BT > 0, q=0.01)  # at least one token
    assert one[0].tolist() == [True] + [False] * 10


@pytest.mark.parametrize("name", ["ppo_clip", "cispo"])
def test_clip_share_by_rarity_hand_values(name):
    _, m = POLICY_LOSSES[name](_batch(), PolicyLossConfig(name=name, clip_low=0.2, clip_high=0.28))
    assert m["clip_frac_rare"].item() == pytest.approx(1.0)  # both rare tokens clipped
    assert m["clip_frac_common"].item() == pytest.approx(1 / 8)  # one of the eight common ones


def test_ppo_clip_drops_the_rare_tokens_gradient_cispo_keeps_it():
    cfg = dict(clip_low=0.2, clip_high=0.28)
    grads = {}
    for name in ("ppo_clip", "cispo"):
        inp = _batch()
        loss_BT, _ = POLICY_LOSSES[name](inp, PolicyLossConfig(name=name, **cfg))
        loss_BT.sum().backward()
        grads[name] = inp.logp_BT.grad[0].tolist()
    assert grads["ppo_clip"][:3] == pytest.approx([0.0, 0.0, 0.0])  # clipped: no gradient
    # CISPO: -sg(clip(r)) * A per token: the rare tokens keep -1.28 * 1, the low one -0.8 * -1
    assert grads["cispo"][:3] == pytest.approx([-1.28, -1.28, 0.8])
    assert grads["ppo_clip"][3] == pytest.approx(-1.0) and grads["cispo"][3] == pytest.approx(-1.0)


def test_no_masked_tokens_gives_zero_shares():
    inp = _batch()
    inp = PolicyLossInputs(inp.logp_BT, inp.old_logp_BT, inp.advantages_BT, torch.zeros_like(inp.mask_BT))
    _, m = POLICY_LOSSES["ppo_clip"](inp, PolicyLossConfig(name="ppo_clip"))
    assert m["clip_frac_rare"].item() == 0.0 and m["clip_frac_common"].item() == 0.0
