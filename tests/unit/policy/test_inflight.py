"""In-flight weight updates (tether.policy.inflight): weights offered while a generation runs are
taken between two decode steps; every token records the version it was sampled under, and its
log-prob is that version's (the prefix is re-prefilled with the new weights)."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_policy_helpers import make_tiny_policy  # noqa: E402

from tether.config import SamplingConfig  # noqa: E402
from tether.policy.hf import compute_logprobs, run_generate  # noqa: E402
from tether.policy.inflight import WeightFeed, expand_versions  # noqa: E402

SWITCH = 3  # the feed receives version 1 during the 3rd poll: tokens 0-2 come from version 0


class OfferDuringDecode(WeightFeed):
    """Offers the new weights while the decode loop is running (at its SWITCH-th poll)."""

    def __init__(self, state):
        super().__init__()
        self.state, self.polls = state, 0

    def take(self):
        self.polls += 1
        if self.polls == SWITCH:
            self.offer(1, self.state)
        return super().take()


def test_expand_versions():
    assert expand_versions([(0, 4)], 3) == (4, 4, 4)
    assert expand_versions([(0, 4), (2, 5), (3, 7)], 5) == (4, 4, 5, 7, 7)
    assert expand_versions([(0, 4), (6, 5)], 3) == (4, 4, 4)  # finished before the switch


@pytest.mark.parametrize("lean", [True, False])
def test_tokens_carry_the_version_that_sampled_them(lean):
    torch.manual_seed(0)
    policy = make_tiny_policy()
    policy.lean_decode = lean
    old = copy.deepcopy(policy)
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in policy.model.state_dict().items()}
    policy.weight_feed = OfferDuringDecode(new_state)
    prompts = [policy.tokenizer.encode(p) for p in ("1+2=", "12+7=", "3+3=", "20+9=")]
    samples = run_generate(policy, prompts, SamplingConfig(max_new_tokens=8, temperature=1.0),
                           torch.Generator().manual_seed(1))
    assert policy.version == 1 and torch.equal(policy.model.state_dict()["lm_head.weight"], new_state["lm_head.weight"])
    long = [s for s in samples if len(s.token_ids) > SWITCH]
    assert long, "every sample stopped before the switch: nothing was tested"
    gaps = []
    for s in samples:
        n = len(s.token_ids)
        assert s.policy_version == 0
        assert s.token_versions == (0,) * min(n, SWITCH) + (1,) * max(0, n - SWITCH)
        ids = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
        mask = torch.ones_like(ids)
        P = len(s.prompt_ids)
        got = torch.tensor(s.logprobs)
        with torch.no_grad():
            under_old = compute_logprobs(old, ids, mask)[0][0, P:]
            under_new = compute_logprobs(policy, ids, mask)[0][0, P:]
        want = torch.where(torch.arange(n) < SWITCH, under_old, under_new)
        assert torch.allclose(got, want, atol=2e-4), (s, got - want)
        gaps.append(float((under_old - under_new)[SWITCH:].abs().max()) if n > SWITCH else 0.0)
    assert max(gaps) > 1e-2  # the versions differ enough that a wrong tag or a stale prefix would show

