"""Rewards: verifiers, format/length shaping, composition, and isolated execution.

    from tether.rewards import run_rewards
    results, metrics = run_rewards(texts, tasks, cfg.reward)

- `base.py`       the protocol `fn(text, task, **kwargs) -> float | dict | None`, the registry
                  `REWARD_FUNCTIONS`, `package.module:function` loading, the checked call
- `verifiers.py`  `exact_match`, `numeric`, `math_verify`, and `extract_answer`
- `format.py`     `format` (one well-formed answer block), `length` (length penalty)
- `compose.py`    `RewardSpec`: weighted components, each kept; correctness tracked apart
- `isolation.py`  `run_rewards`: process / thread / inline execution, outcomes, metrics
- `pool.py`       the persistent forked worker pool behind `process` isolation
- `rm.py`         Bradley-Terry reward models and the batched `reward_model` component
- `judge.py`      the batched `judge` component: a local/remote LLM or the policy grades against a rubric
"""

from __future__ import annotations

from tether.rewards import format as _format  # noqa: F401  (registers format, length)
from tether.rewards import verifiers as _verifiers  # noqa: F401  (registers the verifiers)
from tether.rewards import judge as _judge  # noqa: F401  (registers judge: an LLM grades against a rubric)
from tether.rewards import rm as _rm  # noqa: F401  (registers reward_model: a Bradley-Terry reward model)
from tether.rewards.base import (
    REWARD_FUNCTIONS,
    CallResult,
    RewardFailure,
    RewardFn,
    RewardTimeout,
    compute_checked_value,
    load_reward_fn,
    run_reward_call,
)
from tether.rewards.compose import (
    RewardComponent,
    RewardSpec,
    build_reward_spec,
    compute_reward_metrics,
    compute_reward_result,
)
from tether.rewards.format import check_format
from tether.rewards.isolation import run_rewards
from tether.rewards.pool import RewardPool, close_reward_pools, make_reward_pool
from tether.rewards.verifiers import extract_answer, parse_final_number

__all__ = [
    "REWARD_FUNCTIONS",
    "CallResult",
    "RewardComponent",
    "RewardFailure",
    "RewardFn",
    "RewardPool",
    "RewardSpec",
    "RewardTimeout",
    "build_reward_spec",
    "check_format",
    "close_reward_pools",
    "compute_checked_value",
    "compute_reward_metrics",
    "compute_reward_result",
    "extract_answer",
    "load_reward_fn",
    "make_reward_pool",
    "parse_final_number",
    "run_reward_call",
    "run_rewards",
]
