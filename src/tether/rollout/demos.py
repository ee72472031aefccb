"""SFT demonstrations for environment tasks (`tether.rollout.episodes` serves them to the recipes).

- `build_env_demo_records`: the scripted expert plays each problem in its environment; the
  conversation becomes one training sequence with the loss on assistant tokens only (each
  action plus the end-of-turn token the template expects, so SFT teaches the model to stop and
  to hand over to the environment). Contexts are assembled exactly as the rollout assembles
  append-only contexts (`tether.policy.chat.compute_segments`).
Held-out evaluation is the same for every task kind: `tether.eval.runner.run_eval` over the
task's rollout (`tether.rollout.make_rollout`).
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from tether.train.batching import SeqRecord, build_sequences
from tether.envs.config import ContextConfig
from tether.envs.base import run_expert_episode
from tether.envs.context import compute_dropped_messages, load_summarizer, select_context_messages, summarize_tool_results
from tether.policy.chat import Message, compute_context_ids, compute_end_of_turn_id, compute_segments, encode_text
from tether.policy.hf import HFPolicy
from tether.types import RewardResult, StopReason, Trajectory, Turn


def build_env_demo_records(policy: HFPolicy, problems: Sequence[Mapping[str, Any]], max_turns: int = 16,
                           noise: float = 0.0, rng: random.Random | None = None,
                           context: ContextConfig | None = None) -> list[SeqRecord]:
    """One SFT sequence per problem: the expert's conversation, loss on assistant tokens only.

    `noise`: a weak teacher (see `run_expert_episode`). `context`: with a sliding_window or
    summary builder, each turn is trained on the context that builder would show (sequences
    split where contexts stop extending each other, as `batching.build_sequences` splits
    rollouts); the summary of dropped turns comes from the configured function, or from
    `summarize_tool_results` when the policy itself summarises (it cannot before training)."""
    tok = policy.tokenizer
    eot = compute_end_of_turn_id(tok, policy.stop_ids)
    cache: dict[str, tuple[int, ...]] = {}
    records = []
    for i, p in enumerate(problems):
        history, schemas, _ = run_expert_episode(p, max_turns, noise, rng)
        msgs = [Message(m.role, m.content, encode_text(tok, m.content) + (eot,)) if m.role == "assistant" else m
                for m in history]
        if context is not None and context.builder != "append":
            records.extend(_windowed_demo_records(policy, msgs, schemas, context, cache, i))
            continue
        segments = compute_segments(tok, msgs, schemas, policy.stop_ids, cache, add_generation_prompt=False)
        ids = tuple(t for s in segments for t in s.ids)
        mask = tuple(int(s.is_action) for s in segments for _ in s.ids)
        if len(ids) != len(mask):
            raise AssertionError(f"demo {p.get('id')}: {len(ids)} ids but {len(mask)} mask entries")
        zeros = (0.0,) * len(ids)
        records.append(SeqRecord(ids, mask, zeros, zeros, i, i, 0.0, True))
    return records


def _windowed_demo_records(policy: HFPolicy, msgs: Sequence[Message], schemas: list[dict], context: ContextConfig,
                           cache: dict, i: int) -> list[SeqRecord]:
    """The expert's turns under a window/summary builder, merged like rollout turns."""
    first = next((k for k, m in enumerate(msgs) if m.role == "assistant"), len(msgs))
    head, turns = list(msgs[:first]), []
    for m in msgs[first:]:
        if m.role == "assistant":
            turns.append([m])
        else:
            turns[-1].append(m)
    fn = load_summarizer(context.summarizer) or summarize_tool_results
    steps = []
    for t, turn in enumerate(turns):
        dropped = compute_dropped_messages(context.builder, turns[:t], context.window)
        summary = fn(dropped) if dropped else None
        shown = select_context_messages(context.builder, head, turns[:t], context.window, summary)
        ctx = compute_context_ids(policy.tokenizer, shown, schemas, policy.stop_ids, cache)
        steps.append(Turn(context_ids=ctx, action_ids=turn[0].action_ids, action_logprobs=(0.0,) * len(turn[0].action_ids)))
    traj = Trajectory(str(i), tuple(steps), RewardResult(total=0.0), StopReason.DONE)
    return build_sequences(traj, i, i, True)
