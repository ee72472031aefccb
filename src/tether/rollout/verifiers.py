"""The rollout half of `verifiers` environments (the environment itself: `tether.envs.verifiers_env`).

A verifiers `Environment` (anything with `run_rollout`) runs its OWN rollout loop (its stop
conditions, `env_response`, tools, parser) against tether's OpenAI-compatible endpoint
(`tether.serve.endpoint`) through verifiers' `OpenAIChatCompletionsClient`, one episode id per
rollout; its rubric scores the episode. tether trains on the tokens its endpoint sampled: this is
the agent harness (`tether.rollout.harness`) with the environment as an in-process agent.
A classic duck-typed environment is played by the episode runner instead (`tether.rollout.runner`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

from tether.envs.verifiers_env import load_verifiers_env
from tether.rollout.harness import EpisodeResult, HarnessRollout
from tether.types import Outcome


def runs_own_rollouts(env: Any) -> bool:
    """A verifiers `Environment` (its own rollout loop) rather than a classic duck-typed one."""
    return callable(getattr(env, "run_rollout", None)) and callable(getattr(env, "rollout", None))


def play_verifiers_episode(task: Mapping[str, Any], base_url: str, api_key: str, episode_id: str,
                           timeout_s: float) -> EpisodeResult:
    """One episode: the environment's own `run_rollout` against the endpoint at `base_url`
    (the episode's URL), scored by its rubric; an `EpisodeResult` (tether.rollout.harness), never raises."""
    import verifiers as vf
    from openai import AsyncOpenAI

    env = load_verifiers_env(task["vf_env"], task.get("vf_args"))
    row = dict(getattr(env, task.get("split", "dataset"))[int(task["row"])])

    async def play() -> Any:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0))
        return await asyncio.wait_for(env.run_rollout(row, client, "tether", {}), timeout_s)

    t0 = time.perf_counter()
    try:
        out = asyncio.run(play())
    except (asyncio.TimeoutError, TimeoutError):
        return EpisodeResult(error=f"verifiers rollout ran past harness.timeout_s={timeout_s:g}",
                             outcome=Outcome.TIMEOUT, seconds=time.perf_counter() - t0)
    except Exception as err:  # the environment's own failure: an error outcome, counted and masked
        return EpisodeResult(error=f"verifiers rollout: {type(err).__name__}: {str(err)[:300]}", outcome=Outcome.ERROR,
                             seconds=time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    if out.get("error"):
        return EpisodeResult(error=f"verifiers rollout: {str(out['error'])[:300]}", outcome=Outcome.ERROR, seconds=dt)
    return EpisodeResult(reward=float(out.get("reward") or 0.0), seconds=dt)


def make_verifiers_rollout(cfg: Any) -> HarnessRollout | None:
    """For `data.task=verifiers` with a verifiers `Environment`: the agent harness with the
    environment's own rollout loop as the agent (module docstring); None for a classic one."""
    kw = cfg.data.task_kwargs or {}
    if not runs_own_rollouts(load_verifiers_env(kw.get("env"), kw.get("args"))):
        return None
    h = cfg.harness
    from tether.rollout.prompt_format import read_trained_prompt_format

    return HarnessRollout((), cfg.reward, h.timeout_s, h.concurrency, h.host, h.token, cfg.run.seed,
                          kind="verifiers environment (its own rollout loop)", max_error_rate=cfg.env.max_error_rate,
                          agent=play_verifiers_episode,  # its chat requests are checked against the model's record
                          prompt_format=read_trained_prompt_format(cfg.model.path))
