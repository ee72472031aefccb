"""The vLLM backend's CPU-testable parts: sampling settings that provably match the trainer's, the
output mapping, and the lazy import (nothing on the CPU path imports vllm)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tether.config import SamplingConfig
from tether.policy.vllm import (
    check_sampling_params, compute_expected_sample_logprob, compute_sampling_kwargs, samples_from_outputs,
)
from tether.types import StopReason


def test_no_silent_filters_or_penalties():
    kw = compute_sampling_kwargs(SamplingConfig(temperature=0.7), (5, 9), 12, seed=3)
    assert kw["temperature"] == 0.7 and kw["top_p"] == 1.0 and kw["top_k"] == 0 and kw["min_p"] == 0.0
    assert kw["repetition_penalty"] == 1.0 and kw["presence_penalty"] == 0.0 and kw["frequency_penalty"] == 0.0
    assert kw["logprobs"] == 0 and kw["stop_token_ids"] == [5, 9] and kw["max_tokens"] == 12 and kw["n"] == 1
    assert kw["ignore_eos"] is False and kw["min_tokens"] == 0 and kw["logit_bias"] is None
    assert compute_sampling_kwargs(SamplingConfig(top_k=20, top_p=0.9), (5,), 4, None)["top_k"] == 20
    g = compute_sampling_kwargs(SamplingConfig(temperature=0.7, top_p=0.9), (5,), 4, None, greedy=True)
    assert g["temperature"] == 0.0 and g["top_p"] == 1.0


def test_constructed_params_are_read_back():
    kw = compute_sampling_kwargs(SamplingConfig(), (5,), 8, seed=1)
    params = SimpleNamespace(**{**kw, "top_k": -1, "stop_token_ids": [5], "logit_bias": {}})  # -1 / {} mean "off"
    check_sampling_params(params, kw)
    for field, value in (("top_k", 50), ("min_p", 0.05), ("repetition_penalty", 1.1), ("temperature", 0.6)):
        with pytest.raises(RuntimeError, match=f"{field}=") as e:
            check_sampling_params(SimpleNamespace(**{**kw, field: value}), kw)
        assert "importance ratios" in str(e.value)


def test_expected_log_prob_is_the_samplers_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])
    raw = torch.log_softmax(logits, -1)  # what prompt_logprobs=-1 returns: logits up to a constant
    s = SamplingConfig(temperature=0.5, top_k=3)
    want = torch.log_softmax(torch.tensor([2.0, 1.0, 0.5]) / 0.5, -1)[1]
    assert compute_expected_sample_logprob(raw, 1, s) == pytest.approx(float(want), abs=1e-6)
    assert compute_expected_sample_logprob(raw, 4, s) == float("-inf")  # outside the top-k: impossible


def _out(ids, reason, stop_reason=None):
    lps = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(ids)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=reason,
                                                    stop_reason=stop_reason)])


def test_outputs_become_samples_with_the_stop_token():
    a, b = samples_from_outputs([_out([7, 8, 5], "stop"), _out([7, 8], "length")], [[1], [2]], (5,), version=4)
    assert a.token_ids == (7, 8, 5) and a.finish is StopReason.EOS and a.policy_version == 4
    assert a.logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert b.finish is StopReason.LENGTH and b.prompt_ids == (2,)
    with pytest.raises(RuntimeError, match="without a stop token"):
        samples_from_outputs([_out([7, 8], "stop", stop_reason="</s>")], [[1]], (5,), 0)


def test_cpu_path_never_imports_vllm():
    code = ("import sys, tether.cli, tether.recipes.rl_async, tether.dist.controller, tether.dist.worker, "
            "tether.policy.vllm, tether.commands.dist; assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
