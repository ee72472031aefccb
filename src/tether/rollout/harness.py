"""A black-box agent harness: a user's agent program (any language) plays each problem against
tether's OpenAI-compatible endpoint (`tether.serve.endpoint`), and its final answer is scored.

    harness.command=["python", "my_agent.py"]       # with any data.task (built-in, jsonl, hf)

Per episode the program is started with these environment variables:

    OPENAI_BASE_URL   http://127.0.0.1:<port>/episodes/<episode id>/v1  (every call joins the episode)
    OPENAI_API_KEY    the run's token ("tether-local" on loopback without one)
    TETHER_TASK       the problem as JSON (prompt, answer hidden: key removed)
    TETHER_EPISODE_ID the episode id

It talks to the endpoint with any OpenAI client, as many calls as it likes, and prints its result
as the LAST line of stdout: `{"reward": 0.7}` (its own score), `{"answer": "42"}`, or a plain line
that is the answer. An answer is scored by the run's reward (`reward.components`) against the
problem. The trajectory is the episode's completions as tether sampled them (token ids and
log-probs; `tether.serve.endpoint`), so the agent never needs to return tokens. A program that exits
non-zero, prints nothing, makes no call or runs past `harness.timeout_s` is an error outcome:
counted and masked out of the update (docs/design.md, correctness rule 6).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from tether.policy.config import SamplingConfig
from tether.rewards.config import RewardConfig
from tether.rewards import run_rewards
from tether.types import Outcome, RewardResult, Sample, StopReason, Trajectory, TrajectoryGroup

MAX_OUTPUT_CHARS = 4000


@dataclass(frozen=True)
class EpisodeResult:
    """What one agent run produced: its reward or answer, or why it failed."""

    reward: float | None = None
    answer: str | None = None
    error: str = ""
    outcome: Outcome = Outcome.OK
    seconds: float = 0.0


def parse_agent_output(stdout: str) -> tuple[float | None, str | None]:
    """(reward, answer) from the program's last non-empty stdout line (see module docstring)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise ValueError("the agent printed nothing (its last stdout line must be its answer or {\"reward\": x})")
    last = lines[-1].strip()
    if last.startswith("{"):
        try:
            obj = json.loads(last)
        except json.JSONDecodeError:
            return None, last
        if isinstance(obj, dict) and "reward" in obj:
            return float(obj["reward"]), None
        if isinstance(obj, dict) and "answer" in obj:
            return None, str(obj["answer"])
    return None, last


def run_agent(command: Sequence[str], task: Mapping[str, Any], base_url: str, api_key: str, episode_id: str,
              timeout_s: float, cwd: str | None = None) -> EpisodeResult:
    """Run the agent program once (see module docstring); never raises."""
    env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, TETHER_EPISODE_ID=episode_id,
               TETHER_TASK=json.dumps({k: v for k, v in task.items() if k != "answer"}, default=str))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return EpisodeResult(error=f"agent ran past harness.timeout_s={timeout_s:g}", outcome=Outcome.TIMEOUT,
                             seconds=time.perf_counter() - t0)
    except OSError as err:
        return EpisodeResult(error=f"cannot start {command[0]!r}: {err}", outcome=Outcome.ERROR)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-MAX_OUTPUT_CHARS:].strip().splitlines()[-1:] or [""]
        return EpisodeResult(error=f"agent exited with {proc.returncode}: {tail[0][:300]}", outcome=Outcome.ERROR,
                             seconds=dt)
    try:
        reward, answer = parse_agent_output(proc.stdout[-MAX_OUTPUT_CHARS:])
    except ValueError as err:
        return EpisodeResult(error=str(err), outcome=Outcome.INVALID, seconds=dt)
    return EpisodeResult(reward=reward, answer=answer, seconds=dt)


