"""Turn-level partial rollouts (Kimi-Researcher, 2025): park long episodes, continue them with newer weights.

Each group (the n episodes of one problem) is played by `tether.rollout.runner.run_env_rollouts` on
a thread of its own, with its `generate` hook pointed at `TurnBroker.generate`: the broker
collects the turn requests of all live groups and serves them in ONE batched sampling call per
sampling setting (as run_env_rollouts batches all episodes of a call), on the worker's thread,
with the worker's generator — so the model is only ever touched by one thread.

A rollout step is one `run_round`: requests are served until every live group has finished or is
parked. A group is parked when it has generated `token_budget` tokens in this round: its
pending request stays unanswered, and its thread waits, until the next round — after the worker
has loaded newer weights. The turn generated then carries the new policy version (Turn.
policy_version), so the version switch is recorded per turn. A group parked `max_parks` times is
served to completion on its next round, which bounds how old its first turns can get.

Episode wall clocks (env.episode_timeout_s) keep running while a group is parked.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tether.policy.hf import run_generate
from tether.types import Sample, TrajectoryGroup


@dataclass
class _Request:
    prompts: list[Sequence[int]]
    sampling: Any
    greedy: bool
    result: list[Sample] | None = None


@dataclass
class _Group:
    gid: int
    problem: Mapping[str, Any]
    tokens: int = 0  # generated in the current round
    parks: int = 0
    request: _Request | None = None
    done: bool = False
    result: tuple[list[TrajectoryGroup], dict[str, float]] | None = None
    error: BaseException | None = None
    started: float = field(default_factory=time.monotonic)


class TurnBroker:
    """Serves the turn requests of group threads in batches; parks groups over the token budget."""

    def __init__(self, token_budget: int, max_parks: int, generate: Callable[..., list[Sample]] = run_generate) -> None:
        self.token_budget, self.max_parks, self._generate = token_budget, max_parks, generate
        self._cv = threading.Condition()
        self._local = threading.local()
        self._groups: dict[int, _Group] = {}
        self._next = 0

    # ------------------------------------------------------------------ group threads

    def generate(self, policy, prompts, sampling, generator=None, batch_size=256, greedy=False) -> list[Sample]:
        """The `generate` hook of run_env_rollouts: blocks until the broker serves this request."""
        g: _Group = self._local.group
        with self._cv:
            g.request = _Request(list(prompts), sampling, greedy)
            self._cv.notify_all()
            while g.request.result is None:
                self._cv.wait()
            out, g.request = g.request.result, None
        return out

    def start(self, problems: Sequence[Mapping[str, Any]], play: Callable[[Mapping[str, Any], Callable], Any]) -> None:
        """One thread per problem: `play(problem, generate_hook) -> ([group], metrics)`."""
        for p in problems:
            g = _Group(self._next, p)
            self._next += 1
            self._groups[g.gid] = g
            threading.Thread(target=self._run, args=(g, play), daemon=True, name=f"tether-partial-{g.gid}").start()

    def _run(self, g: _Group, play) -> None:
        self._local.group = g
        try:
            g.result = play(g.problem, self.generate)
        except BaseException as err:  # re-raised on the worker's thread by run_round
            g.error = err
        with self._cv:
            g.done = True
            self._cv.notify_all()

    # ------------------------------------------------------------------ the worker's thread

    def _parked(self, g: _Group) -> bool:
        return g.tokens >= self.token_budget and g.parks < self.max_parks

    def _settled(self) -> bool:
        return all(g.done or g.request is not None and g.request.result is None for g in self._groups.values())

    def run_round(self, policy, generator, batch_size: int) -> dict[str, Any]:
        """Serve turns until every live group has finished or is parked; returns the finished
        groups, their metrics, and the round's counters."""
        t0, t_gen, served_turns = time.perf_counter(), 0.0, 0
        for g in self._groups.values():
            g.tokens = 0
        resumed = sum(g.parks > 0 for g in self._groups.values())
        while True:
            with self._cv:
                while not self._settled():
                    self._cv.wait(timeout=1.0)
                serve = [g for g in sorted(self._groups.values(), key=lambda g: g.gid)
                         if not g.done and not self._parked(g)]
            if not serve:
                break
            t1 = time.perf_counter()
            self._serve(serve, policy, generator, batch_size)
            t_gen += time.perf_counter() - t1
            served_turns += 1
        finished = [g for g in self._groups.values() if g.done]
        for g in finished:
            del self._groups[g.gid]
            if g.error is not None:
                raise g.error
        parked = [g for g in self._groups.values() if not g.done]
        for g in parked:
            g.parks += 1
        return {"results": [g.result for g in sorted(finished, key=lambda g: g.gid)], "parked": len(parked),
                "resumed": resumed, "forced": sum(g.parks >= self.max_parks for g in parked),
                "time/generate": t_gen, "time/rollout": time.perf_counter() - t0, "turn_batches": served_turns}

    def _serve(self, serve: list[_Group], policy, generator, batch_size: int) -> None:
        by_key: dict[tuple, list[_Group]] = {}
        for g in serve:  # one sampling call per (sampling setting, greedy), groups in a fixed order
            key = (g.request.sampling.model_dump_json(), g.request.greedy)
            by_key.setdefault(key, []).append(g)
        for groups in by_key.values():
            req0 = groups[0].request
            prompts = [p for g in groups for p in g.request.prompts]
            samples = self._generate(policy, prompts, req0.sampling, generator, batch_size=batch_size, greedy=req0.greedy)
            i = 0
            with self._cv:
                for g in groups:
                    k = len(g.request.prompts)
                    g.request.result = samples[i:i + k]
                    g.tokens += sum(len(s.token_ids) for s in samples[i:i + k])
                    i += k
                self._cv.notify_all()

    @property
    def live(self) -> int:
        return len(self._groups)


__all__ = ["TurnBroker"]
