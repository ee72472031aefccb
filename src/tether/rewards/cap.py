"""Step caps on reward components: pay a learned reward for at most N RL steps.

    reward:
      components:
        - {name: exact_match, weight: 0.0}
        - {name: reward_model, kwargs: {path: runs/rm/final_model}, max_steps: 400}   # stop the run at step 400
        - {name: judge, weight: 0.5, kwargs: {...}, max_steps: 200, at_max_steps: drop}  # weight 0 from step 201 on

A reward model or a judge is a learned approximation of what the user wants, and RL finds its
errors: the longer the policy optimises against it, the more of the reward is exploitation.
DeepSeek-R1 (arXiv 2501.12948) therefore runs its reward-model-based RL for a few hundred steps
only (about 400 in its general-purpose stage). `max_steps` makes that cap part of the config
instead of something to remember: after the component has been paid for `max_steps` RL steps,
`at_max_steps: stop` (the default) ends the run there (with an evaluation and a checkpoint at
that step), and `at_max_steps: drop` sets its weight to 0 so training continues on the other
components (e.g. a verifiable reward). Either way the RL loop prints one line, logs
`reward/capped/<name>` = 1 at that step and lists the event under `reward_caps` in summary.json.
"""

from __future__ import annotations

from typing import Any

from tether.settings import RunSettings


def apply_reward_caps(settings: RunSettings, step: int, verbose: bool = True) -> list[dict[str, Any]]:
    """The caps that fire once `step` RL steps are done (a `stop`, or a `drop` of a still-paid component).

    `drop` is a run-settings change of `reward.components` (the component's weight becomes 0 from
    the next step on; the rollout side builds its reward spec from the config in force, as for the
    health layer's down-weighting). Called with the step a resumed run starts from, it finds the
    drops in force already (the checkpoint carries the run settings) and reports nothing again.
    """
    comps = list(settings.config.reward.components)
    events = []
    for i, c in enumerate(comps):
        cap = getattr(c, "max_steps", None)
        if cap is None or step < cap:
            continue
        action = getattr(c, "at_max_steps", "stop")
        if action == "drop":
            if c.weight == 0:
                continue  # dropped already (or never paid)
            comps[i] = c.model_copy(update={"weight": 0.0})
        events.append({"kind": "reward_cap", "component": c.name, "max_steps": cap, "step": step, "action": action,
                       "weight": c.weight})
    if any(e["action"] == "drop" for e in events):
        settings.set("reward.components", comps, source="reward cap", step=step)
    for e in events if verbose else ():
        then = "stopping the run" if e["action"] == "stop" else "its weight is 0 from the next step on"
        print(f"[tether] reward cap: component {e['component']!r} has been paid for {e['step']} steps "
              f"(max_steps={e['max_steps']}): {then}", flush=True)
    return events


def reward_cap_metrics(events: list[dict[str, Any]]) -> dict[str, float]:
    """`reward/capped/<component>` = 1 for each cap that fired at this step."""
    return {f"reward/capped/{e['component']}": 1.0 for e in events}


def stops_run(events: list[dict[str, Any]]) -> bool:
    """Whether one of these cap events ends the run (`at_max_steps: stop`)."""
    return any(e["action"] == "stop" for e in events)
