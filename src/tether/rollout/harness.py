"""A black-box agent harness: a user's agent program (any language) plays each problem against
tether's OpenAI-compatible endpoint (`tether.serve.endpoint`), and its final answer is scored.

    harness.command=[python, my_agent.py]           # with any data.task (built-in, jsonl, hf)
    harness.persistent=true                         # one process serves many episodes (stdin/stdout lines)

How the program is run and how its result is read (one process per episode, or persistent
processes; `python` is tether's own interpreter; strict output parsing): `tether.rollout.agent_io`.
The agent talks to the endpoint with any OpenAI client, as many calls as it likes, and reports
`{"reward": x}`, `{"answer": "42"}` or (per-episode mode) a plain last line that is the answer. An
answer is scored by the run's reward (`reward.components`) against the problem. The trajectory is
the episode's completions as tether sampled them (token ids and log-probs), so the agent never
needs to return tokens. A program that exits non-zero, prints nothing or garbage, makes no call
or runs past `harness.timeout_s` is an error outcome: counted, shown with its stderr tail and
masked out of the update (docs/design.md, correctness rule 6); more than `env.max_error_rate`
of a call's episodes failing stops the run with the first error.

The endpoint knows the prompt format the model was trained on (`tether.rollout.prompt_format`):
an agent that sends chat requests to a raw-prompt model (or the reverse) is warned about at its
first request and counted (`rollout/prompt_format_mismatch`, a `tether doctor` finding).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Mapping, Sequence

import torch

from tether.policy.config import SamplingConfig
from tether.rewards.config import RewardConfig
from tether.rewards import run_rewards
from tether.rollout.agent_io import MAX_OUTPUT_BYTES, AgentPool, EpisodeResult, parse_agent_output, run_agent
from tether.types import Outcome, RewardResult, Sample, StopReason, Trajectory, TrajectoryGroup

__all__ = ["EpisodeResult", "HarnessRollout", "MAX_OUTPUT_BYTES", "parse_agent_output", "run_agent"]


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
    # (tether.rollout.verifiers runs a verifiers environment's own rollout loop this way)
    agent: Callable[..., EpisodeResult] | None = None
    persistent: bool = False  # harness.persistent: `command` serves many episodes (tether.rollout.agent_io)
    prompt_format: str | None = None  # what the model was trained on ("chat" | "raw"; model.path's run record): None unknown
    progress_s: float = 10.0  # a progress line at most this often while a call runs (0: none)
    checks_prompt_format: bool = True  # a fact: the endpoint checks each request's format (the agent chooses it)

    def fit_problems(self, problems: Sequence[Mapping[str, Any]], policy: Any, cfg: Any, what: str) -> list:
        """As a single-turn task: the prompt must fit the context (data.on_overlong)."""
        from tether.rollout.single import SingleTurnRollout

        return SingleTurnRollout(self.reward).fit_problems(problems, policy, cfg, what)

    def build_demo_records(self, policy: Any, problems: Sequence[Mapping[str, Any]], cfg: Any) -> list:
        """SFT demonstrations: the task's single-turn ones (the agent program is not scripted)."""
        from tether.rollout.single import build_single_turn_demo_records

        return build_single_turn_demo_records(policy, problems, cfg.data.task, cfg.data.chat, cfg.sft.demo_noise,
                                              cfg.run.seed)

    def _player(self, api_key: str) -> Callable[..., EpisodeResult]:
        if self.agent is not None:
            return self.agent
        if self.persistent:
            return AgentPool.get(self.command, api_key).play
        return lambda *a: run_agent(self.command, *a)

    def _play_all(self, server: Any, jobs: list, label: str) -> list[EpisodeResult]:
        """Every job through the agent, `concurrency` at once, with a progress line every `progress_s`."""
        play = self._player(server.api_key)
        results: list[EpisodeResult | None] = [None] * len(jobs)
        t0 = last = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            futures = {pool.submit(play, p, server.episode_url(eid), server.api_key, eid, self.timeout_s): k
                       for k, (p, eid) in enumerate(jobs)}
            for done, fut in enumerate(as_completed(futures), 1):
                results[futures[fut]] = fut.result()
                now = time.perf_counter()
                if self.progress_s and now - last >= self.progress_s and done < len(jobs):
                    last = now
                    failed = sum(r is not None and r.outcome is not Outcome.OK for r in results)
                    print(f"[tether harness] {label}{done}/{len(jobs)} episodes ({done / (now - t0):.1f}/s"
                          f"{f', {failed} failed' if failed else ''})", flush=True)
        return [r for r in results if r is not None]

    def run(self, policy: Any, problems: Sequence[Mapping[str, Any]], n: int, sampling: SamplingConfig,
            generator: torch.Generator | None = None, greedy: bool = False,
            generate: Callable[..., list[Sample]] | None = None) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        from tether.serve.endpoint import RolloutServer

        t0 = time.perf_counter()
        seed = self.seed if generator is None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        if greedy:
            sampling = sampling.model_copy(update={"temperature": 1e-4})  # the agent's own temperature rules
        jobs = [(p, f"{p.get('id', g)}-{j}-{uuid.uuid4().hex[:8]}") for g, p in enumerate(problems) for j in range(n)]
        with RolloutServer(policy, sampling, self.host, token=self.token, seed=seed,
                           prompt_format=self.prompt_format) as server:
            results = self._play_all(server, jobs, "greedy: " if greedy else "")
            turns = [server.pop_episode(eid) for _, eid in jobs]
            mismatches, formats, format_mismatches = server.template_mismatches, server.format_requests, server.format_mismatches
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
            "harness/invalid": float(sum(r.outcome is Outcome.INVALID for r in rewards)),
            "harness/template_mismatches": float(mismatches),
            "harness/agent_seconds_mean": sum(r.seconds for r in results) / max(len(results), 1),
            "harness/episodes_per_s": len(jobs) / max(t_agents, 1e-9),
        }
        if requests := sum(formats.values()):  # the agent's prompt format, and the share of its calls in the other
            metrics["harness/chat_requests_frac"] = formats["chat"] / requests  # format than the model was trained on
            if self.prompt_format is not None:
                metrics["rollout/prompt_format_mismatch"] = format_mismatches / requests
        if correct:
            metrics["harness/success_rate"] = sum(bool(c) for c in correct) / len(correct)
        if failed:
            print(f"[tether harness] {len(failed)} of {len(rewards)} agent runs failed (masked out of the update); "
                  f"first: {failed[0].error[:500]}", flush=True)
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
            elif res.reward is not None and not (isinstance(res.reward, (int, float)) and math.isfinite(res.reward)):
                # an in-process agent's own score (a verifiers rubric) is held to the same rule as a program's output
                out[k] = RewardResult(0.0, outcome=Outcome.INVALID, error=f"the agent's reward must be a finite number, "
                                                                          f"got {res.reward!r:.40}")
            elif res.reward is not None:
                out[k] = RewardResult(float(res.reward), {"agent": float(res.reward)}, correct=res.reward > 0)
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
