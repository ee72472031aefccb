"""Failures are values: errors, hangs, garbage and dying workers (docs/design.md, correctness rules 6,
12 and 18).

Most tests run the default `process` isolation: a pool of forked workers kept warm per spec.
Hangs use a short `timeout_s` so the whole file stays a few seconds.
"""

from __future__ import annotations

import os
import time

import pytest

from tether.config import RewardComponentConfig, RewardConfig
from tether.rewards import RewardFailure, make_reward_pool, build_reward_spec, run_rewards
from tether.types import Outcome

SLACK_S = 4.0  # allowed beyond timeout_s: kill + reap + fork of the replacement, on a busy CI box (load 8+ on 2 cores)
HEALTHY_S = 3.0  # timeout_s where healthy calls must finish: a loaded box can stall one for a second


def make_cfg(name: str, isolation: str = "process", **kw) -> RewardConfig:
    kwargs = kw.pop("kwargs", {})
    return RewardConfig(components=[RewardComponentConfig(name=name, kwargs=kwargs)], isolation=isolation, **kw)


def tasks_for(n: int) -> list[dict]:
    return [{"prompt": f"p{i}", "answer": "1", "i": i} for i in range(n)]


@pytest.mark.parametrize("isolation", ["process", "thread", "inline"])
def test_one_raising_sample_of_eight(isolation: str) -> None:
    """Pitfall 6: exactly one ERROR; the other 7 results are unchanged and correct."""
    results, m = run_rewards(["t"] * 8, tasks_for(8), make_cfg("reward_stubs:raise_on_third", isolation))
    assert [r.outcome for r in results] == [Outcome.OK] * 2 + [Outcome.ERROR] + [Outcome.OK] * 5
    assert [r.total for i, r in enumerate(results) if i != 2] == [i / 10 for i in range(8) if i != 2]
    bad = results[2]
    assert bad.total == 0.0 and bad.correct is None
    assert "RuntimeError: boom on sample 2" in bad.error and "raise_on_third" in bad.error
    assert m["reward/error_count"] == 1.0 and m["reward/error_rate"] == 1 / 8
    assert m["reward/total/mean"] == pytest.approx(sum(i / 10 for i in range(8) if i != 2) / 7)  # masked out


def test_hung_reward_times_out_and_worker_is_replaced() -> None:
    cfg = make_cfg("reward_stubs:sleep_if_hang", timeout_s=HEALTHY_S)
    pool = make_reward_pool(build_reward_spec(cfg))
    run_rewards(["ok"], tasks_for(1), cfg)  # warm up
    replaced = pool.replaced
    t0 = time.monotonic()
    results, m = run_rewards(["ok", "hang", "ok", "ok"], tasks_for(4), cfg)
    elapsed = time.monotonic() - t0
    assert elapsed < HEALTHY_S + SLACK_S, elapsed  # the hang sleeps 1e6 s
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.TIMEOUT, Outcome.OK, Outcome.OK]
    assert f"timeout_s={HEALTHY_S:g}" in results[1].error and "killed" in results[1].error
    assert m["reward/timeout_count"] == 1.0
    assert pool.replaced == replaced + 1
    results, _ = run_rewards(["ok"] * 4, tasks_for(4), cfg)  # the next call still works
    assert all(r.outcome is Outcome.OK and r.total == 1.0 for r in results)


