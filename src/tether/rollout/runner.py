"""Drive the policy through multi-turn environments into TrajectoryGroups, batched across episodes.

    groups, metrics = EpisodeRollout(cfg.env).run(policy, problems, n, cfg.rollout.sampling)   # tether.rollout.episodes

Each problem is played by n fresh single-use environments. Every turn, the contexts of ALL live
episodes are generated in one `run_generate` call (one batch per turn, as rollout/single.py batches a
single-turn step); environment steps then run concurrently, each with a wall clock.

Token in, token out (docs/design.md, correctness rules 1 and 2): a `Turn` stores the context ids the model saw (built
by the context builder, `tether.envs.context`, with sampled ids spliced verbatim by
`tether.policy.chat`), the sampled ids and their log-probs. Whenever the builder kept every
earlier message (always for `append`), the new context must extend the previous context +
action; a violation is counted
(`rollout/tokenization_drift_count`) or raises `TokenizationDrift` (`rollout.on_drift=fail`).
`rollout/retokenize_mismatch_count` counts the actions whose decode -> encode differs from the
sampled ids: the turns a re-tokenising framework would have silently corrupted.

Episodes end with a StopReason: done (the env said so), max_turns, context_overflow (the next
context would not fit), timeout (the episode's or one step's wall clock), env_error (reset or
step raised, or returned garbage), parse_error (env.max_parse_errors malformed tool calls in a
row). Failures are contained and counted, never fatal; more than env.max_error_rate of the
episodes ending in env_error raises `EnvFailure` naming the environment and its first error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from tether.envs.config import EnvConfig
from tether.policy.config import SamplingConfig
from tether.envs.base import Action, Observation, StepResult, Transition, make_env
from tether.envs.calls import CallOutcome, run_call, run_calls
from tether.envs.context import SUMMARY_REQUEST, compute_dropped_messages, load_summarizer, select_context_messages
from tether.envs.tools import parse_tool_calls
from tether.policy.chat import (
    Message,
    TokenizationDrift,
    compute_context_ids,
    compute_segments,
    decode_completion,
    encode_text,
    is_prefix_preserving,
)
from tether.policy.hf import HFPolicy, run_generate
from tether.policy.kv_reuse import carry_turn_kv
from tether.types import Outcome, RewardResult, Sample, StopReason, Trajectory, TrajectoryGroup, Turn

if TYPE_CHECKING:
    from tether.rollout.episodes import EpisodeRollout

log = logging.getLogger(__name__)
EPISODE_STOPS = (StopReason.DONE, StopReason.MAX_TURNS, StopReason.CONTEXT_OVERFLOW, StopReason.TIMEOUT,
                 StopReason.ENV_ERROR, StopReason.PARSE_ERROR)
_WARNED_TEMPLATES: set[int] = set()
_TOOL_COUNTERS = ("tool_calls", "tool_errors", "tool_timeouts")


class EnvFailure(RuntimeError):
    """A systematic environment failure: too many episodes of one step ended in env_error."""


@dataclass
class _Step:
    """What one turn recorded before the Turn is frozen."""

    context_ids: tuple[int, ...]
    sample: Sample
    anchor: str
    env_reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Episode:
    """The runner's mutable view of one live episode (the env object owns the world state)."""

    task: Mapping[str, Any]
    env: Any = None
    tools: dict[str, Any] = field(default_factory=dict)
    schemas: list[dict] = field(default_factory=list)
    head: list[Message] = field(default_factory=list)
    turns: list[list[Message]] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    obs: Observation | None = None
    prev: tuple[int, ...] | None = None  # previous context + action (prefix check)
    prev_messages: list[Message] = field(default_factory=list)  # the messages of the previous context
    summary: str | None = None
    summarized: int = 0  # turns covered by `summary`
    stop: StopReason | None = None
    error: str = ""
    correct: bool | None = None
    parse_streak: int = 0
    start: float = field(default_factory=time.monotonic)


