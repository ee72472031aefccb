"""Hardware-aware precision (tether.hardware): `auto` follows native bf16, an explicit setting wins."""

import json
from pathlib import Path

import pytest
import torch

from tether import hardware
from tether.config import load_config

AVX2 = {"model": "AMD EPYC", "arch": "x86_64", "cores": 2, "flags": ["avx2", "fma"]}
AVX512_BF16 = {"model": "Intel Xeon", "arch": "x86_64", "cores": 2, "flags": ["avx2", "avx512_bf16", "avx512f", "fma"]}
AMX = {"model": "Intel Xeon (SPR)", "arch": "x86_64", "cores": 2, "flags": ["amx_bf16", "amx_tile", "avx2", "avx512f"]}
ARM_BF16 = {"model": "Neoverse-V1", "arch": "aarch64", "cores": 2, "flags": ["asimd", "bf16", "sve"]}
ARM_PLAIN = {"model": "Cortex-A72", "arch": "aarch64", "cores": 2, "flags": ["asimd"]}


@pytest.fixture
def fake_cpu(monkeypatch):
    monkeypatch.delenv("TETHER_NATIVE_BF16", raising=False)

    def use(info):
        monkeypatch.setattr(hardware, "cpu_info", lambda: info)
    return use


@pytest.mark.parametrize("info,native,cls", [(AVX2, False, "avx2"), (AVX512_BF16, True, "native-bf16"),
                                             (AMX, True, "native-bf16"), (ARM_BF16, True, "native-bf16"),
                                             (ARM_PLAIN, False, "other")])
def test_auto_picks_bf16_only_with_native_bf16(fake_cpu, info, native, cls):
    fake_cpu(info)
    choice = hardware.choose_precision("auto", "cpu")
    assert choice.autocast_bf16 is native
    assert ("bf16 autocast" if native else "fp32") in choice.reason and info["model"] in choice.reason
    assert hardware.cpu_class(info) == cls


@pytest.mark.parametrize("forced,expected", [("1", True), ("0", False)])
def test_env_override_simulates_the_other_cpu(fake_cpu, monkeypatch, forced, expected):
    fake_cpu(AVX512_BF16 if forced == "0" else AVX2)
    monkeypatch.setenv("TETHER_NATIVE_BF16", forced)
    choice = hardware.choose_precision("auto", "cpu")
    assert choice.autocast_bf16 is expected and "TETHER_NATIVE_BF16" in choice.reason
    monkeypatch.setenv("TETHER_NATIVE_BF16", "")
    assert hardware.choose_precision("auto", "cpu").autocast_bf16 is not expected


def test_explicit_setting_wins_over_detection(fake_cpu):
    fake_cpu(AVX2)
    assert hardware.choose_precision(True, "cpu").autocast_bf16 is True
    fake_cpu(AVX512_BF16)
    choice = hardware.choose_precision(False, "cpu")
    assert choice.autocast_bf16 is False and "explicitly" in choice.reason


def test_cuda_asks_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "FakeGPU")
    for supported in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert hardware.choose_precision("auto", "cuda").autocast_bf16 is supported


def test_config_default_is_auto_and_overrides_parse():
    assert load_config(None, []).model.autocast_bf16 == "auto"
    assert load_config(None, ["model.autocast_bf16=true"]).model.autocast_bf16 is True
    assert load_config(None, ["model.autocast_bf16=false"]).model.autocast_bf16 is False
    with pytest.raises(Exception, match="autocast_bf16"):
        load_config(None, ["model.autocast_bf16=sometimes"])


def _tiny_cfg(extra):
    return load_config(None, ["data.task=reverse", "data.train_size=16", "data.eval_size=4", "model.tiny.hidden_size=32",
                              "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
                              "run.threads=1"] + extra)


@pytest.mark.parametrize("info,extra,expected", [(AVX2, [], False), (AVX512_BF16, [], True),
                                                 (AVX512_BF16, ["model.autocast_bf16=false"], False),
                                                 (AVX2, ["model.autocast_bf16=true"], True)])
