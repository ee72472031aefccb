"""Composition: a weighted sum of named reward components, each kept and logged separately.

    spec = build_reward_spec(cfg.reward)       # resolves names, checks kwargs, once per run
    result = compute_reward_result(spec, calls, on_error="mask")

`RewardResult.components` holds every component's *raw* (unweighted) value, so each one is
logged on its own (docs/design.md, correctness rules 16 and 20: a format reward that is being hacked shows up as its
own curve, not hidden in the total). `correct` is the verified correctness — the correctness
component (`reward.correctness`, default the first) is > 0 — tracked apart from the total, so
shaping terms never inflate the reported accuracy.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping, Sequence

from tether.config_text import ConfigError
from tether.errors import UserError
from tether.rewards.config import RewardConfig
from tether.rewards.base import CallResult, RewardFn, load_reward_fn
from tether.types import Outcome, RewardResult


@dataclass(frozen=True)
class RewardComponent:
    """One named term of the reward: `weight * fn(text, task, **kwargs)`."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardSpec:
    """The resolved reward: components in config order and the correctness component's name."""

    components: tuple[RewardComponent, ...]
    correctness: str

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def cache_key(self) -> tuple:
        """Identity of what workers must run (functions and kwargs; weights apply in the parent)."""
        return tuple((c.name, id(c.fn), repr(sorted(c.kwargs.items()))) for c in self.components)


def _check_kwargs(name: str, fn: RewardFn, kwargs: Mapping[str, Any]) -> None:
    """Reject kwargs the function does not take now, not as an ERROR on every sample later."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins/C functions without a signature: nothing to check
    try:
        sig.bind("", {}, **kwargs)
    except TypeError as err:
        raise ConfigError(
            f"reward component {name!r}: bad kwargs {sorted(kwargs)} ({err}); signature is {name}{sig}"
        ) from None


def build_reward_spec(cfg: RewardConfig) -> RewardSpec:
    """Resolve `cfg.components` into functions, check their kwargs, run their `prepare` hooks."""
    if not cfg.components:
        raise ConfigError("reward.components is empty: name at least one reward function")
    names = [c.name for c in cfg.components]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"reward.components: {dupes} listed twice; components are keyed by name")
    components = []
    for i, c in enumerate(cfg.components):
        fn = load_reward_fn(c.name)
        _check_kwargs(c.name, fn, c.kwargs)
        check = getattr(fn, "check_kwargs", None)
        if callable(check):  # the component's own checks of its settings (a model directory, a URL, ...)
            try:
                check(dict(c.kwargs))
            except (ValueError, UserError) as err:
                raise ConfigError(f"reward.components[{i}] ({c.name}): {err}") from None
        prepare = getattr(fn, "prepare", None)
        if callable(prepare):
            prepare()  # heavy imports paid once, before workers fork
        components.append(RewardComponent(c.name, fn, float(c.weight), MappingProxyType(dict(c.kwargs))))
    correctness = cfg.correctness or names[0]
    if correctness not in names:
        raise ConfigError(f"reward.correctness={correctness!r} is not one of reward.components {names}")
    return RewardSpec(tuple(components), correctness)


def compute_reward_result(
    spec: RewardSpec, calls: Sequence[CallResult], on_error: Literal["mask", "zero"] = "mask"
) -> RewardResult:
    """Combine one sample's component calls (in spec order) into a tagged RewardResult.

    All OK: total = sum(weight * value). Any component failed: total = 0.0 and
    - `mask`: outcome = the first failure's outcome; the caller must exclude the sample.
    - `zero`: outcome = OK (the sample counts, with reward 0); `error` still says what failed.
    Failed components are absent from `components` (their metrics average real values only);
    `correct` is None when the correctness component itself failed (False under `zero`).
    """
    if len(calls) != len(spec.components):
        raise ValueError(f"{len(calls)} component results for {len(spec.components)} components")
    values: dict[str, float] = {}
    total = 0.0
    failed: list[tuple[str, CallResult]] = []
    for comp, call in zip(spec.components, calls):
        if call.outcome is not Outcome.OK:
            failed.append((comp.name, call))
            continue
        values[comp.name] = call.value
        values.update((f"{comp.name}/{key}", v) for key, v in call.extras)
        total += comp.weight * call.value
    correct = values[spec.correctness] > 0 if spec.correctness in values else None
    if not failed:
        return RewardResult(total=total, components=values, outcome=Outcome.OK, correct=correct)
    name, first = failed[0]
    error = f"{name}: {first.outcome.value}: {first.error}"
    if on_error == "zero":
        return RewardResult(0.0, values, Outcome.OK, bool(correct), f"scored 0 (reward.on_error=zero) {error}")
    return RewardResult(0.0, values, first.outcome, correct, error)


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and population std; (0, 0) for no values (metrics must stay finite JSON numbers)."""
    if not xs:
        return 0.0, 0.0
    mean = math.fsum(xs) / len(xs)
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / len(xs))


def compute_reward_metrics(
    spec: RewardSpec,
    calls_by_sample: Sequence[Sequence[CallResult]],
    results: Sequence[RewardResult],
    seconds: float,
) -> dict[str, float]:
    """Counts, rates and per-component statistics of one scoring call.

    A sample's outcome is its first failed component's (failure counts are taken from the calls,
    so they are reported under `on_error=zero` too). `reward/<c>/mean|std` average the raw values
    of component c where it succeeded; `reward/total/*` average the samples the caller keeps.
    """
    n = len(results)
    first_fail = [next((c.outcome for c in calls if c.outcome is not Outcome.OK), Outcome.OK) for calls in calls_by_sample]
    n_err, n_to, n_inv = (sum(o is k for o in first_fail) for k in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.INVALID))
    metrics = {
        "reward/error_count": float(n_err),
        "reward/timeout_count": float(n_to),
        "reward/invalid_count": float(n_inv),
        "reward/error_rate": (n_err + n_to + n_inv) / n if n else 0.0,
    }
    keys = dict.fromkeys(spec.names)
    for r in results:
        keys.update(dict.fromkeys(r.components))  # dict-result extras, in first-seen order
    for key in keys:
        mean, std = _mean_std([r.components[key] for r in results if key in r.components])
        metrics[f"reward/{key}/mean"], metrics[f"reward/{key}/std"] = mean, std
    for i, name in enumerate(spec.names):
        metrics[f"reward/{name}/fail_count"] = float(sum(calls[i].outcome is not Outcome.OK for calls in calls_by_sample))
    mean, std = _mean_std([r.total for r in results if r.outcome is Outcome.OK])
    metrics["reward/total/mean"], metrics["reward/total/std"] = mean, std
    verdicts = [r.correct for r in results if r.correct is not None]
    metrics["reward/correct_rate"] = sum(verdicts) / len(verdicts) if verdicts else 0.0
    metrics["reward/seconds"] = seconds
    return metrics