def compute_anchor_key(messages: Sequence[Message]) -> str:
    """GiGPO anchor state: a digest of the observation messages a turn acted on (identical
    observations -> identical observation ids under the template -> one step group)."""
    blob = json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def compute_turn_rewards(step_rewards: Sequence[float], credit: str) -> tuple[list[float], float]:
    """Place an episode's env rewards r_0..r_{T-1} on (Turn.reward per turn, trajectory score).

    batching puts Turn.reward on each turn's last action token and adds the trajectory score on
    the final one, so the token rewards always sum to the return R = sum_t r_t:
      broadcast: turns 0, score R — every estimator sees one trajectory outcome;
      step:      turn t < T-1 keeps r_t, score r_{T-1} — token-level estimators (gigpo,
                 step_grpo, reinforce_pp, gae) see when each reward arrived.
    """
    rewards = [float(r) for r in step_rewards]
    if not rewards:
        return [], 0.0
    if credit == "broadcast":
        return [0.0] * len(rewards), sum(rewards)
    if credit == "step":
        return rewards[:-1] + [0.0], rewards[-1]
    raise ValueError(f"unknown env.credit {credit!r}; valid: broadcast, step")


def _start(task: Mapping[str, Any]) -> tuple[Any, Observation]:
    env = make_env(task)
    obs = env.reset()
    if not isinstance(obs, Observation):
        raise TypeError(f"reset() returned {type(obs).__name__}, expected Observation")
    return env, obs


def _start_episodes(problems: Sequence[Mapping[str, Any]], n: int, cfg: EnvConfig, counts: Counter) -> list[_Episode]:
    episodes = [_Episode(task=p) for p in problems for _ in range(n)]
    for e, o in zip(episodes, run_calls([lambda e=e: _start(e.task) for e in episodes], cfg.step_timeout_s)):
        if o.outcome is not Outcome.OK:
            e.stop = StopReason.ENV_ERROR if o.outcome is Outcome.ERROR else StopReason.TIMEOUT
            e.error = f"reset: {o.error}"
            counts["env_errors" if o.outcome is Outcome.ERROR else "step_timeouts"] += 1
            continue
        e.env, e.obs = o.value
        e.head = list(e.obs.messages)
        e.tools = {t.name: t for t in getattr(e.env, "tools", ())}
        e.schemas = [t.schema for t in e.tools.values()]
    return episodes


def _build_context(policy: HFPolicy, e: _Episode, cfg: EnvConfig, cache: dict, max_ctx: int,
                   on_drift: str, counts: Counter) -> tuple[int, ...] | None:
    """The next context ids (None: the episode stops on context overflow)."""
    messages = select_context_messages(cfg.context.builder, e.head, e.turns, cfg.context.window, e.summary)
    ctx = compute_context_ids(policy.tokenizer, messages, e.schemas, policy.stop_ids, cache)
    # the builder kept every earlier message and appended the last action: the ids must extend too
    appended = e.turns and messages[: len(e.prev_messages) + 1] == [*e.prev_messages, e.turns[-1][0]]
    e.prev_messages = messages
    if e.prev is not None and ctx[: len(e.prev)] != e.prev:
        counts["context_rebuilds"] += 1  # expected when a window or summary rewrote the messages
        if appended:
            counts["tokenization_drift"] += 1
            if on_drift == "fail":
                at = next(i for i, (a, b) in enumerate(zip(ctx, e.prev + (None,))) if a != b)
                raise TokenizationDrift(
                    f"episode {e.task.get('id')!r} turn {len(e.steps)}: the new context diverges from the previous "
                    f"context + action at token {at} (rollout.on_drift=fail); is the chat template prefix-preserving?"
                )
    if len(ctx) > max_ctx:
        e.stop = StopReason.CONTEXT_OVERFLOW
        return None
    return ctx