def test_thread_mode_times_out_without_killing() -> None:
    cfg = make_cfg("reward_stubs:sleep_if_hang", "thread", timeout_s=HEALTHY_S, kwargs={"seconds": 30.0})
    t0 = time.monotonic()
    results, _ = run_rewards(["hang", "ok"], tasks_for(2), cfg)
    assert time.monotonic() - t0 < HEALTHY_S + SLACK_S  # not the 30 s of the hung call
    assert [r.outcome for r in results] == [Outcome.TIMEOUT, Outcome.OK]
    assert "cannot be killed" in results[0].error


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_garbage_values_are_invalid(isolation: str) -> None:
    texts = ["none", "nan", "inf", "str", "list", "dict_no_score", "dict_nan", "dict_str", "fine"]
    cfg = make_cfg("reward_stubs:bad_value", isolation, max_error_rate=1.0)
    results, m = run_rewards(texts, tasks_for(len(texts)), cfg)
    assert [r.outcome for r in results] == [Outcome.INVALID] * 8 + [Outcome.OK]
    assert "returned NoneType" in results[0].error and "'abc'" in results[3].error
    assert "no 'score' key" in results[5].error
    assert m["reward/invalid_count"] == 8.0 and results[-1].total == 1.0


def test_dying_worker_is_an_error_and_the_pool_recovers() -> None:
    cfg = make_cfg("reward_stubs:exit_if_die")
    results, m = run_rewards(["ok", "die", "ok", "ok", "ok"], tasks_for(5), cfg)
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.ERROR, Outcome.OK, Outcome.OK, Outcome.OK]
    assert "worker died" in results[1].error and "exit code 3" in results[1].error
    results, _ = run_rewards(["ok"] * 3, tasks_for(3), cfg)
    assert all(r.outcome is Outcome.OK for r in results)


def defined_in_test_module(text: str, task: dict) -> float:
    return 2.0 * task["i"]


def test_function_defined_in_a_test_module_runs_in_workers() -> None:
    """Workers are forked after the spec is resolved, so nothing about the function is pickled."""
    results, _ = run_rewards(["a"] * 3, tasks_for(3), make_cfg(f"{__name__}:defined_in_test_module"))
    assert [r.total for r in results] == [0.0, 2.0, 4.0]


def test_unpicklable_task_is_an_error_for_that_sample_only() -> None:
    tasks = tasks_for(3)
    tasks[1] = {**tasks[1], "callback": lambda: None}  # cannot travel to a worker
    results, _ = run_rewards(["a", "b", "c"], tasks, make_cfg("reward_stubs:constant"))
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.ERROR, Outcome.OK]
    assert "cannot send call to worker" in results[1].error


def test_calls_run_in_worker_main_threads() -> None:
    """signal.alarm time-outs (math-verify) need a main thread: true in workers, not in threads."""
    results, _ = run_rewards(["a", "b"], tasks_for(2), make_cfg("reward_stubs:in_main_thread"))
    assert [r.total for r in results] == [1.0, 1.0]
    pids = {r.total for r in run_rewards(["a"] * 4, tasks_for(4), make_cfg("reward_stubs:worker_pid"))[0]}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # min(2, n) workers
    results, _ = run_rewards(["a"], tasks_for(1), make_cfg("reward_stubs:in_main_thread", "thread"))
    assert results[0].total == 0.0


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_math_verify_in_isolation(isolation: str) -> None:
    """verl PR#5635: math-verify's signal.alarm must not turn every score into 0 off the main thread."""
    texts = ["\\boxed{\\frac{1}{2}}", "The answer is 0.5", "\\boxed{3}", "<answer>1/2</answer>"]
    tasks = [{"prompt": "", "answer": "0.5"}] * 4
    # Deadlines for a hang only: the first parse warms sympy up and took > 20 s on a loaded 2-core box, past both
    # math-verify's own alarm (3 s by default) and the isolation wall clock.
    results, m = run_rewards(texts, tasks, make_cfg("math_verify", isolation, timeout_s=120.0, kwargs={"timeout_s": 60}))
    assert [r.outcome for r in results] == [Outcome.OK] * 4, [r.error for r in results]
    assert [r.total for r in results] == [1.0, 1.0, 0.0, 1.0]
    assert m["reward/correct_rate"] == 0.75


