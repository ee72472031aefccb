"""Checks across config sections, run when a config loads: combinations that would silently do
nothing or cannot work, and the checks that ask the registries (docs/design.md, house rules 3 and
12).

Every registry name in a config is looked up here, so a typo exits with the nearest name before
any model is built; and the facts registered with an entry (`tether.algos.AdvantageFacts`)
decide which combinations cannot work, instead of lists of names.
"""

from __future__ import annotations

import difflib
from typing import Any

from tether.dist.config import find_dist_problems
from tether.tasks.sources import find_source_problem


def find_noop_combinations(cfg: Any) -> list[str]:
    """Flag settings that would silently do nothing or cannot work (docs/design.md, correctness rule 21)."""
    out: list[str] = []
    kl, algo = cfg.algo.kl, cfg.algo
    if kl.coef > 0 and kl.reference == "none":
        out.append("algo.kl.coef > 0 needs a reference policy: set algo.kl.reference=initial or algo.kl.coef=0")
    if kl.coef == 0 and kl.reset_every is not None:
        out.append("algo.kl.reset_every does nothing with algo.kl.coef=0: set a coefficient or drop reset_every")
    if cfg.model.lora is not None and kl.reset_every is not None:
        out.append("algo.kl.reset_every cannot work with model.lora (the LoRA reference is the base with adapters off, "
                   "and a reset would merge the adapter): drop algo.kl.reset_every or model.lora")
    if kl.coef == 0 and kl.adaptive_target is not None:
        out.append("algo.kl.adaptive_target needs an initial algo.kl.coef > 0")
    unknown = find_unknown_names(cfg)
    out.extend(unknown or find_fact_problems(cfg))
    if algo.dynamic_sampling.enable and cfg.rollout.n < 2:
        out.append("algo.dynamic_sampling needs rollout.n >= 2 to see reward variance")
    if algo.correction.mode == "mask" and algo.correction.threshold_low is None:
        out.append("algo.correction.mode=mask needs algo.correction.threshold_low (e.g. 0.5)")
    if algo.correction.mode != "mask" and algo.correction.threshold_low is not None:
        out.append("algo.correction.threshold_low only applies to mode=mask")
    if cfg.reward.correctness is not None:
        names = [c.name for c in cfg.reward.components]
        if cfg.reward.correctness not in names:
            out.append(f"reward.correctness={cfg.reward.correctness!r} is not one of reward.components {names}")
    if (source := find_source_problem(cfg.data)) is not None:
        out.append(source)
    if cfg.harness.token is None and cfg.harness.host not in ("127.0.0.1", "localhost", "::1"):
        out.append(f"harness.host={cfg.harness.host!r} is not loopback: set harness.token (requests must carry it)")
    out.extend(find_dist_problems(cfg))
    return out


def find_unknown_names(cfg: Any) -> list[str]:
    """One line per registry name in `cfg` that is not registered (with the nearest valid name)."""
    from tether.algos import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES
    from tether.tasks import TASKS, find_task_problem

    if cfg.data.task not in TASKS:
        import tether.envs  # noqa: F401  (registers the environments as tasks; slow, so only when needed)

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