def _record(policy: HFPolicy, e: _Episode, ctx: tuple[int, ...], s: Sample, a: Action, o: CallOutcome,
            cfg: EnvConfig, counts: Counter) -> None:
    """Apply one step's outcome to the episode: the turn, the transition, the stop reason."""
    anchor = compute_anchor_key(e.turns[-1][1:] if e.turns else e.head)
    step = _Step(ctx, s, anchor, info={"finish": s.finish.value, "parse_errors": len(a.parsed.errors)})
    e.steps.append(step)
    e.prev = ctx + s.token_ids
    e.turns.append([Message("assistant", a.text, action_ids=s.token_ids)])
    content = s.token_ids[:-1] if s.token_ids and s.token_ids[-1] in policy.stop_ids else s.token_ids
    counts["retokenize_mismatch"] += int(encode_text(policy.tokenizer, a.text) != content)
    counts["parse_errors"] += len(a.parsed.errors)
    e.parse_streak = e.parse_streak + 1 if a.parsed.errors else 0
    res = o.value
    if o.outcome is Outcome.OK and (problem := compute_step_problem(res)):
        o = CallOutcome(Outcome.ERROR, error=problem)
    if o.outcome is not Outcome.OK:
        e.stop = StopReason.ENV_ERROR if o.outcome is Outcome.ERROR else StopReason.TIMEOUT
        e.error = f"step {len(e.steps) - 1}: {o.error}"
        counts["env_errors" if o.outcome is Outcome.ERROR else "step_timeouts"] += 1
        return
    step.env_reward = float(res.reward)
    for k in _TOOL_COUNTERS:
        counts[k] += res.info.get(k, 0)
    e.turns[-1].extend(res.observation.messages)
    e.transitions.append(Transition(e.obs, a, dict(res.info), float(res.reward), res.observation, bool(res.done)))
    e.obs = res.observation
    e.correct = res.info.get("correct", e.correct)
    if res.done:
        e.stop = StopReason.DONE
    elif e.parse_streak >= cfg.max_parse_errors:
        e.stop = StopReason.PARSE_ERROR


def compute_step_problem(res: Any) -> str:
    """Why a step's return value is garbage ('' when it is a well-formed StepResult)."""
    if not isinstance(res, StepResult):
        return f"step() returned {type(res).__name__} {res!r:.60}, expected a StepResult"
    if not isinstance(res.reward, (int, float)) or not math.isfinite(float(res.reward)):
        return f"step() returned reward {res.reward!r:.40}, expected a finite number"
    if not isinstance(res.observation, Observation) or not all(isinstance(m, Message) for m in res.observation.messages):
        return f"step() returned observation {res.observation!r:.60}, expected an Observation of Messages"
    if not isinstance(res.info, Mapping) or not all(isinstance(res.info.get(k, 0), int) for k in _TOOL_COUNTERS):
        return f"step() returned info {res.info!r:.60}, expected a mapping with integer tool counters"
    return ""


def _run_summaries(policy: HFPolicy, live: list[_Episode], cfg: EnvConfig, sampling: SamplingConfig, cache: dict,
                   generator, generate, counts: Counter) -> None:
    """Refresh the summary of episodes whose window dropped a turn since the last summary."""
    c = cfg.context
    stale = [e for e in live if c.builder == "summary" and len(e.turns) - c.window > e.summarized]
    if not stale:
        return
    fn = load_summarizer(c.summarizer)
    dropped = [compute_dropped_messages(c.builder, e.turns, c.window) for e in stale]
    if fn is None:
        prompts = [compute_context_ids(policy.tokenizer, [*e.head, *d, Message("user", SUMMARY_REQUEST)], e.schemas,
                                       policy.stop_ids, cache) for e, d in zip(stale, dropped)]
        sp = sampling.model_copy(update={"max_new_tokens": c.summary_max_tokens})
        samples = generate(policy, prompts, sp, generator)
        texts = [decode_completion(policy.tokenizer, s.token_ids, policy.stop_ids) for s in samples]
    else:
        outs = [run_call(lambda d=d: str(fn(d)), cfg.step_timeout_s) for d in dropped]
        counts["summary_errors"] += sum(o.outcome is not Outcome.OK for o in outs)
        texts = [o.value if o.outcome is Outcome.OK else "(summary unavailable)" for o in outs]
    for e, t in zip(stale, texts):
        e.summary, e.summarized = t, len(e.turns) - c.window
    counts["summaries"] += len(stale)