@dataclass
class HarnessRollout:
    """Problems played by a black-box agent program against the rollout endpoint (module
    docstring); the `tether.rollout.Rollout` shape: `run(policy, problems, n, sampling, ...)`."""

    command: Sequence[str]
    reward: RewardConfig
    timeout_s: float = 300.0
    concurrency: int = 8
    host: str = "127.0.0.1"
    token: str | None = None
    seed: int = 0
    kind: str = "agent harness"
    max_error_rate: float = 1.0  # env.max_error_rate: more failed agent runs in one call stop the run
    multi_turn: bool = False  # the task's problems are single-turn prompts; the agent owns its context
    # an in-process agent instead of `command`: agent(task, base_url, api_key, episode_id, timeout_s) -> EpisodeResult
    # (tether.envs.verifiers_env runs a verifiers environment's own rollout loop this way)
    agent: Callable[..., EpisodeResult] | None = None

    def fit_problems(self, problems: Sequence[Mapping[str, Any]], policy: Any, cfg: Any, what: str) -> list:
        """As a single-turn task: the prompt must fit the context (data.on_overlong)."""
        from tether.rollout.single import SingleTurnRollout

        return SingleTurnRollout(self.reward).fit_problems(problems, policy, cfg, what)

    def build_demo_records(self, policy: Any, problems: Sequence[Mapping[str, Any]], cfg: Any) -> list:
        """SFT demonstrations: the task's single-turn ones (the agent program is not scripted)."""
        from tether.rollout.single import build_single_turn_demo_records

        return build_single_turn_demo_records(policy, problems, cfg.data.task, cfg.data.chat, cfg.sft.demo_noise,
                                              cfg.run.seed)

    def run(self, policy: Any, problems: Sequence[Mapping[str, Any]], n: int, sampling: SamplingConfig,
            generator: torch.Generator | None = None, greedy: bool = False,
            generate: Callable[..., list[Sample]] | None = None) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        from tether.serve.endpoint import RolloutServer

        t0 = time.perf_counter()
        seed = self.seed if generator is None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        if greedy:
            sampling = sampling.model_copy(update={"temperature": 1e-4})  # the agent's own temperature rules
        jobs = [(p, f"{p.get('id', g)}-{j}-{uuid.uuid4().hex[:8]}") for g, p in enumerate(problems) for j in range(n)]
        with RolloutServer(policy, sampling, self.host, token=self.token, seed=seed) as server:
            play = self.agent or (lambda *a: run_agent(self.command, *a))
            with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
                results = list(pool.map(lambda job: play(job[0], server.episode_url(job[1]), server.api_key, job[1],
                                                         self.timeout_s), jobs))
            turns = [server.pop_episode(eid) for _, eid in jobs]
            mismatches = server.template_mismatches
        t_agents = time.perf_counter() - t0
        rewards = self._score(jobs, results, turns)
        groups = []
        for g, problem in enumerate(problems):
            trajs = []
            for k in range(g * n, (g + 1) * n):
                stop = _stop(results[k], turns[k])
                trajs.append(Trajectory(task_id=str(problem.get("id", g)), turns=tuple(turns[k]), reward=rewards[k],
                                        stop=stop, info={"text": results[k].answer or "", "error": results[k].error}))
            groups.append(TrajectoryGroup(task_id=str(problem.get("id", g)), trajectories=tuple(trajs), task=problem))
        failed = [r for r in rewards if r.outcome is not Outcome.OK]
        correct = [r.correct for r in rewards if r.correct is not None]
        metrics = {
            "time/generate": t_agents, "time/reward": time.perf_counter() - t0 - t_agents,
            "rollout/gen_tokens": float(sum(len(t.action_ids) for ts in turns for t in ts)),
            "harness/calls_mean": sum(len(ts) for ts in turns) / max(len(turns), 1),
            "harness/error_rate": len(failed) / max(len(rewards), 1),
            "harness/template_mismatches": float(mismatches),
            "harness/agent_seconds_mean": sum(r.seconds for r in results) / max(len(results), 1),
        }
        if correct:
            metrics["harness/success_rate"] = sum(bool(c) for c in correct) / len(correct)
        if failed and metrics["harness/error_rate"] > self.max_error_rate:  # systematic: stop, name the cause (rule 9)
            from tether.rollout.runner import EnvFailure

            raise EnvFailure(f"harness: {metrics['harness/error_rate']:.0%} of the agent runs failed (env.max_error_rate="
                             f"{self.max_error_rate:g}); first: {failed[0].error}")
        return groups, metrics

    def _score(self, jobs, results: list[EpisodeResult], turns) -> list[RewardResult]:
        """Rewards: the agent's own, or its answer scored by the run's reward; failures are values."""
        out: list[RewardResult | None] = [None] * len(results)
        to_score = []
        for k, (res, ts) in enumerate(zip(results, turns)):
            if res.outcome is not Outcome.OK or not ts:
                error = res.error or "the agent made no call to the endpoint"
                out[k] = RewardResult(0.0, outcome=res.outcome if res.error else Outcome.INVALID, error=error)
            elif res.reward is not None:
                out[k] = RewardResult(res.reward, {"agent": res.reward}, correct=res.reward > 0)
            else:
                to_score.append(k)
        if to_score:
            scored, _ = run_rewards([results[k].answer or "" for k in to_score], [jobs[k][0] for k in to_score],
                                    self.reward)
            for k, r in zip(to_score, scored):
                out[k] = r
        return [r for r in out if r is not None]


def _stop(result: EpisodeResult, turns) -> StopReason:
    if result.outcome is Outcome.TIMEOUT:
        return StopReason.TIMEOUT
    if result.outcome is not Outcome.OK or not turns:
        return StopReason.ENV_ERROR
    return StopReason.LENGTH if turns[-1].finish is StopReason.LENGTH else StopReason.DONE
