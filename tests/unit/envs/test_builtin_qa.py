"""The multi-hop QA environment (HotpotQA-like): the synthetic corpus, BM25 search, the expert,
its weak-teacher mistakes, and the batched rollout."""

from __future__ import annotations

import random

from builtin_helpers import run_expert_rollouts

from tether.envs import Action, make_env, parse_tool_calls, run_expert_episode
from tether.envs.builtin.qa import COUNTRIES, build_world, parse_answer, qa_expert, run_search
from tether.tasks import make_problems, make_splits


def _act(env, text: str):
    return env.step(Action(text=text, parsed=parse_tool_calls(text)))


def test_tasks_are_deterministic_and_held_out():
    a, b = make_problems("qa", 40, 3), make_problems("qa", 40, 3)
    assert a == b and a != make_problems("qa", 40, 4)
    assert all(p["env"] == "qa" and len(p["queries"]) == 2 for p in a)
    assert {len(p["queries"]) for p in make_problems("qa", 60, 0, {"hops": [2, 3]})} == {2, 3}
    train, held = make_splits("qa", 300, 40, 0)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}


def test_bm25_ranks_each_passage_first_for_its_title():
    world = build_world()
    assert len(world.passages) == 400 + 16 + 12
    for title, text in world.passages:
        assert run_search(title)[0] == f"{title}: {text}"
    assert len(run_search("Seville Spain", top_k=3)) == 3
    assert run_search("the of and") == []  # stop words only


def test_expert_solves_every_question_and_the_chain_is_in_the_corpus():
    for p in make_problems("qa", 60, 1, {"hops": [2, 3]}):
        history, _, last = run_expert_episode(p)
        assert last.done and last.reward == 1.0 and last.info["correct"]
        results = [m.content for m in history if m.role == "tool"]
        assert len(results) == len(p["queries"])
        for r, nxt in zip(results, [*p["queries"][1:], p["answer"]]):
            assert nxt in r  # each hop's passage names the next entity


def test_weak_teacher_answers_with_an_entity_it_read_but_the_wrong_one():
    problems = make_problems("qa", 80, 2)
    rng = random.Random(0)
    wrong = [run_expert_episode(p, noise=1.0, rng=rng) for p in problems]
    assert not any(last.info["correct"] for _, _, last in wrong)
    answers = [last.info["answer"] for _, _, last in wrong]
    assert all(a in [d.lower() for d in p["distractors"]] for a, p in zip(answers, problems))  # read, but wrong
    # the searches before the slip are the expert's
    assert all(sum(m.role == "tool" for m in h) == 2 for h, _, _ in wrong)
    rng = random.Random(1)
    some = [run_expert_episode(p, noise=0.3, rng=rng)[2].info["correct"] for p in problems]
    assert 0.5 < sum(some) / len(some) < 0.95


def test_env_scores_answers_and_contains_bad_calls():
    task = make_problems("qa", 1, 5)[0]
    env = make_env(task)
    env.reset()
    res = _act(env, '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % task["queries"][0])
    assert not res.done and res.info["tool_calls"] == 1 and task["queries"][1] in res.observation.messages[0].content
    bad = _act(env, '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call><tool_call>{oops</tool_call>')
    assert not bad.done and bad.info["tool_errors"] == 1 and bad.info["parse_errors"] == 1
    assert [m.content.startswith("error") for m in bad.observation.messages] == [True, True]
    assert _act(env, f"It is {task['answer'].upper()}.").reward == 0.0  # no "Answer:" -> whole reply compared
    env2 = make_env(task)
    env2.reset()
    assert _act(env2, f"Answer: {task['answer'].lower()}!").info["correct"]
    assert parse_answer("Answer: New  York.") == "new york" and parse_answer("   ") is None
    assert all(c in build_world().city_country.values() for c in COUNTRIES)


def test_expert_through_the_batched_rollout(env_policy, scripted):
    problems = make_problems("qa", 4, 6, {"hops": [2, 3]})
    groups, m = run_expert_rollouts(env_policy, scripted, problems)
    assert m["env/success_rate"] == 1.0 and m["env/stop/done"] == 1.0
    assert m["env/tool_calls"] == sum(len(p["queries"]) for p in problems) and m["env/tool_errors"] == 0
    assert all(len(g.trajectories[0].turns) == len(g.task["queries"]) + 1 for g in groups)


def test_expert_reads_its_progress_from_the_history():
    task = make_problems("qa", 1, 7)[0]
    assert '"query": "%s"' % task["queries"][0] in qa_expert(task, [])


def test_qa_summary_lists_the_passages_found_once_without_the_queries():
    from tether.envs.builtin.qa import search_call, summarize_qa_facts
    from tether.types import Message

    msgs = [Message("assistant", search_call("Ann Lee")), Message("tool", "Ann Lee: born in Seville, works for Zentra."),
            Message("assistant", search_call("zzz")), Message("tool", "no results"),
            Message("assistant", search_call("Seville")), Message("tool", "Seville: a city in Spain.\nAnn Lee: born in Seville, works for Zentra.")]
    assert summarize_qa_facts(msgs) == "found: Ann Lee: born in Seville, works for Zentra. | Seville: a city in Spain."
    assert summarize_qa_facts(msgs[:1]) == "found: nothing yet"
    assert "search" not in summarize_qa_facts(msgs)  # the tool calls themselves are dropped
