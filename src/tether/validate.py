"""Config checks that ask the registries (DESIGN.md rules 3 and 12), run when a config loads.

Every registry name in a config is looked up here, so a typo exits with the nearest name before
any model is built; and the facts registered with an entry (`tether.algos.AdvantageFacts`)
decide which combinations cannot work, instead of lists of names.
"""

from __future__ import annotations

import difflib
from typing import Any


def find_unknown_names(cfg: Any) -> list[str]:
    """One line per registry name in `cfg` that is not registered (with the nearest valid name)."""
    from tether.algos import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES
    from tether.tasks import find_task_problem

    a = cfg.algo
    out = [p for p in (ADVANTAGES.check(a.advantage.name, "algo.advantage.name"),
                       POLICY_LOSSES.check(a.policy_loss.name, "algo.policy_loss.name"),
                       KL_ESTIMATORS.check(a.kl.estimator, "algo.kl.estimator"),
                       find_task_problem(cfg.data.task)) if p]
    for i, c in enumerate(cfg.reward.components):
        if (problem := _reward_problem(c.name)) is not None:
            out.append(f"reward.components[{i}].name: {problem}")
    from tether.eval.runner import SELECTORS

    if cfg.eval.best_of not in SELECTORS and _reward_problem(cfg.eval.best_of) is not None:
        from tether.rewards.base import REWARD_FUNCTIONS

        valid = [*SELECTORS, *REWARD_FUNCTIONS]
        close = difflib.get_close_matches(cfg.eval.best_of, valid, n=1, cutoff=0.4)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        out.append(f"eval.best_of: unknown selector {cfg.eval.best_of!r}.{hint} Valid: {', '.join(valid)}, "
                   "or package.module:function")
    return out


def _reward_problem(name: str) -> str | None:
    from tether.rewards.base import load_reward_fn

    try:
        load_reward_fn(name)  # a registered name, or package.module:function imported now
    except (KeyError, ValueError) as err:
        return str(err)
    return None


def find_fact_problems(cfg: Any) -> list[str]:
    """Combinations the registered facts rule out (call after `find_unknown_names` found none)."""
    from tether.algos import ADVANTAGES

    a, out = cfg.algo, []
    facts = ADVANTAGES.facts(a.advantage.name)
    readers = [n for n in ADVANTAGES if ADVANTAGES.facts(n).reads_token_rewards]
    if facts.group_relative and cfg.rollout.n < 2:
        out.append(f"algo.advantage.name={a.advantage.name} compares rollouts of one problem: set rollout.n >= 2 "
                   f"(or use an estimator that does not: "
                   f"{', '.join(n for n in ADVANTAGES if not ADVANTAGES.facts(n).group_relative)})")
    if cfg.env.credit == "step" and not facts.reads_token_rewards:
        out.append(f"env.credit=step keeps step rewards on their turns, but algo.advantage.name={a.advantage.name} "
                   f"only reads the trajectory score: use {' / '.join(readers)}, or env.credit=broadcast")
    if a.kl.placement == "reward" and a.kl.coef > 0 and not facts.reads_token_rewards:
        out.append(f"algo.kl.placement=reward puts the KL penalty on token rewards, but algo.advantage.name="
                   f"{a.advantage.name} reads only sequence scores, so the penalty would be dropped: use "
                   f"algo.kl.placement=loss, or an estimator that reads token rewards ({', '.join(readers)})")
    return out
