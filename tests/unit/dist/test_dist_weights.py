"""Weights as numpy: bit-exact round trips (bf16 included), checksums that notice one changed
element, and a model bundle that rebuilds the same policy without a shared filesystem."""

import torch

from tether.policy.weights import (
    build_policy_from_bundle, compute_checksum, compute_state_checksum, from_numpy_state, make_model_bundle,
    to_numpy_state,
)
from tether.policy.hf import compute_logprobs


def test_round_trip_is_bit_exact_for_every_dtype():
    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6), "d": torch.rand(2) > 0.5}
    back = from_numpy_state(to_numpy_state(state))
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)


def test_checksum_sees_one_element_and_ignores_order():
    state = {"w": torch.randn(4, 4), "b": torch.zeros(4)}
    base = compute_checksum(to_numpy_state(state))
    assert compute_checksum(to_numpy_state(dict(reversed(list(state.items()))))) == base
    state["w"][2, 3] += 1e-6
    assert compute_checksum(to_numpy_state(state)) != base


def test_bundle_rebuilds_the_policy(tiny):
    _, _, policy = tiny
    clone = build_policy_from_bundle(make_model_bundle(policy))
    assert compute_state_checksum(clone.model) == compute_state_checksum(policy.model)
    assert clone.stop_ids == policy.stop_ids and clone.pad_id == policy.pad_id and clone.version == policy.version
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    a, _ = compute_logprobs(policy, ids, torch.ones_like(ids))
    b, _ = compute_logprobs(clone, ids, torch.ones_like(ids))
    assert torch.equal(a, b)
