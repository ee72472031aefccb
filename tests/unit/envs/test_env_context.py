"""Context builders: each turn's recorded context is exactly what the model saw, and training
sequences are exactly those contexts (merged only where a context extends the previous one)."""

from __future__ import annotations

from env_stubs import ToolEnv, encode_action, tool_task

from tether.train.batching import build_sequences
from tether.config import ContextConfig, EnvConfig, SamplingConfig
from tether.envs.context import SUMMARY_PREFIX, SUMMARY_REQUEST, select_context_messages, summarize_tool_results
from tether.rollout.episodes import EpisodeRollout
from tether.policy.chat import Message, render_chat

CALLS = [f'<tool_call>{{"name": "sentinel_tool", "arguments": {{"word": "w{k}"}}}}</tool_call>' for k in range(3)]


def rollout(policy, scripted, builder, summarizer="tether.envs.context:summarize_tool_results", window=1):
    tok = policy.tokenizer
    turn = [0]

    def act(call, row, prompt):
        if tok.decode(list(prompt)).endswith(SUMMARY_REQUEST + "<|im_end|>\n<|im_start|>assistant\n"):
            return encode_action(tok, "made three calls")  # the policy writing a summary
        turn[0] += 1
        return encode_action(tok, CALLS[turn[0] - 1] if turn[0] <= 3 else "done")

    gen = scripted(act, policy.stop_ids)
    cfg = EnvConfig(max_turns=6, context=ContextConfig(builder=builder, window=window, summarizer=summarizer))
    groups, m = EpisodeRollout(cfg).run(policy, [tool_task(0)], 1, SamplingConfig(max_new_tokens=64), generate=gen)
    return groups[0].trajectories[0], m, gen


def expected_text(tok, traj, k, window):
    """The chat template's rendering of the system/task messages plus the last `window` turns
    before turn k, with the env's tool schemas."""
    head = [{"role": "system", "content": "test env"}, {"role": "user", "content": "task 0"}]
    turns = [[{"role": "assistant", "content": t.action.text},
              *[{"role": m.role, "content": m.content} for m in t.next_observation.messages]]
             for t in traj.info["transitions"][:k]]
    kept = [m for t in turns[max(0, k - window):] for m in t]
    return render_chat(tok, head + kept, [t.schema for t in ToolEnv(tool_task(0)).tools])


def test_append_contexts_extend_and_merge_into_one_sequence(env_policy, scripted):
    traj, m, gen = rollout(env_policy, scripted, "append")
    assert [t.context_ids for t in traj.turns] == [c[0] for c in gen.calls]
    assert len(build_sequences(traj, 0, 0, True)) == 1 and m["rollout/context_rebuilds_count"] == 0


def test_sliding_window_contexts_are_exactly_what_the_model_saw(env_policy, scripted):
    tok = env_policy.tokenizer
    traj, m, gen = rollout(env_policy, scripted, "sliding_window", window=1)
    assert traj.stop.value == "done" and len(traj.turns) == 4
    assert [t.context_ids for t in traj.turns] == [c[0] for c in gen.calls]
    for k, turn in enumerate(traj.turns):
        assert tok.decode(list(turn.context_ids)) == expected_text(tok, traj, k, window=1), k
    seqs = build_sequences(traj, 0, 0, True)
    # turn 1 extends turn 0; turns 2 and 3 dropped history: each is its own exact sample
    assert len(seqs) == 3 and m["rollout/context_rebuilds_count"] == 2
    assert seqs[1].ids == traj.turns[2].context_ids + traj.turns[2].action_ids
    assert sum(seqs[1].loss_mask) == len(traj.turns[2].action_ids)


def test_summary_by_function_replaces_dropped_turns(env_policy, scripted):
    tok = env_policy.tokenizer
    traj, m, gen = rollout(env_policy, scripted, "summary", window=1)
    text = tok.decode(list(traj.turns[2].context_ids))
    assert SUMMARY_PREFIX + "sentinel_tool(word='w0') -> w0 <|endoftext|>" in text and "w1" in text
    assert m["env/summaries"] == 2 and len(gen.calls) == 4  # no extra generation for a function summary


def test_summary_by_the_policy_is_generated_but_never_trained(env_policy, scripted):
    tok = env_policy.tokenizer
    traj, m, gen = rollout(env_policy, scripted, "summary", summarizer="policy", window=1)
    assert len(gen.calls) == 6  # 4 turns + 2 summary requests, each one batched call
    assert SUMMARY_PREFIX + "made three calls" in tok.decode(list(traj.turns[3].context_ids))
    actions = [tok.decode(list(t.action_ids)) for t in traj.turns]
    assert not any("made three calls" in a for a in actions)


def test_builders_select_messages():
    head = [Message("system", "s"), Message("user", "task")]
    turns = [[Message("assistant", f"a{k}"), Message("tool", f"o{k}")] for k in range(3)]
    contents = lambda ms: [m.content for m in ms]  # noqa: E731
    assert contents(select_context_messages("append", head, turns, 1)) == ["s", "task", "a0", "o0", "a1", "o1", "a2", "o2"]
    assert contents(select_context_messages("sliding_window", head, turns, 2)) == ["s", "task", "a1", "o1", "a2", "o2"]
    assert contents(select_context_messages("summary", head, turns, 2, "sum")) == ["s", "task", SUMMARY_PREFIX + "sum",
                                                                                 "a1", "o1", "a2", "o2"]
    assert summarize_tool_results([Message("assistant", CALLS[0]), Message("tool", "x")]) == "sentinel_tool(word='w0') -> x"
