"""Linear layers on a CPU through oneDNN: fp32 training matmuls, and weights packed once for decoding.

PyTorch sends an fp32 `F.linear` (and `mm`) on a CPU to its BLAS, MKL's sgemm. On the AMD EPYCs
tether is measured on, MKL runs the shapes of a small model's step well below the machine's fp32
matmul peak, while oneDNN's inner-product kernel (which PyTorch ships and exposes as
`torch.ops.mkldnn._linear_pointwise`) runs them at it. `python benchmarks/cpu_gemm.py`
(benchmarks/results/cpu_gemm.json; one thread) measures both on the benchmark models' shapes.

- `linear(x, w, b)`: an fp32 linear whose forward and input gradient run through oneDNN and whose
  weight gradient stays on `mm` (there MKL is as fast). Used by the lean training forward in fp32
  (tether.policy.lean_train) and by the fp32 LM head of both precisions (scoring.fp32_head_logits).
  Everything else (bf16, autocast, GPUs, non-float inputs) is `F.linear`, unchanged.
- `pack(w, rows)` / `packed_linear(x, w, b)`: decoding multiplies a few dozen rows by the same
  weights at every token; oneDNN then spends a good part of each call re-laying the weight out.
  `pack` does that once per generation call (tether.policy.decode) and hangs the packed copy on the
  weight tensor; `packed_linear` uses it (a custom op, so that the compiled decode step can call it
  with the plain tensor as its graph input). bf16 and fp32.

Rounding: oneDNN's fp32 kernels are fp32 arithmetic in another summation order (max error against
float64 of the same order as MKL's; tests/unit/policy/test_cpu_gemm.py). Whether oneDNN is used is
a rule of the machine, never of a timing, so two runs on one machine round alike: the config's
`model.cpu_linear` (onednn | torch) decides when set; at `auto` (the default) `TETHER_CPU_GEMM=onednn|torch`
does; unset, oneDNN on x86-64 CPUs where PyTorch has it (the only CPUs it was measured on),
PyTorch's own dispatch (`torch`) elsewhere. The choice is recorded with the precision in
every run's summary.json (`precision.cpu_linear`).
"""

from __future__ import annotations

import os
import platform

import torch
import torch.nn.functional as F

ENV = "TETHER_CPU_GEMM"
_ATTR = "_tether_onednn_packed"


_CHOICE: list[str] = []  # the process's choice, made at the first call (a plain global: torch.compile traces it)
_CONFIGURED: list[str] = []  # model.cpu_linear when a run set it explicitly (configure)


def backend() -> str:
    """"onednn" or "torch": what fp32 linear layers and the decoder's packed weights use on a CPU."""
    if not _CHOICE:
        _CHOICE.append(_choose())
    return _CHOICE[0]


def reset() -> None:
    """Forget the choice (after changing TETHER_CPU_GEMM in-process: tests, benchmarks/cpu_gemm.py)."""
    _CHOICE.clear()


def configure(setting: str) -> None:
    """Apply `model.cpu_linear` at a run's start: "onednn" or "torch" decide (over TETHER_CPU_GEMM);
    "auto" leaves the choice to the environment variable and the machine. Process-wide: the stage
    that starts next configures it again."""
    if setting not in ("auto", "onednn", "torch"):
        raise ValueError(f"model.cpu_linear={setting!r}: expected auto, onednn or torch")
    _CONFIGURED.clear()
    reset()
    if setting == "onednn" and not _have_onednn():
        raise ValueError("model.cpu_linear=onednn: this PyTorch build has no oneDNN linear kernel; use auto or torch")
    if setting != "auto":
        _CONFIGURED.append(setting)


def _have_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _choose() -> str:
    if _CONFIGURED:
        return _CONFIGURED[0]
    forced = os.environ.get(ENV, "").strip().lower()
    if forced and forced not in ("onednn", "torch"):
        raise ValueError(f"{ENV}={forced!r}: expected onednn or torch (or unset: the machine's default)")
    have = _have_onednn()
    if forced == "onednn" and not have:
        raise ValueError(f"{ENV}=onednn: this PyTorch build has no oneDNN linear kernel; unset it or use torch")
    if forced:
        return forced
    return "onednn" if have and platform.machine().lower() in ("x86_64", "amd64") else "torch"


