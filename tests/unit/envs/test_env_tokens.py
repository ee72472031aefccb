"""Token bookkeeping of multi-turn rollouts (docs/design.md, correctness rules 1, 2 and 11): token in /
token out, prefix checks, drift counting, mask lengths, and zero gradient on environment tokens."""

from __future__ import annotations

import pytest
import torch
from env_stubs import SENTINEL_TEXT, encode_action, tool_task

from tether.algos import agg_loss, compute_agg_norm
from tether.train.batching import build_records, build_sequences, pad_records
from tether.config import EnvConfig, SamplingConfig
from tether.rollout.episodes import EpisodeRollout
from tether.policy.chat import (
    Message,
    TokenizationDrift,
    compute_context_ids,
    compute_segments,
    is_prefix_preserving,
)
from tether.policy.hf import compute_logprobs
from tether.tasks import make_problems

SAMPLING = SamplingConfig(max_new_tokens=64)


def non_canonical_ids(tok, text: str, word: str) -> list[int]:
    """ids of `text` with `word` spelled one byte-token per character: decodes to `text`, but
    encode(decode(ids)) != ids (the rllm PR#272 situation, built with the tiny BPE)."""
    before, after = text.split(word, 1)
    chars = [tok.convert_tokens_to_ids(c) for c in word]
    ids = encode_action(tok, before, stop=False) + chars + encode_action(tok, after, stop=False)
    assert tok.decode(ids) == text
    assert list(tok(text, add_special_tokens=False)["input_ids"]) != ids
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")]


def test_tiny_chatml_template_is_prefix_preserving(env_tokenizer):
    assert is_prefix_preserving(env_tokenizer) == (True, "ok")


def test_history_rewriting_template_is_detected(env_tokenizer):
    tok = _rewriting_tokenizer(env_tokenizer)
    ok, why = is_prefix_preserving(tok)
    assert not ok and "changes earlier text" in why


def _rewriting_tokenizer(tok):
    """A copy whose generation prompt opens an empty think block that earlier assistant turns do
    not get when rendered as history (as Qwen3's template with thinking off): the rendered
    history does not extend the text the model was prompted with."""
    import copy

    bad = copy.deepcopy(tok)
    bad.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think></think>' }}{% endif %}"
    )
    return bad


def test_segments_splice_sampled_ids_verbatim(env_tokenizer):
    tok = env_tokenizer
    act = non_canonical_ids(tok, "Answer: 12", "Answer")
    msgs = [Message("user", "q"), Message("assistant", "Answer: 12", tuple(act)), Message("tool", "ok")]
    segs = compute_segments(tok, msgs, None, [tok.convert_tokens_to_ids("<|im_end|>")])
    assert [s.is_action for s in segs] == [False, True, False]
    assert segs[1].ids == tuple(act)
    # the sampled <|im_end|> closed the turn: the next piece starts right after it
    assert tok.decode(list(segs[2].ids)) == "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"


def test_non_retokenising_actions_round_trip_three_turns(env_policy, scripted):
    """The prefix/drift test: actions whose text does not re-tokenise to their ids keep their
    exact ids in every later context, the merged training sequence and the loss mask."""
    tok = env_policy.tokenizer
    actions = [
        non_canonical_ids(tok, '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "calculator"}}</tool_call>', "calculator"),
        non_canonical_ids(tok, '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "apples"}}</tool_call>', "apples"),
        non_canonical_ids(tok, "Answer: done", "Answer"),
    ]
    gen = scripted(lambda call, row, prompt: actions[call], env_policy.stop_ids)
    groups, m = EpisodeRollout(EnvConfig(max_turns=5), on_drift="fail").run(
        env_policy, [tool_task(0)], 1, SAMPLING, generate=gen)
    traj = groups[0].trajectories[0]
    assert traj.stop.value == "done" and traj.reward.total == 1.0
    assert [list(t.action_ids) for t in traj.turns] == actions
    for k in range(1, 3):  # each context extends the previous context + action, verbatim
        prev = traj.turns[k - 1]
        assert traj.turns[k].context_ids[: len(prev.context_ids) + len(prev.action_ids)] == prev.context_ids + prev.action_ids
        assert gen.calls[k][0] == traj.turns[k].context_ids  # exactly what the model saw
    assert m["rollout/tokenization_drift_count"] == 0
    assert m["rollout/retokenize_mismatch_count"] == 3  # what a decode->encode framework would corrupt
    (seq,) = build_sequences(traj, 0, 0, True)
    assert len(seq.ids) == len(seq.loss_mask) == len(seq.rollout_logp) == len(seq.token_rewards) == len(seq.turn_ids)
    trained = [i for i, mk in zip(seq.ids, seq.loss_mask) if mk]
    assert trained == [t for a in actions for t in a]


