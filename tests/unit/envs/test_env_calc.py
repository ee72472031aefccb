"""The calc environment (GSM8K-like word problems + calculator tool), its scripted expert, SFT
demonstrations from it, and multi-environment mixing."""

from __future__ import annotations

from collections import Counter

import pytest
from env_stubs import encode_action

from tether.train.batching import build_sequences
from tether.config import EnvConfig, SamplingConfig
from tether.envs import run_expert_episode
from tether.envs.builtin.calc import calc_expert, calculator, parse_answer
from tether.rollout.episodes import EpisodeRollout
from tether.rollout.demos import build_env_demo_records
from tether.policy.chat import Message
from tether.tasks import make_problems, make_splits


def test_tasks_are_deterministic_consistent_and_held_out():
    a, b = make_problems("calc", 50, 7), make_problems("calc", 50, 7)
    assert a == b and a != make_problems("calc", 50, 8)
    for p in a:
        x = calculator(p["steps"][0])  # the second step uses the first step's result
        assert x in p["steps"][1] and calculator(p["steps"][1]) == p["answer"] and int(p["answer"]) >= 0
        assert p["env"] == "calc"
    train, held = make_splits("calc", 100, 20, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_calculator_is_safe_and_exact():
    assert calculator("3*4+2") == "14" and calculator("7/2") == "3.5" and calculator("(2-5)*-2") == "6"
    for bad in ("__import__('os').system('true')", "a+1", "2**99999", "[1][0]", "1" * 300):
        with pytest.raises((ValueError, SyntaxError)):
            calculator(bad)
    assert parse_answer("so... Answer: 42") == "42" and parse_answer("it is 7 or 8") == "8" and parse_answer("none") is None


def test_expert_solves_every_problem():
    problems = make_problems("calc", 40, 1)
    finals = [run_expert_episode(p)[2] for p in problems]
    assert all(f.done and f.reward == 1.0 and f.info["correct"] for f in finals)


def test_expert_through_the_batched_rollout_succeeds(env_policy, scripted):
    tok = env_policy.tokenizer
    problems = make_problems("calc", 4, 2)
    histories = {}

    def act(call, row, prompt):
        text = tok.decode(list(prompt))
        task = next(p for p in problems if p["prompt"] in text)
        seen = histories.setdefault(task["id"], [])
        reply = calc_expert(task, [Message("tool", "r")] * len(seen))
        seen.append(reply)
        return encode_action(tok, reply)

    gen = scripted(act, env_policy.stop_ids)
    groups, m = EpisodeRollout(EnvConfig()).run(
        env_policy, problems, 1, SamplingConfig(max_new_tokens=64), generate=gen)
    assert m["env/success_rate"] == 1.0 and m["env/stop/done"] == 1.0 and m["env/turns_mean"] == 3
    assert m["env/tool_calls"] == 8 and m["env/tool_errors"] == 0
    assert [len(c) for c in gen.calls] == [4, 4, 4]


def test_sft_demo_is_the_rollout_sequence_with_loss_on_assistant_tokens(env_policy, scripted):
    tok = env_policy.tokenizer
    task = make_problems("calc", 1, 3)[0]
    (demo,) = build_env_demo_records(env_policy, [task])
    history, _, _ = run_expert_episode(task)
    actions = [encode_action(tok, m.content) for m in history if m.role == "assistant"]
    trained = [i for i, mk in zip(demo.ids, demo.loss_mask) if mk]
    assert trained == [t for a in actions for t in a]  # each action and its <|im_end|>, nothing else
    assert len(demo.ids) == len(demo.loss_mask) == len(demo.rollout_logp)
    gen = scripted(lambda c, r, p: actions[c], env_policy.stop_ids)
    groups, _ = EpisodeRollout(EnvConfig()).run(
        env_policy, [task], 1, SamplingConfig(max_new_tokens=64), generate=gen)
    (seq,) = build_sequences(groups[0].trajectories[0], 0, 0, True)
    assert demo.ids[: len(seq.ids)] == seq.ids and demo.loss_mask[: len(seq.ids)] == seq.loss_mask
    assert tok.decode(list(demo.ids[len(seq.ids):])) == "\n"  # the template's close after the last turn


def test_env_mix_draws_environments_by_weight():
    kw = {"envs": [{"name": "calc", "weight": 3}, {"name": "_test_tools", "weight": 1, "kwargs": {"x": 1}}]}
    problems = make_problems("env_mix", 400, 0, kw)
    counts = Counter(p["env"] for p in problems)
    assert 0.68 < counts["calc"] / 400 < 0.82 and counts["_test_tools"] + counts["calc"] == 400
    assert all(p.get("x") == 1 for p in problems if p["env"] == "_test_tools")
    with pytest.raises(ValueError, match="weights"):
        make_problems("env_mix", 2, 0, {"envs": [{"name": "calc", "weight": -1}]})