def describe() -> dict[str, str]:
    """The backend and why, as a run's summary.json records it (tether.hardware.precision_record)."""
    return {"cpu_linear": backend(), "cpu_linear_reason": reason()}


def reason() -> str:
    if _CONFIGURED:
        return f"model.cpu_linear={_CONFIGURED[0]} (set explicitly)"
    if os.environ.get(ENV):
        return f"{ENV}={os.environ[ENV]}"
    return ("oneDNN's inner-product kernels on this x86-64 CPU (faster than MKL's sgemm on the measured CPUs: "
            "benchmarks/cpu_gemm.py)" if backend() == "onednn" else "PyTorch's own kernels (no oneDNN, or not an x86-64 CPU)")


def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ w [N, K].T + b through oneDNN's inner product; w's packed copy where `pack` made one."""
    kernel_w = getattr(w, _ATTR, None)
    kernel_w = w.contiguous() if kernel_w is None else kernel_w
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), kernel_w, b, "none", [], "")
    return out.view(*x.shape[:-1], w.shape[0])


@torch.library.custom_op("tether::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ w[N, K].T + b through oneDNN (x, w, b fp32 on a CPU)."""
    return _onednn(x, w, b)


@onednn_linear.register_fake
def _(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _setup(ctx, inputs, output):
    x, w, b = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    g2 = grad.reshape(-1, grad.shape[-1])
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:  # grad @ w, as a linear layer with weight w.T (oneDNN: the faster one here)
        gx = onednn_linear(grad, w.t().contiguous(), None)
    if ctx.needs_input_grad[1]:  # grad.T @ x: mm, as fast as oneDNN here without the transposed copies
        gw = g2.t().mm(x.reshape(-1, x.shape[-1]))
    if ctx.has_bias and ctx.needs_input_grad[2]:
        gb = g2.sum(0)
    return gx, gw, gb


onednn_linear.register_autograd(_backward, setup_context=_setup)


def _fp32_cpu(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and w.dtype == torch.float32 and w.dim() == 2
            and not torch.is_autocast_enabled("cpu"))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, w, b)`; fp32 on a CPU through oneDNN where `backend()` says so."""
    if _fp32_cpu(x, w) and x.numel() and (b is None or b.dtype == torch.float32) and backend() == "onednn":
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


def can_pack(dtype: torch.dtype) -> bool:
    """Whether `pack`/`packed_linear` serve this dtype here: oneDNN chosen, and for bf16 a CPU whose
    oneDNN does bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; on an AVX2-only CPU oneDNN refuses to
    lay out a bf16 weight at all)."""
    if backend() != "onednn" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return dtype == torch.float32 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(w: torch.Tensor, rows: int) -> torch.Tensor:
    """`w` (bf16 or fp32, on a CPU) carrying a copy laid out for oneDNN's kernel at about `rows`
    input rows, which `packed_linear` uses. The packed copy is taken now: pack again after `w` changes."""
    if w.device.type == "cpu" and can_pack(w.dtype):
        w = w.detach()  # a new tensor object: the attribute never lands on a model parameter
        setattr(w, _ATTR, torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), max(1, rows)))
    return w


@torch.library.custom_op("tether::packed_linear", mutates_args=())
def _packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return _onednn(x, w, b)


@_packed_linear.register_fake
def _(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, w, b)` for inference through oneDNN, with `w`'s packed copy when `pack` made
    one; x, w and b of one dtype (bf16 or fp32), on a CPU, and `backend()` "onednn". Eagerly the
    kernel is called directly, without the custom op's Python (a few us a call under inference
    mode, ~18 us outside it); under torch.compile through the custom op, because inductor's own
    lowering of oneDNN's linear requires the packed weight to be a compile-time constant (a lowering
    of ours to a direct call measured no faster: docs/performance.md)."""
    if torch.compiler.is_compiling():
        return _packed_linear(x, w, b)
    if not x.numel():
        return F.linear(x, w, b)
    return _onednn(x, w, b)
