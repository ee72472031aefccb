"""oneDNN linear layers (tether.policy.cpu_gemm): the same math as F.linear, forward and backward,
packed or not, chosen by a rule that an environment variable overrides."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tiny_policy_helpers import make_tiny_policy

from tether.config import SamplingConfig
from tether.policy import cpu_gemm
from tether.policy.hf import run_generate

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


@pytest.fixture
def gemm_backend(monkeypatch):
    """Set TETHER_CPU_GEMM for one test; the cached choice is cleared before and after."""
    def use(value):
        monkeypatch.setenv(cpu_gemm.ENV, value)
        cpu_gemm.reset()
    yield use
    monkeypatch.delenv(cpu_gemm.ENV, raising=False)
    cpu_gemm.configure("auto")  # also forgets a model.cpu_linear a test set


def _grads(fn, x, w, b, g):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(g)
    return y.detach(), x.grad, w.grad, b.grad


@needs_onednn
def test_onednn_linear_matches_f_linear_forward_and_backward(gemm_backend):
    gemm_backend("onednn")
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 50, 96), torch.randn(160, 96), torch.randn(160)
    g = torch.randn(3, 50, 160)
    ours = _grads(cpu_gemm.linear, x, w, b, g)
    ref = _grads(F.linear, x, w, b, g)
    exact = _grads(lambda *a: F.linear(*(t.double() for t in a)), x, w, b, g.double())
    assert cpu_gemm.linear(x.requires_grad_(), w, b).grad_fn.name().startswith("GeneratedBackwardFor_tether_onednn_linear")
    for name, a, r, e in zip(("out", "dx", "dw", "db"), ours, ref, exact):
        assert a.shape == r.shape and a.dtype == torch.float32, name
        assert torch.allclose(a, r, rtol=1e-5, atol=1e-4), name
        # fp32 arithmetic in another order: as close to float64 as BLAS's own result, within a small factor
        err, ref_err = (a.double() - e).abs().max().item(), (r.double() - e).abs().max().item()
        assert err <= 4 * ref_err + 1e-6, (name, err, ref_err)


@needs_onednn
def test_linear_leaves_bf16_and_autocast_to_f_linear(gemm_backend):
    gemm_backend("onednn")
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = cpu_gemm.linear(x, w)
    assert y.dtype == torch.bfloat16
    assert cpu_gemm.linear(x.bfloat16(), w.bfloat16()).dtype == torch.bfloat16


def test_torch_setting_keeps_f_linear_and_a_bad_setting_names_the_variable(gemm_backend):
    gemm_backend("torch")
    x, w = torch.randn(4, 32, requires_grad=True), torch.randn(8, 32)
    assert cpu_gemm.backend() == "torch"
    assert "onednn" not in cpu_gemm.linear(x, w).grad_fn.name()
    assert not hasattr(cpu_gemm.pack(w, 4), cpu_gemm._ATTR)
    gemm_backend("mkl")
    with pytest.raises(ValueError, match="TETHER_CPU_GEMM"):
        cpu_gemm.backend()


@needs_onednn
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_linear_matches_f_linear_and_never_marks_the_parameter(gemm_backend, dtype, tol):
    gemm_backend("onednn")
    torch.manual_seed(1)
    param = torch.nn.Parameter(torch.randn(96, 64).to(dtype))
    x, b = torch.randn(13, 64).to(dtype), torch.randn(96).to(dtype)
    packed = cpu_gemm.pack(param, 16)
    assert packed is not param and hasattr(packed, cpu_gemm._ATTR) and not hasattr(param, cpu_gemm._ATTR)
    with torch.inference_mode():
        out = cpu_gemm.packed_linear(x, packed, b)
        ref = F.linear(x, param, b)
    assert out.dtype == dtype and torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol)


@needs_onednn
def test_compiled_graph_calls_the_custom_ops(gemm_backend):
    gemm_backend("onednn")
    torch.manual_seed(2)
    w = torch.randn(48, 32, requires_grad=True)
    x = torch.randn(10, 32)

    def f(x, w):
        return torch.tanh(cpu_gemm.linear(x, w)).sum()

    torch.compile(f)(x, w).backward()
    got, w.grad = w.grad, None
    f(x, w).backward()
    assert torch.allclose(got, w.grad, rtol=1e-5, atol=1e-5)
    packed = cpu_gemm.pack(w.detach().bfloat16(), 10)
    with torch.inference_mode():
        out = torch.compile(lambda a, b: torch.relu(cpu_gemm.packed_linear(a, b)))(x.bfloat16(), packed)
        assert torch.allclose(out.float(), torch.relu(F.linear(x.bfloat16(), packed)).float(), atol=2e-2)


@needs_onednn
def test_lean_decoder_samples_alike_with_packed_and_unpacked_weights(gemm_backend, monkeypatch):
    policy = make_tiny_policy(hidden=64, heads=4, inter=128, seed=1)
    calls = []
    real = cpu_gemm.packed_linear
    monkeypatch.setattr(cpu_gemm, "packed_linear", lambda *a: calls.append(1) or real(*a))
    prompts = [policy.tokenizer.encode(t) for t in ("12+3=", "1+2=", "29+29=")] * 2
    out = {}
    for setting in ("onednn", "torch"):
        gemm_backend(setting)
        pol = dataclasses.replace(policy, lean_decode=True)
        out[setting] = run_generate(pol, prompts, SamplingConfig(max_new_tokens=12, temperature=0.8),
                                    torch.Generator().manual_seed(3))
        assert bool(calls) == (setting == "onednn")
        calls.clear()
    for a, b in zip(out["onednn"], out["torch"]):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5)


@needs_onednn
def test_empty_inputs_pass_through(gemm_backend):
    gemm_backend("onednn")
    w = torch.randn(8, 32)
    assert cpu_gemm.linear(torch.randn(0, 32), w).shape == (0, 8)
    assert cpu_gemm.packed_linear(torch.randn(0, 32), cpu_gemm.pack(w, 4)).shape == (0, 8)


def test_bf16_is_packed_only_where_onednn_does_bf16(gemm_backend, monkeypatch):
    # an AVX2-only CPU: oneDNN refuses to lay out a bf16 weight, so the decoder must not ask it to
    gemm_backend("onednn")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    w = torch.randn(8, 32)
    assert cpu_gemm.can_pack(torch.float32) and not cpu_gemm.can_pack(torch.bfloat16)
    assert not hasattr(cpu_gemm.pack(w.bfloat16(), 4), cpu_gemm._ATTR)
    from tether.policy.decode import LeanDecoder

    policy = make_tiny_policy(hidden=64, heads=4, inter=128, seed=1)
    assert LeanDecoder(policy.model, 2, 16, bf16=False).packed
    assert not LeanDecoder(policy.model, 2, 16, bf16=True).packed


def test_config_key_decides_over_the_environment_and_auto_gives_it_back(gemm_backend):
    # model.cpu_linear: an explicit setting wins over TETHER_CPU_GEMM and names itself as the reason;
    # auto hands the choice back to the variable (and the machine)
    from tether.config import load_config
    from tether.hardware import precision_record
    from tether.train.setup import configure_process

    gemm_backend("onednn" if torch.backends.mkldnn.is_available() else "torch")
    cpu_gemm.configure("torch")
    assert cpu_gemm.backend() == "torch" and cpu_gemm.reason() == "model.cpu_linear=torch (set explicitly)"
    rec = precision_record("auto", "cpu", False, cpu_gemm.describe())
    assert rec["cpu_linear"] == "torch" and "model.cpu_linear" in rec["cpu_linear_reason"]
    cpu_gemm.configure("auto")
    assert cpu_gemm.reason().startswith(cpu_gemm.ENV)
    cfg = load_config(None, ["model.cpu_linear=torch"])
    configure_process(cfg.sandbox, cfg.model)  # a run's start
    assert cpu_gemm.backend() == "torch"
    with pytest.raises(ValueError, match="model.cpu_linear"):
        cpu_gemm.configure("mkl")
    with pytest.raises(Exception, match="cpu_linear"):
        load_config(None, ["model.cpu_linear=mkl"])