def run_env_rollouts(
    policy: HFPolicy,
    problems: Sequence[Mapping[str, Any]],
    n: int,
    sampling: SamplingConfig,
    engine: EpisodeRollout,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    generate: Callable[..., list[Sample]] = run_generate,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """n episodes of each problem -> TrajectoryGroups and metrics (see module docstring); `engine`
    (tether.rollout.episodes.EpisodeRollout) carries the `env` section, the sampling batch size and
    what a tokenization drift does (`on_drift`).

    `generate(policy, prompts, sampling, generator, batch_size=, greedy=)` defaults to the HF
    sampler; tests pass a scripted one.
    """
    cfg, batch_size, on_drift = engine.env, engine.batch_size, engine.on_drift
    t0 = time.perf_counter()
    counts: Counter = Counter()
    episodes = _start_episodes(problems, n, cfg, counts)
    _check_template(policy, episodes, counts)
    max_ctx = cfg.max_context_tokens or (policy.max_positions - sampling.max_new_tokens)
    cache: dict[str, tuple[int, ...]] = {}
    t_gen = t_env = 0.0
    with carry_turn_kv(policy, cfg.reuse_kv) as store:  # keys/values from one turn's sampling to the next's prefill
        try:
            for _ in range(cfg.max_turns):
                live = [e for e in episodes if e.stop is None]
                for e in live:
                    if time.monotonic() - e.start > cfg.episode_timeout_s:
                        e.stop = StopReason.TIMEOUT
                live = [e for e in live if e.stop is None]
                if not live:
                    break
                t1 = time.perf_counter()
                _run_summaries(policy, live, cfg, sampling, cache, generator, generate, counts)
                ctxs = [_build_context(policy, e, cfg, cache, max_ctx, on_drift, counts) for e in live]
                ready = [(e, c) for e, c in zip(live, ctxs) if c is not None]
                if not ready:
                    break
                samples = generate(policy, [c for _, c in ready], sampling, generator, batch_size=batch_size, greedy=greedy)
                t2 = time.perf_counter()
                actions = [_make_action(policy, s) for s in samples]
                outs = run_calls([lambda e=e, a=a: e.env.step(a) for (e, _), a in zip(ready, actions)], cfg.step_timeout_s)
                for (e, c), s, a, o in zip(ready, samples, actions, outs):
                    _record(policy, e, c, s, a, o, cfg, counts)
                t_gen, t_env = t_gen + (t2 - t1), t_env + (time.perf_counter() - t2)
        finally:
            _close(episodes)
    for e in episodes:
        e.stop = e.stop or StopReason.MAX_TURNS
    groups = [_build_group(policy, problems[g], episodes[g * n:(g + 1) * n], cfg, g) for g in range(len(problems))]
    metrics = compute_env_metrics(episodes, counts, t_gen, t_env, time.perf_counter() - t0)
    if store is not None and store.stats["prompt_positions"]:
        metrics["rollout/prefill_reused_frac"] = store.stats["reused_positions"] / store.stats["prompt_positions"]
        metrics["rollout/prefill_run_frac"] = store.stats["run_positions"] / store.stats["prompt_positions"]
    _check_failure_rate(episodes, cfg)
    return groups, metrics


def _make_action(policy: HFPolicy, s: Sample) -> Action:
    text = decode_completion(policy.tokenizer, s.token_ids, policy.stop_ids)
    return Action(text, s.token_ids, parse_tool_calls(text), truncated=s.finish is StopReason.LENGTH)


def _check_template(policy: HFPolicy, episodes: list[_Episode], counts: Counter) -> None:
    schemas = next((e.schemas for e in episodes if e.env is not None), None)
    ok, why = is_prefix_preserving(policy.tokenizer, schemas)
    counts["template_prefix_preserving"] = int(ok)
    if not ok and id(policy.tokenizer) not in _WARNED_TEMPLATES:
        _WARNED_TEMPLATES.add(id(policy.tokenizer))
        log.warning("chat template is not prefix-preserving (%s): append-only contexts will drift and each "
                    "turn will train as its own sequence", why)


def _close(episodes: list[_Episode]) -> None:
    closers = [e.env.close for e in episodes if e.env is not None and callable(getattr(e.env, "close", None))]
    run_calls(closers, 5.0)  # a failing or hanging close is dropped: the episode is already recorded


def _build_group(policy: HFPolicy, task: Mapping[str, Any], eps: list[_Episode], cfg: EnvConfig,
                 g: int) -> TrajectoryGroup:
    task_id = str(task.get("id", g))
    trajs = []
    for e in eps:
        turn_rewards, score = compute_turn_rewards([s.env_reward for s in e.steps], cfg.credit)
        full = compute_segments(policy.tokenizer, [*e.head, *(m for t in e.turns for m in t)], e.schemas,
                                policy.stop_ids, add_generation_prompt=False) if e.steps else []
        after = _observation_ids(full)
        turns = tuple(
            Turn(context_ids=s.context_ids, action_ids=s.sample.token_ids, action_logprobs=s.sample.logprobs,
                 observation_ids=after[k] if k < len(after) else (), reward=r, finish=s.sample.finish,
                 policy_version=s.sample.policy_version, action_kept=s.sample.kept, action_versions=s.sample.token_versions,
                 info={**s.info, "anchor": s.anchor, "env_reward": s.env_reward})
            for k, (s, r) in enumerate(zip(e.steps, turn_rewards))
        )
        failed = e.stop is StopReason.ENV_ERROR
        reward = RewardResult(total=score, components={"env_return": sum(s.env_reward for s in e.steps)},
                              outcome=Outcome.ERROR if failed else Outcome.OK,
                              correct=None if failed else bool(e.correct), error=e.error)
        text = "\n".join(f"[{m.role}] {m.content}" for m in [*e.head, *(m for t in e.turns for m in t)])
        trajs.append(Trajectory(task_id, turns, reward, e.stop, info={
            "text": text, "num_turns": len(turns), "env": task.get("env"), "error": e.error,
            "transitions": tuple(e.transitions)}))
    return TrajectoryGroup(task_id, tuple(trajs), task)


def _observation_ids(segments) -> list[tuple[int, ...]]:
    """For each action segment, the ids of the template piece that follows it."""
    out = []
    for i, seg in enumerate(segments):
        if seg.is_action:
            nxt = segments[i + 1] if i + 1 < len(segments) and not segments[i + 1].is_action else None
            out.append(nxt.ids if nxt else ())
    return out


def compute_env_metrics(episodes: list[_Episode], counts: Counter, t_gen: float, t_env: float,
                        t_total: float) -> dict[str, float]:
    """Per-step environment metrics: stop-reason fractions, turns, tool and parse counters,
    token-bookkeeping counters, success rate, timings."""
    n = max(len(episodes), 1)
    turns = [len(e.steps) for e in episodes]
    ctx = [len(s.context_ids) for e in episodes for s in e.steps]
    gen_tokens = sum(len(s.sample.token_ids) for e in episodes for s in e.steps)
    judged = [e.correct for e in episodes if e.stop is not StopReason.ENV_ERROR]
    m = {f"env/stop/{r.value}": sum(e.stop is r for e in episodes) / n for r in EPISODE_STOPS}
    m.update({
        "env/episodes": float(len(episodes)),
        "env/turns_mean": sum(turns) / n,
        "env/turns_max": float(max(turns, default=0)),
        "env/return_mean": sum(s.env_reward for e in episodes for s in e.steps) / n,
        "env/success_rate": sum(bool(c) for c in judged) / max(len(judged), 1),
        "rollout/context_tokens_mean": sum(ctx) / max(len(ctx), 1),
        "rollout/context_tokens_max": float(max(ctx, default=0)),
        "rollout/gen_tokens": float(gen_tokens),
        "rollout/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "time/generate": t_gen,
        "time/env": t_env,
        "time/rollout": t_total,
    })
    for k in ("env_errors", "step_timeouts", "tool_calls", "tool_errors", "tool_timeouts", "parse_errors",
              "summaries", "summary_errors"):
        m[f"env/{k}"] = float(counts[k])
    for k in ("tokenization_drift", "retokenize_mismatch", "context_rebuilds"):
        m[f"rollout/{k}_count"] = float(counts[k])
    m["rollout/template_prefix_preserving"] = float(counts["template_prefix_preserving"])
    return m


def _check_failure_rate(episodes: list[_Episode], cfg: EnvConfig) -> None:
    failed = [e for e in episodes if e.stop is StopReason.ENV_ERROR]
    if episodes and len(failed) / len(episodes) > cfg.max_error_rate:
        envs = sorted({str(e.task.get("env")) for e in failed})
        raise EnvFailure(
            f"systematic environment failure: {len(failed)}/{len(episodes)} episodes ended in env_error "
            f"(> env.max_error_rate={cfg.max_error_rate:g}); environment(s) {', '.join(envs)}; "
            f"first error: {failed[0].error}"
        )
