"""What the hardware does natively, and the precision tether picks from it (house rule 13).

bf16 autocast pays off only where the matmul units do bf16 natively. Measured on two 2-core
CPUs of the same cloud machine class (docs/performance.md): on an AMD EPYC with
AVX-512-BF16, bf16 autocast training of the 3.2M benchmark model ran ~2.7x faster than fp32;
on an AMD EPYC with AVX2 only it ran ~13x *slower* (22.6 s vs 1.7 s per step), because oneDNN
emulates bf16 there with conversions around fp32 arithmetic.

Native bf16:
- x86 CPU: the `avx512_bf16` or `amx_bf16` flag in /proc/cpuinfo;
- aarch64 CPU: `bf16` in the Features line (Armv8.6 BF16 instructions);
- CUDA: `torch.cuda.is_bf16_supported()` (Ampere and later).

`model.autocast_bf16: auto` (the default) resolves through `choose_precision`; an explicit
true/false always wins. The choice and its reason are logged at run start and recorded in
every run's summary.json (`precision`) and every benchmark result. TETHER_NATIVE_BF16=1|0 overrides the
detection (simulating the other kind of CPU; a VM that hides the flags).

Simulating an AVX2-only CPU on a newer one: the kernel libraries' own ISA caps,
ATEN_CPU_CAPABILITY=avx2 (PyTorch's vectorised ops), ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN: bf16 and
fp32 matmuls and convolutions) and MKL_ENABLE_INSTRUCTIONS=AVX2 (MKL's sgemm). `cpu_info` honours
them: when one caps the ISA below AVX-512 the AVX-512 and AMX flags are dropped from the effective
flags (so bf16 is not native, and `auto` picks fp32) and the caps are recorded as `isa_mask`.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# flags worth recording: what decides the precision, and what decides the speed of fp32 kernels
_X86_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx512_vnni", "avx_vnni")
_ARM_FLAGS = ("asimd", "sve", "sve2", "bf16", "i8mm")
_BF16_FLAGS = {"x86_64": ("avx512_bf16", "amx_bf16"), "aarch64": ("bf16",)}
FORCE_ENV = "TETHER_NATIVE_BF16"
# the kernel libraries' ISA caps, and the values that keep them below AVX-512
ISA_MASK_ENVS = {"ATEN_CPU_CAPABILITY": ("default", "avx2"),
                 "ONEDNN_MAX_CPU_ISA": ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"),
                 "MKL_ENABLE_INSTRUCTIONS": ("SSE4_2", "AVX", "AVX2")}


def isa_mask() -> dict[str, str]:
    """The ISA caps set in the environment that keep the kernels below AVX-512 (see the module doc)."""
    out = {}
    for env, below in ISA_MASK_ENVS.items():
        value = os.environ.get(env, "").strip()
        if value and value.upper() in {b.upper() for b in below}:
            out[env] = value
    return out


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, Any]:
    """{model, arch, cores, flags[, family, model_number]}: the CPU's model name, the subset of its
    feature flags that matter for tether's kernels, and on x86 its family and model numbers (from
    /proc/cpuinfo; elsewhere only the platform's names)."""
    arch = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    model, flags, ids = platform.processor() or "unknown", set(), {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model in ("unknown", "", arch):
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("cpu family", "model") and key not in ids and value.strip().isdigit():
            ids[key] = int(value)
    wanted = _ARM_FLAGS if arch == "aarch64" else _X86_FLAGS
    info = {"model": model, "arch": arch, "cores": os.cpu_count(), "flags": sorted(f for f in wanted if f in flags)}
    if len(ids) == 2:  # x86: the microarchitecture, which a VM's model name ("AMD EPYC") often hides
        info["family"], info["model_number"] = ids["cpu family"], ids["model"]
    mask = isa_mask() if arch == "x86_64" else {}
    if mask:  # the kernels cannot use what is masked: the effective CPU is an AVX2 one
        info["flags"] = [f for f in info["flags"] if not f.startswith(("avx512", "amx"))]
        info["isa_mask"] = mask
    return info


def cpu_native_bf16(info: dict[str, Any] | None = None) -> bool:
    """Whether the CPU has bf16 matmul instructions (see the module doc). TETHER_NATIVE_BF16=1 or 0
    overrides the detection (to simulate the other kind of CPU, or where a VM hides the flags)."""
    forced = os.environ.get(FORCE_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    info = info or cpu_info()
    return any(f in info["flags"] for f in _BF16_FLAGS.get(info["arch"], ()))


def cpu_generation(info: dict[str, Any] | None = None) -> str | None:
    """"family 25 model 17": the x86 family and model numbers (a CPU generation: AMD's Zen 4 and Zen
    5 EPYCs share the name "AMD EPYC" and the class native-bf16, but not their speed ratios); None
    where /proc/cpuinfo gives no numbers (ARM, other systems)."""
    info = info or cpu_info()
    if "family" not in info:
        return None
    return f"family {info['family']} model {info['model_number']}"


def cpu_class(info: dict[str, Any] | None = None) -> str:
    """A coarse CPU class for comparing benchmark baselines: native-bf16, avx512, avx2, other."""
    info = info or cpu_info()
    if cpu_native_bf16(info):
        return "native-bf16"
    if "avx512f" in info["flags"]:
        return "avx512"
    return "avx2" if "avx2" in info["flags"] else "other"


@dataclass(frozen=True)
class PrecisionChoice:
    autocast_bf16: bool
    reason: str


def choose_precision(setting: bool | str, device: str = "cpu") -> PrecisionChoice:
    """Resolve `model.autocast_bf16` (true | false | "auto") for `device`: an explicit setting wins;
    `auto` picks bf16 autocast only where the device does bf16 natively, fp32 otherwise."""
    if isinstance(setting, bool):
        return PrecisionChoice(setting, f"model.autocast_bf16={str(setting).lower()} (set explicitly)")
    if setting != "auto":
        raise ValueError(f"model.autocast_bf16: expected true, false or auto, got {setting!r}")
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else "no CUDA device"
        why = f"{name} {'supports' if native else 'does not support'} bf16 natively"
    elif kind == "cpu":
        info = cpu_info()
        native = cpu_native_bf16(info)
        forced = os.environ.get(FORCE_ENV, "").strip()
        evidence = (f"{FORCE_ENV}={forced}" if forced in ("0", "1") else
                    ", ".join(f for f in _BF16_FLAGS.get(info["arch"], ()) if f in info["flags"]) if native else
                    f"no {' / '.join(_BF16_FLAGS.get(info['arch'], ('bf16',)))}")
        if not native and info.get("isa_mask") and forced not in ("0", "1"):
            evidence += f"; ISA capped by {', '.join(f'{k}={v}' for k, v in info['isa_mask'].items())}"
        why = (f"CPU {info['model']} has native bf16 ({evidence})" if native else
               f"CPU {info['model']} has no native bf16 ({evidence}): bf16 would be emulated, slower than fp32")
    else:
        native, why = False, f"device {device}: bf16 support not detected"
    return PrecisionChoice(native, f"auto: {why} -> {'bf16 autocast' if native else 'fp32'}")


def resolve_autocast(setting: bool | str, device: str | Any = "cpu") -> bool:
    """The boolean that `setting` means on `device` (see choose_precision)."""
    return choose_precision(setting, str(device)).autocast_bf16


def precision_record(setting: bool | str, device: str, autocast_bf16: bool,
                     kernels: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run's summary.json and a benchmark result record: the setting, the precision used,
    why, the CPU (model, class, generation, flags) and, on a CPU, `kernels`: the linear layers'
    kernels (`tether.policy.cpu_gemm.describe()`; tether.train.setup.precision_summary passes them)."""
    choice = choose_precision(setting, device)
    reason = choice.reason if choice.autocast_bf16 == autocast_bf16 else "inherited from the policy passed in"
    info = cpu_info()
    gemm = dict(kernels or {}) if str(device).startswith("cpu") else {}
    return {"setting": setting, "autocast_bf16": bool(autocast_bf16), "precision": "bf16" if autocast_bf16 else "fp32",
            "reason": reason, "device": device, **gemm, "cpu": info["model"], "cpu_class": cpu_class(info),
            "cpu_generation": cpu_generation(info), "cpu_flags": info["flags"], "cores": info["cores"], **({"isa_mask": info["isa_mask"]} if "isa_mask" in info else {})}


# Measured on the native-bf16 AMD EPYCs of 2026-11-30 and 2026-12-02 (docs/performance.md, "Compile
# when it pays"): compiling the training forward and the decode step under bf16 autocast saved
# ~1e-11 s per (parameter x token) of a step on the 3.2M and 25.4M benchmark models (0.15 s and ~1 s
# per step); both compilations cost 36-48 s in a fresh inductor cache (25-28 s the decode step,
# 11-20 s the training forward), less from a warm one. In fp32 the gain is small (decode 0.91-0.98)
# or negative (the training forward on the AVX2 EPYC's large model), so `auto` leaves fp32 eager.
COMPILE_SAVING_S_PER_PARAM_TOKEN = 1e-11
COMPILE_COST_S = 60.0  # the two cold compilations, with a margin


@dataclass(frozen=True)
class CompileChoice:
    train: bool
    rollout: bool
    reason: str


def choose_compile(train: bool | str, rollout: bool | str, *, autocast_bf16: bool, device: str, params: int,
                   tokens_per_step: int, steps: int, supported: tuple[bool, bool] = (True, True)) -> CompileChoice:
    """Resolve `train.compile` and `rollout.compile` (true | false | "auto"). An explicit setting wins.
    `auto` compiles (both, where `supported`) when the run is long enough for the compilation to
    pay: bf16 autocast on a CPU and an estimated saving of COMPILE_SAVING_S_PER_PARAM_TOKEN x
    params x tokens per step x steps of at least COMPILE_COST_S. A rule of the config and the model
    only, never of timings: two runs of one config make the same choice (and round alike)."""
    for key, v in (("train.compile", train), ("rollout.compile", rollout)):
        if not isinstance(v, bool) and v != "auto":
            raise ValueError(f"{key}: expected true, false or auto, got {v!r}")
    saving = COMPILE_SAVING_S_PER_PARAM_TOKEN * params * tokens_per_step * steps
    if not autocast_bf16:
        why, on = "fp32: compiling gains little or nothing measured", False
    elif not str(device).startswith("cpu"):
        why, on = f"device {device}: the compiled paths are measured on CPUs only", False
    else:
        on = saving >= COMPILE_COST_S
        why = (f"~{saving:.0f} s saved over {steps} steps (est.: {params / 1e6:.1f}M parameters x {tokens_per_step} tokens "
               f"per step) {'>=' if on else '<'} ~{COMPILE_COST_S:.0f} s to compile")
    t = train if isinstance(train, bool) else on and supported[0]
    r = rollout if isinstance(rollout, bool) else on and supported[1]
    explicit = [k for k, v in (("train.compile", train), ("rollout.compile", rollout)) if isinstance(v, bool)]
    reason = (f"auto: {why}" if len(explicit) < 2 else "") + (
        ("; " if len(explicit) < 2 else "") + ", ".join(f"{k} set explicitly" for k in explicit) if explicit else "")
    return CompileChoice(bool(t), bool(r), reason)


def runnable_others(samples: int = 5, interval: float = 0.05) -> float | None:
    """Processes other than this one that are runnable right now (the mean of `samples` reads of
    /proc/loadavg's running count, which includes the reader); None where there is no /proc."""
    counts = []
    for i in range(samples):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(interval)
    return sum(counts) / len(counts)


def choose_threads(setting: int | str | None, cores: int | None = None, load: float | None = None,
                   running: float | None = None) -> tuple[int | None, str]:
    """torch intra-op threads for `run.threads`: a number is kept; None leaves torch's default;
    "auto" takes the cores that other work leaves free (at least 1), because on an oversubscribed
    CPU two torch threads spin-wait on each other and a step can take many times longer than with
    one (measured on the 2-core EPYC under load: docs/performance.md).

    Other work is the smaller of the 1-minute load average and the processes runnable right now
    (`runnable_others`): the load average alone still counts a job that has just ended (after
    `make install` it reads ~0.6 for a minute, which took `make demo` from 2 threads to 1), and
    the instantaneous count alone would miss a job that is momentarily waiting on I/O."""
    if setting != "auto":
        return (int(setting) if setting else None), "configured" if setting else "torch default"
    cores = cores or os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # not available on this platform
            return cores, f"auto: {cores} cores (no load average here)"
    if running is None:
        running = runnable_others()
    busy = load if running is None else min(load, running)
    free = max(1, min(cores, int(cores - busy + 0.5)))
    now = "" if running is None else f", {running:.1f} other processes runnable now"
    return free, f"auto: {cores} cores, 1-minute load average {load:.1f}{now} -> {free}"