def test_math_verify_exception_is_an_error_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def broken(*args, **kwargs):
        raise ValueError("signal only works in main thread of the main interpreter")

    monkeypatch.setattr(math_verify, "verify", broken)
    results, m = run_rewards(["\\boxed{1}"] * 2, [{"prompt": "", "answer": "1"}] * 2,
                             make_cfg("math_verify", "inline", max_error_rate=1.0))
    assert all(r.outcome is Outcome.ERROR for r in results)
    assert "signal only works in main thread" in results[0].error
    assert m["reward/error_count"] == 2.0


def test_math_verify_internal_timeout_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify
    from math_verify.errors import TimeoutException

    def slow(*args, **kwargs):
        raise TimeoutException("Timeout during comparison")  # what verify raises when its alarm fires

    monkeypatch.setattr(math_verify, "verify", slow)
    results, _ = run_rewards(["\\boxed{1}"], [{"prompt": "", "answer": "1"}], make_cfg("math_verify", "inline", max_error_rate=1.0))
    assert results[0].outcome is Outcome.TIMEOUT and "math-verify timed out" in results[0].error


def test_on_error_zero_keeps_sample_but_counts_error() -> None:
    results, m = run_rewards(["t"] * 4, tasks_for(4), make_cfg("reward_stubs:raise_on_third", on_error="zero"))
    assert all(r.outcome is Outcome.OK for r in results)
    assert results[2].total == 0.0 and results[2].correct is False and "boom" in results[2].error
    assert m["reward/error_count"] == 1.0
    assert m["reward/total/mean"] == pytest.approx((0.0 + 0.1 + 0.0 + 0.3) / 4)  # the zero counts


def test_systematic_failure_raises_with_component_and_first_error() -> None:
    cfg = make_cfg("reward_stubs:always_raise")
    with pytest.raises(RewardFailure) as err:
        run_rewards(["t"] * 8, tasks_for(8), cfg)
    msg = str(err.value)
    assert "'reward_stubs:always_raise'" in msg and "verifier misconfigured" in msg
    assert "reward.max_error_rate=0.5" in msg
    assert err.value.component == "reward_stubs:always_raise"
    assert len(err.value.results) == 8 and err.value.metrics["reward/error_rate"] == 1.0


def test_error_rate_at_the_limit_does_not_raise() -> None:
    cfg = make_cfg("reward_stubs:raise_on_third", max_error_rate=0.5)
    results, m = run_rewards(["t"] * 2, tasks_for(3)[1:], cfg)  # 1 of 2 failed: 50% is not > 50%
    assert m["reward/error_rate"] == 0.5


def test_systematic_hang_stops_early() -> None:
    """Once the failure is certain, the remaining calls are not waited for (pitfall 12)."""
    cfg = make_cfg("reward_stubs:sleep_if_hang", timeout_s=HEALTHY_S, max_error_rate=0.1)
    t0 = time.monotonic()
    with pytest.raises(RewardFailure, match="timeout") as err:
        run_rewards(["hang"] * 8, tasks_for(8), cfg)  # without the early stop: 4 rounds x 3 s = 12 s
    assert time.monotonic() - t0 < HEALTHY_S + SLACK_S
    assert "not run after the failure became certain" in str(err.value)
    results, _ = run_rewards(["ok"] * 2, tasks_for(2), cfg)  # the pool recovered
    assert all(r.outcome is Outcome.OK for r in results)


def test_per_call_overhead_is_small(capsys: pytest.CaptureFixture) -> None:
    cfg = make_cfg("exact_match")
    texts, tasks = ["<answer>1</answer>"] * 64, tasks_for(64)
    run_rewards(texts, tasks, cfg)  # warm-up: forks the workers
    best = min(_timed(run_rewards, texts, tasks, cfg) for _ in range(3))
    with capsys.disabled():
        print(f"\n[rewards] 64 trivial rewards, process pool, warm: {best * 1e3:.1f} ms")
    assert best < 2.0  # ~0.05 s on an idle 2-core box; x40 leaves room for a loaded one


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0
