"""A module forward hook (a fault's, a user's probe) runs on every path: the lean training forward
and the lean decode step step aside for a hooked model (transformers' forward runs the hook), and
a hook on the LM head, which no path would run, is refused with a message."""

import copy
import dataclasses

import pytest
import torch

from tiny_policy_helpers import make_tiny_policy, right_pad

from tether.config import SamplingConfig
from tether.policy import decode, lean_train
from tether.policy.hf import compute_logprobs, run_generate
from tether.policy.prefix import compute_logprobs_shared


@pytest.fixture(scope="module")
def policy():
    return make_tiny_policy(hidden=64, heads=4, inter=128, seed=3)


def _scale(module, args, out):
    return out * 0.5  # the final norm's output halved: logits halved, a hotter distribution


def test_a_hooked_model_is_not_taken_by_the_lean_paths(policy):
    model = copy.deepcopy(policy.model)
    assert decode.supports(model) and lean_train.supports(model)
    h = model.get_decoder().norm.register_forward_hook(_scale)
    with pytest.warns(UserWarning, match="forward hooks"):
        assert not decode.supports(model)
    assert not lean_train.supports(model)
    h.remove()
    assert decode.supports(model) and lean_train.supports(model)


def test_the_training_forward_runs_the_hook_on_the_lean_setting(policy):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, 60, (n,), generator=g) for n in (7, 5, 9)]
    ids, mask = right_pad(seqs)
    group = torch.tensor([0, 1, 2])
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model), lean_train="eager")
    plain, _ = compute_logprobs_shared(pol, ids, mask, group, temperature=1.0)
    pol.model.get_decoder().norm.register_forward_hook(_scale)
    with pytest.warns(UserWarning):
        hooked, _ = compute_logprobs_shared(pol, ids, mask, group, temperature=1.0)
    ref = dataclasses.replace(pol, lean_train="off")
    expected, _ = compute_logprobs_shared(ref, ids, mask, group, temperature=1.0)
    assert torch.allclose(hooked, expected, atol=1e-5)  # the hook ran: the same as transformers' forward with it
    assert (hooked - plain).abs().max() > 1e-2  # and it changed the log-probs


def test_sampling_runs_the_hook_too(policy):
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model), lean_decode=True)
    prompts = [policy.tokenizer.encode("12+3=")] * 2
    pol.model.get_decoder().norm.register_forward_hook(_scale)
    with pytest.warns(UserWarning):
        s = run_generate(pol, prompts, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))[0]
    seq = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
    lp, _ = compute_logprobs(pol, seq, torch.ones_like(seq, dtype=torch.bool))
    # the sampler's log-probs are those of the hooked model (the trainer scores it the same way)
    assert torch.allclose(lp[0, len(s.prompt_ids):], torch.tensor(s.logprobs), atol=2e-5)


def test_a_hook_on_the_lm_head_is_refused(policy):
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    pol.model.get_output_embeddings().register_forward_hook(_scale)
    seq = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(TypeError, match="LM head"):
        compute_logprobs(pol, seq, torch.ones_like(seq, dtype=torch.bool))