def test_setup_policy_resolves_logs_and_records(fake_cpu, tmp_path, capsys, info, extra, expected):
    from tether.train.setup import precision_summary, setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus

    fake_cpu(info)
    cfg = _tiny_cfg(extra)
    train, _ = setup_problems(cfg.data)
    policy = setup_policy(cfg.model, cfg.run.seed, tmp_path, lambda: compute_tokenizer_corpus(cfg.data.task, train))
    assert policy.autocast_bf16 is expected
    out = capsys.readouterr().out
    assert f"[tether] precision: {'bf16 autocast' if expected else 'fp32'}" in out
    assert "[tether] CPU linear layers: " in out
    rec = precision_summary(cfg.model, policy)
    assert rec["cpu_linear"] in ("onednn", "blas") and rec["cpu_linear_reason"]
    assert rec["precision"] == ("bf16" if expected else "fp32") and rec["cpu"] == info["model"]
    assert rec["cpu_flags"] == info["flags"] and rec["setting"] == cfg.model.autocast_bf16
    json.dumps(rec)  # summary.json material


def test_real_cpu_info_is_well_formed():
    info = hardware.cpu_info()
    assert isinstance(info["model"], str) and info["model"]
    assert set(info["flags"]) <= set(hardware._X86_FLAGS) | set(hardware._ARM_FLAGS)
    assert hardware.cpu_class() in ("native-bf16", "avx512", "avx2", "other")


def test_auto_threads_take_the_cores_the_load_leaves_free():
    from tether.config import ConfigError, build_config
    from tether.hardware import choose_threads

    assert choose_threads("auto", cores=2, load=0.1, running=0)[0] == 2  # idle: both cores
    assert choose_threads("auto", cores=2, load=1.6, running=1)[0] == 1  # one core busy
    assert choose_threads("auto", cores=2, load=9.0, running=8.4)[0] == 1  # oversubscribed: never below 1
    assert choose_threads("auto", cores=16, load=3.2, running=3)[0] == 13
    # a job that has just ended (make install) still weighs on the 1-minute average; nothing runs now
    n, why = choose_threads("auto", cores=2, load=0.7, running=0.0)
    assert n == 2 and "0.0 other processes runnable now" in why
    # a job waiting on I/O at the instant of sampling still counts through the load average
    assert choose_threads("auto", cores=2, load=0.1, running=1.0)[0] == 2
    assert choose_threads("auto", cores=2, load=1.2, running=0.8)[0] == 1
    # no /proc: the load average alone, as before
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hardware, "runnable_others", lambda: None)
        assert choose_threads("auto", cores=2, load=0.7)[0] == 1
    assert choose_threads(3) == (3, "configured") and choose_threads(None)[0] is None
    assert build_config({"run": {"threads": "auto"}}).run.threads == "auto"
    for bad in (0, "lots"):
        with pytest.raises(ConfigError, match="run.threads"):
            build_config({"run": {"threads": bad}})


def test_runnable_others_reads_proc_loadavg(monkeypatch):
    reads = iter(["0.70 0.40 0.20 3/120 999\n", "0.70 0.40 0.20 1/120 999\n", "0.70 0.40 0.20 2/120 999\n"])
    real_read = hardware.Path.read_text
    monkeypatch.setattr(hardware.Path, "read_text", lambda self, *a, **k: next(reads) if str(self) == "/proc/loadavg"
                        else real_read(self, *a, **k))
    monkeypatch.setattr(hardware.time, "sleep", lambda s: None)
    assert hardware.runnable_others(samples=3) == pytest.approx((2 + 0 + 1) / 3)  # the reader itself is not counted


