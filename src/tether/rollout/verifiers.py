"""The rollout half of `verifiers` environments (the environment itself: `tether.envs.verifiers_env`).

A verifiers `Environment` (anything with `run_rollout`) runs its OWN rollout loop (its stop
conditions, `env_response`, tools, parser) against tether's OpenAI-compatible endpoint
(`tether.serve.endpoint`) through verifiers' `OpenAIChatCompletionsClient`, one episode id per
rollout; its rubric scores the episode. tether trains on the tokens its endpoint sampled: this is
the agent harness (`tether.rollout.harness`) with the environment as an in-process agent. A
verifiers 0.4 taskset is the same harness with an out-of-process agent: `vf1_driver.py` in the
virtualenv that has verifiers 0.4, one process per episode (`play_verifiers_v1_episode`).
A classic duck-typed environment is played by the episode runner instead (`tether.rollout.runner`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any, Mapping

from tether.envs.verifiers_env import V1_DRIVER, driver_env, load_verifiers_env
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


def play_verifiers_v1_episode(task: Mapping[str, Any], base_url: str, api_key: str, episode_id: str,
                              timeout_s: float) -> EpisodeResult:
    """One verifiers 0.4 episode, played by vf1_driver.py in the virtualenv that has verifiers:
    its own harness and interception proxy call tether's endpoint at `base_url` (the episode's URL),
    its task's rewards score it; an `EpisodeResult`, never raises."""
    cmd = [task["vf_python"], str(V1_DRIVER), "run", task["vf_env"], json.dumps(task.get("vf_args") or {}),
           str(task["row"]), base_url, episode_id, str(timeout_s)]
    env = {**driver_env({"pythonpath": task.get("vf_pythonpath")}), "OPENAI_API_KEY": api_key}
    t0 = time.perf_counter()
    try:  # the driver's own start (verifiers, its proxy, its agent program) comes on top of the episode's budget
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s + 120)
    except subprocess.TimeoutExpired:
        return EpisodeResult(error=f"verifiers 0.4 episode ran past harness.timeout_s={timeout_s:g} (+120 s start)",
                             outcome=Outcome.TIMEOUT, seconds=time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return EpisodeResult(error=f"verifiers 0.4 driver exited {proc.returncode}: {last[:300]}", outcome=Outcome.ERROR,
                             seconds=dt)
    if out.get("error") or out.get("reward") is None:
        return EpisodeResult(error=f"verifiers 0.4 episode: {str(out.get('error'))[:300]}", outcome=Outcome.ERROR, seconds=dt)
    return EpisodeResult(reward=float(out["reward"]), seconds=dt)


def make_verifiers_rollout(cfg: Any) -> HarnessRollout | None:
    """For `data.task=verifiers` with a verifiers `Environment` (0.2-0.3) or a verifiers 0.4 taskset
    (`data.task_kwargs.python`): the agent harness with the environment's own rollout loop as the
    agent (module docstring); None for a classic one."""
    kw = cfg.data.task_kwargs or {}
    h = cfg.harness
    if kw.get("python"):
        agent, kind = play_verifiers_v1_episode, "verifiers 0.4 taskset (its own harness, in its own virtualenv)"
    elif runs_own_rollouts(load_verifiers_env(kw.get("env"), kw.get("args"))):
        agent, kind = play_verifiers_episode, "verifiers environment (its own rollout loop)"
    else:
        return None
    from tether.rollout.prompt_format import read_trained_prompt_format

    return HarnessRollout((), cfg.reward, h.timeout_s, h.concurrency, h.host, h.token, cfg.run.seed,
                          kind=kind, max_error_rate=cfg.env.max_error_rate, agent=agent,
                          prompt_format=read_trained_prompt_format(cfg.model.path))  # its chat requests are checked
