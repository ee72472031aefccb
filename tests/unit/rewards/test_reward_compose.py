"""RewardSpec building, user-function loading, weighted composition and metrics."""

from __future__ import annotations

import pytest

from tether.config import ConfigError, RewardComponentConfig, RewardConfig
from tether.registry import UnknownNameError
from tether.rewards import (
    CallResult,
    build_reward_spec,
    compute_checked_value,
    compute_reward_result,
    load_reward_fn,
    run_rewards,
)
from tether.types import Outcome


def make_cfg(*components: tuple, **kw) -> RewardConfig:
    return RewardConfig(
        components=[RewardComponentConfig(name=n, weight=w, kwargs=k) for n, w, k in components], **kw
    )


def local_reward(text: str, task: dict) -> float:
    """Defined in this test module: loadable by its import name like any user function."""
    return 2.0


def test_builtin_name_typo_suggests_nearest() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'exact_match'"):
        load_reward_fn("exact_mach")


def test_user_function_import_path() -> None:
    fn = load_reward_fn("reward_stubs:constant")
    assert fn("x", {}, value=3.0) == 3.0
    assert load_reward_fn(f"{__name__}:local_reward") is local_reward


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("no_such_pkg_xyz.mod:fn", "cannot import module 'no_such_pkg_xyz.mod'"),
        ("reward_stubs:no_such_fn", "has no attribute 'no_such_fn'"),
        ("reward_stubs:BAD_VALUES", "not a function"),
        (":fn", "package.module:function"),
    ],
)
def test_bad_import_path_gives_clear_error(name: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        load_reward_fn(name)
    assert fragment in str(err.value) and name in str(err.value)


def test_spec_rejects_bad_kwargs_duplicates_and_unknown_correctness() -> None:
    with pytest.raises(ConfigError, match="bad kwargs.*ignore_cas"):
        build_reward_spec(make_cfg(("exact_match", 1.0, {"ignore_cas": True})))
    with pytest.raises(ConfigError, match="listed twice"):
        build_reward_spec(make_cfg(("format", 1.0, {}), ("format", 0.5, {})))
    with pytest.raises(ConfigError, match="not one of reward.components"):
        build_reward_spec(make_cfg(("format", 1.0, {}), correctness="exact_match"))


def test_checked_values() -> None:
    assert compute_checked_value(True) == CallResult(Outcome.OK, 1.0)
    assert compute_checked_value(3) == CallResult(Outcome.OK, 3.0)
    assert compute_checked_value({"score": 1, "aux": 2}) == CallResult(Outcome.OK, 1.0, (("aux", 2.0),))
    for bad in (None, float("nan"), float("-inf"), "abc", "1.0", [1.0], {"acc": 1.0}, {"score": None}):
        assert compute_checked_value(bad).outcome is Outcome.INVALID, bad


def test_weighted_sum_components_and_correctness() -> None:
    # correct answer, malformed format: exact_match=1, format=0, length=-0.5 (4 of 8 chars)
    cfg = make_cfg(("exact_match", 1.0, {}), ("format", 0.5, {}), ("length", 0.2, {"max_len": 8}))
    (r,), m = run_rewards(["4   "], [{"prompt": "2+2=", "answer": "4"}], cfg.model_copy(update={"isolation": "inline"}))
    assert r.outcome is Outcome.OK and r.correct is True
    assert dict(r.components) == {"exact_match": 1.0, "format": 0.0, "length": -0.5}
    assert r.total == pytest.approx(1.0 * 1.0 + 0.5 * 0.0 + 0.2 * -0.5)  # = 0.9
    # correctness follows the named component, not the total
    cfg2 = make_cfg(("format", 1.0, {}), ("exact_match", 1.0, {}), correctness="exact_match", isolation="inline")
    (r2,), _ = run_rewards(["<answer>5</answer>"], [{"prompt": "", "answer": "4"}], cfg2)
    assert r2.total == 1.0 and r2.correct is False


def test_failure_is_masked_or_zeroed() -> None:
    cfg = make_cfg(("exact_match", 1.0, {}), ("format", 1.0, {}))
    spec = build_reward_spec(cfg)
    calls = [CallResult(Outcome.OK, 1.0), CallResult(Outcome.ERROR, error="RuntimeError: x")]
    masked = compute_reward_result(spec, calls, "mask")
    assert masked.outcome is Outcome.ERROR and masked.total == 0.0 and masked.correct is True
    assert masked.error == "format: error: RuntimeError: x"
    assert dict(masked.components) == {"exact_match": 1.0}  # failed component left out
    zeroed = compute_reward_result(spec, calls, "zero")
    assert zeroed.outcome is Outcome.OK and zeroed.total == 0.0 and "RuntimeError: x" in zeroed.error
    first_failed = compute_reward_result(spec, calls[::-1], "mask")
    assert first_failed.correct is None  # the correctness component itself failed


def test_metrics_per_component_and_dict_extras() -> None:
    cfg = make_cfg(("exact_match", 1.0, {}), ("reward_stubs:with_diagnostics", 1.0, {}), isolation="inline")
    texts = ["4", "5", "4", "abcd"]
    results, m = run_rewards(texts, [{"prompt": "", "answer": "4"}] * 4, cfg)
    assert dict(results[3].components) == {
        "exact_match": 0.0, "reward_stubs:with_diagnostics": 0.5, "reward_stubs:with_diagnostics/chars": 4.0
    }
    assert m["reward/exact_match/mean"] == 0.5 and m["reward/exact_match/std"] == 0.5
    assert m["reward/reward_stubs:with_diagnostics/mean"] == 0.5
    assert m["reward/reward_stubs:with_diagnostics/chars/mean"] == pytest.approx((1 + 1 + 1 + 4) / 4)
    assert m["reward/total/mean"] == pytest.approx(1.0)  # totals 1.5, 0.5, 1.5, 0.5
    assert m["reward/total/std"] == pytest.approx(0.5)
    assert m["reward/correct_rate"] == 0.5
    for key in ("error_count", "timeout_count", "invalid_count", "error_rate"):
        assert m[f"reward/{key}"] == 0.0
    assert m["reward/seconds"] >= 0.0


def test_mismatched_lengths_fail_loudly() -> None:
    with pytest.raises(ValueError, match="2 texts but 1 tasks"):
        run_rewards(["a", "b"], [{"prompt": "", "answer": "a"}], make_cfg(("exact_match", 1.0, {})))


def test_empty_batch() -> None:
    results, m = run_rewards([], [], make_cfg(("exact_match", 1.0, {})))
    assert results == [] and m["reward/error_rate"] == 0.0
