"""benchmarks/: the equal-footing comparison (tether-best vs TRL-best, same-precision pairs) and
the bench-quick regression guard's verdict. Pure functions; no benchmark is run here."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vs_trl, quick = _load("vs_trl"), _load("bench_quick")


def _arm(s, rss=1000.0):
    return {"s_per_step": s, "peak_rss_mb": rss, "rollout_tokens_per_s": 100 / s, "train_tokens_per_s": 200 / s}


def test_best_vs_best_and_same_precision_pairs():
    # an AVX2 CPU: tether's default is fp32; TRL's fp32 (4.0) beats its bf16 (20.0); tether bf16 is slow too
    summ = {"tether": _arm(2.0), "trl_fp32": _arm(4.0, 1200), "trl_bf16": _arm(20.0), "tether_bf16": _arm(25.0),
            "tether_compiled": _arm(1.6, 900)}
    prec = {"tether": "fp32", "trl_fp32": "fp32", "trl_bf16": "bf16", "tether_bf16": "bf16", "tether_compiled": "fp32"}
    out = vs_trl.compare_arms(summ, prec)
    assert (out["tether_best"], out["trl_best"]) == ("tether_compiled", "trl_fp32")
    assert out["s_per_step_ratio_best"] == pytest.approx(1.6 / 4.0)
    assert out["peak_rss_ratio_best"] == pytest.approx(900 / 1200)
    assert out["s_per_step_ratio"] == pytest.approx(2.0 / 4.0)  # defaults vs TRL-best
    assert out["rollout_tokens_per_s_ratio"] == pytest.approx(2.0)  # tether / TRL: higher is better
    assert out["same_precision"]["fp32"]["s_per_step_ratio"] == pytest.approx(0.5)
    assert out["same_precision"]["bf16"]["s_per_step_ratio"] == pytest.approx(25.0 / 20.0)
    assert out["same_precision"]["bf16"]["arms"] == ["tether_bf16", "trl_bf16"]


def test_trl_best_follows_the_faster_precision():
    summ = {"tether": _arm(1.0), "trl_fp32": _arm(4.0), "trl_bf16": _arm(3.0), "tether_fp32": _arm(2.5)}
    prec = {"tether": "bf16", "trl_fp32": "fp32", "trl_bf16": "bf16", "tether_fp32": "fp32"}
    out = vs_trl.compare_arms(summ, prec)
    assert out["trl_best"] == "trl_bf16" and out["trl_best_precision"] == "bf16"
    assert out["same_precision"]["fp32"]["s_per_step_ratio"] == pytest.approx(2.5 / 4.0)


def test_slow_arms_run_once():
    plan = [("tether", "tether", "fp32", []), ("trl_fp32", "trl", "fp32", []), ("trl_bf16", "trl", "bf16", []),
            ("tether_bf16", "tether", "bf16", [])]
    once = vs_trl._slow_arms({"tether": 3.0, "trl_fp32": 5.0, "trl_bf16": 30.0, "tether_bf16": 28.0}, plan, 2.0)
    assert set(once) == {"trl_bf16", "tether_bf16"}
    assert vs_trl._slow_arms({"tether": 3.0, "trl_fp32": 5.0, "trl_bf16": 6.0, "tether_bf16": 4.0}, plan, 2.0) == {}


def test_arms_resolve_auto_and_name_precisions(monkeypatch):
    monkeypatch.setattr(vs_trl, "default_precision", lambda: "fp32")
    args = vs_trl.parse_args([])
    names = {n: p for n, _, p, _ in vs_trl.arms(args)}
    assert names == {"tether": "fp32", "trl_fp32": "fp32", "trl_bf16": "bf16", "tether_bf16": "bf16", "tether_compiled": "fp32"}


@pytest.mark.parametrize("ratio,ok", [(0.50, True), (0.57, True), (0.58, False), (0.80, False)])
def test_guard_fails_beyond_tolerance(ratio, ok):
    passed, msg = quick.check_ratio(ratio, {"ratio": 0.50, "date": "2026-12-01", "cpu": "AMD EPYC"}, 0.15)
    assert passed is ok
    assert ("OK" if ok else "REGRESSION") in msg


def test_guard_without_baseline_passes_and_says_how_to_record():
    passed, msg = quick.check_ratio(0.9, None, 0.15)
    assert passed and "--update" in msg


def test_guard_uses_this_cpu_generations_baseline_and_never_another_generations():
    z4, z5 = "family 25 model 17", "family 26 model 2"
    table = {"native-bf16": {"ratio": 0.33, "cpu_generation": z5},
             f"native-bf16 {z4}": {"ratio": 0.40, "cpu_generation": z4},
             "avx2": {"ratio": 0.63}}  # recorded before generations were: used for every AVX2 CPU
    assert quick.find_baseline(table, "native-bf16", z4)[0]["ratio"] == 0.40
    assert quick.find_baseline(table, "native-bf16", z5)[0]["ratio"] == 0.33
    assert quick.find_baseline(table, "avx2", "family 25 model 1")[0]["ratio"] == 0.63
    assert quick.find_baseline(table, "native-bf16", None)[0]["ratio"] == 0.33
    base, note = quick.find_baseline(table, "native-bf16", "family 25 model 1")
    assert base is None and z5 in note
    passed, msg = quick.check_ratio(0.9, base, 0.15, note)
    assert passed and "not checked" in msg and "another CPU generation" in msg
    assert not quick.check_ratio(0.47, *quick.find_baseline(table, "native-bf16", z4)[:1], 0.15)[0]


def test_step_floor_splits_gemms_attention_and_the_rest():
    """step_floor.py's split: aten matmuls and oneDNN's linear are GEMMs; SDPA and the compiled
    decode step's fused attention kernel are attention; a fused softmax or an add is neither."""
    from types import SimpleNamespace

    floor = _load("step_floor")
    assert floor.is_attention("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert floor.is_attention("graph_0_cpp_fused__softmax__to_copy__unsafe_view_add_bmm_clone_flip_mul")
    assert not floor.is_attention("graph_1_cpp_fused__softmax__to_copy_bitwise_not_masked_fill_mul_view_6")
    assert not floor.is_attention("aten::bmm")  # a GEMM, counted there

    def ev(name, us, start, shapes=None):
        return SimpleNamespace(name=name, self_cpu_time_total=us, input_shapes=shapes,
                               time_range=SimpleNamespace(start=start, end=start + 1))

    events = [SimpleNamespace(name="update", time_range=SimpleNamespace(start=0, end=100)),
              ev("aten::mm", 2000, 1, [[4, 8], [8, 16]]), ev("aten::_scaled_dot_product_flash_attention_for_cpu", 500, 2),
              ev("aten::add", 250, 3), ev("aten::mm", 9999, 200, [[1, 1], [1, 1]])]  # the last one is outside the region
    out = floor.split_profile(SimpleNamespace(events=lambda: events), ("update",))
    assert out == {"update_gemm_s": 0.002, "update_gemm_flops": 2 * 4 * 8 * 16, "update_attention_s": 0.0005,
                   "update_other_s": 0.00025}


def test_table_cells_say_not_measured_instead_of_nan():
    # bench-quick runs with --no-account: no matmul peak, no decode floor; the table must not print "nan"
    measured = {"train_frac_of_bf16_peak": 0.81, "train_run_frac_of_bf16_peak": 0.7, "gen_over_decode_floor": 1.64,
                "gen_over_decode_floor_kv": 1.21}
    assert vs_trl.accounting_cells(measured, "bf16") == "0.81 of bf16 (0.70) | 1.6x (1.2x)"
    assert vs_trl.accounting_cells(_arm(1.0), "fp32") == "not measured | not measured"