def test_drift_is_counted_or_fails(env_policy, scripted):
    from tether.policy.hf import HFPolicy

    bad = HFPolicy(env_policy.model, _rewriting_tokenizer(env_policy.tokenizer), env_policy.stop_ids, env_policy.pad_id)
    tok = bad.tokenizer
    call = encode_action(tok, '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "a"}}</tool_call>')
    gen = scripted(lambda c, r, p: call if c == 0 else encode_action(tok, "done"), bad.stop_ids)
    groups, m = EpisodeRollout(EnvConfig(max_turns=3)).run(bad, [tool_task(0)], 1, SAMPLING, generate=gen)
    assert m["rollout/tokenization_drift_count"] == 1 and m["rollout/template_prefix_preserving"] == 0
    traj = groups[0].trajectories[0]
    assert len(build_sequences(traj, 0, 0, True)) == 2  # not an extension: trained as two exact samples
    gen = scripted(lambda c, r, p: call if c == 0 else encode_action(tok, "done"), bad.stop_ids)
    with pytest.raises(TokenizationDrift, match="on_drift=fail"):
        EpisodeRollout(EnvConfig(max_turns=3), on_drift="fail").run(bad, [tool_task(0)], 1, SAMPLING, generate=gen)


def test_sentinel_in_tool_turn_gets_exactly_zero_gradient(env_policy, scripted):
    """A token that only the tool wrote sits in the loss-masked region: its log-prob gets exactly
    zero gradient through compute_logprobs + agg_loss, while the actions get gradient."""
    tok = env_policy.tokenizer
    sentinel = tok.convert_tokens_to_ids(SENTINEL_TEXT)
    call = encode_action(tok, '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "x"}}</tool_call>')
    gen = scripted(lambda c, r, p: call if c == 0 else encode_action(tok, "done"), env_policy.stop_ids)
    groups, _ = EpisodeRollout(EnvConfig(max_turns=3)).run(env_policy, [tool_task(0)], 2, SAMPLING, generate=gen)
    p = pad_records(build_records(groups), env_policy.pad_id)
    pos = (p.input_ids_BT == sentinel).nonzero()
    assert len(pos) == 2 and not any(sentinel in t.action_ids for t in groups[0].trajectories[0].turns)
    assert p.loss_mask_BT[pos[:, 0], pos[:, 1]].sum() == 0
    logp, _ = compute_logprobs(env_policy, p.input_ids_BT, p.attention_mask_BT)
    logp.retain_grad()
    loss = agg_loss(-logp * 1.0, p.loss_mask_BT, "token_mean", compute_agg_norm(p.loss_mask_BT))
    loss.backward()
    assert torch.all(logp.grad[pos[:, 0], pos[:, 1]] == 0)
    assert torch.all(logp.grad[p.loss_mask_BT > 0] != 0)
    assert torch.all(logp.grad[p.loss_mask_BT == 0] == 0)
    env_policy.model.zero_grad(set_to_none=True)


def test_calc_contexts_fit_and_match_chat_template_rendering(env_policy):
    """Without sampled actions, the assembled ids are the tokenisation of the rendered template."""
    tok = env_policy.tokenizer
    task = make_problems("calc", 1, 3)[0]
    msgs = [Message("system", "s"), Message("user", task["prompt"])]
    ids = compute_context_ids(tok, msgs, None, env_policy.stop_ids)
    assert list(ids) == list(tok.apply_chat_template([m.to_dict() for m in msgs], add_generation_prompt=True,
                                                     tokenize=True)["input_ids"])


def test_end_of_turn_id_and_templates_that_hide_actions(env_tokenizer):
    import copy

    from tether.policy.chat import TemplateError, compute_end_of_turn_id

    tok = env_tokenizer
    eos, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert compute_end_of_turn_id(tok, [eos, im_end]) == im_end  # what the template writes after a turn
    hiding = copy.deepcopy(tok)
    hiding.chat_template = "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(TemplateError, match="verbatim"):
        compute_segments(hiding, [Message("user", "q"), Message("assistant", "a", (5,))], None, [im_end])


def test_drift_is_checked_for_every_builder_while_nothing_was_dropped(env_policy, scripted):
    from tether.config import ContextConfig
    from tether.policy.hf import HFPolicy

    bad = HFPolicy(env_policy.model, _rewriting_tokenizer(env_policy.tokenizer), env_policy.stop_ids, env_policy.pad_id)
    tok = bad.tokenizer
    call = encode_action(tok, '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "a"}}</tool_call>')
    gen = scripted(lambda c, r, p: call if c < 2 else encode_action(tok, "done"), bad.stop_ids)
    cfg = EnvConfig(max_turns=4, context=ContextConfig(builder="sliding_window", window=1))
    _, m = EpisodeRollout(cfg).run(bad, [tool_task(0)], 1, SAMPLING, generate=gen)
    # turn 1 kept everything (drift); turn 2 dropped turn 0 (a rebuild, not drift)
    assert m["rollout/tokenization_drift_count"] == 1 and m["rollout/context_rebuilds_count"] == 2