@pytest.mark.parametrize("env,value,masked", [("ONEDNN_MAX_CPU_ISA", "AVX2", True), ("ATEN_CPU_CAPABILITY", "avx2", True),
                                              ("MKL_ENABLE_INSTRUCTIONS", "AVX2", True),
                                              ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", False)])
def test_isa_caps_make_the_effective_cpu_avx2(monkeypatch, tmp_path, env, value, masked):
    # an AVX2-only CPU simulated on a native-bf16 one: the kernel libraries' own caps drop AVX-512/AMX
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_tile\n")
    real_read = hardware.Path.read_text
    monkeypatch.setattr(hardware.Path, "read_text", lambda self, *a, **k: real_read(cpuinfo) if str(self) == "/proc/cpuinfo"
                        else real_read(self, *a, **k))
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    for e in hardware.ISA_MASK_ENVS:
        monkeypatch.delenv(e, raising=False)
    monkeypatch.delenv("TETHER_NATIVE_BF16", raising=False)
    monkeypatch.setenv(env, value)
    hardware.cpu_info.cache_clear()
    try:
        info = hardware.cpu_info()
        assert hardware.cpu_native_bf16(info) is not masked
        assert hardware.cpu_class(info) == ("avx2" if masked else "native-bf16")
        assert (info.get("isa_mask") == {env: value}) is masked
        if masked:
            assert "ISA capped by" in hardware.choose_precision("auto", "cpu").reason
    finally:
        hardware.cpu_info.cache_clear()


def test_compile_auto_compiles_long_bf16_cpu_runs_only():
    # train.compile / rollout.compile = auto: on only where it was measured to pay (bf16 autocast on a
    # CPU) and when the estimated saving over the run reaches the compilation's cost; a rule of the
    # config and the model, so two runs of one config choose alike.
    big = dict(autocast_bf16=True, device="cpu", params=25_400_000, tokens_per_step=4096)
    on = hardware.choose_compile("auto", "auto", steps=80, **big)
    assert (on.train, on.rollout) == (True, True) and "83 s saved over 80 steps" in on.reason
    short = hardware.choose_compile("auto", "auto", steps=20, **big)
    assert (short.train, short.rollout) == (False, False) and "< ~60 s" in short.reason
    small = hardware.choose_compile("auto", "auto", steps=80, **dict(big, params=3_230_000))
    assert not small.train and not small.rollout  # the benchmark's 3.2M model: ~11 s saved over 80 steps
    assert hardware.choose_compile("auto", "auto", steps=10**6, **dict(big, autocast_bf16=False)).reason.startswith("auto: fp32")
    assert not hardware.choose_compile("auto", "auto", steps=10**6, **dict(big, device="cuda:0")).train
    partial = hardware.choose_compile("auto", "auto", steps=80, supported=(False, True), **big)
    assert (partial.train, partial.rollout) == (False, True)  # a model the compiled training forward does not take
    explicit = hardware.choose_compile(True, False, steps=1, **dict(big, autocast_bf16=False))
    assert (explicit.train, explicit.rollout) == (True, False) and "set explicitly" in explicit.reason
    with pytest.raises(ValueError, match="rollout.compile"):
        hardware.choose_compile("auto", "sometimes", steps=1, **big)


def test_compile_settings_accept_auto_and_booleans():
    from tether.config import ConfigError, load_config

    assert load_config(None, []).train.compile == "auto" and load_config(None, []).rollout.compile == "auto"
    assert load_config(None, ["train.compile=true", "rollout.compile=false"]).rollout.compile is False
    with pytest.raises(ConfigError, match="rollout.compile"):
        load_config(None, ["rollout.compile=maybe"])


def test_cpu_generation_names_the_x86_family_and_model():
    assert hardware.cpu_generation({"family": 25, "model_number": 17}) == "family 25 model 17"
    assert hardware.cpu_generation({"model": "Neoverse", "flags": []}) is None  # no numbers (ARM)
    info = hardware.cpu_info()
    if info["arch"] == "x86_64" and Path("/proc/cpuinfo").is_file():
        assert isinstance(info["family"], int) and isinstance(info["model_number"], int)
