"""Property-based tests (hypothesis, bounded) of the endpoint's request parser and the agent-output
parser: no generated input crashes them (or the server), and every refusal names its field."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")

from tether.rollout.agent_io import AgentOutputError, AgentProcess, parse_agent_output, parse_result_object  # noqa: E402
from tether.serve.schema import ChatRequest, CompletionRequest, RequestError, parse_request  # noqa: E402
from test_byo_endpoint_requests import post, server  # noqa: E402,F401  (the raw-POST helper and a served tiny model)

# Bounded for CI and derandomized (the same examples on every run, no example database written).
BOUNDED = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                          max_leaves=8)
roles = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer", "bot", ""]), json_leaf)
message = st.fixed_dictionaries({}, optional={"role": roles, "content": json_value, "tool_calls": json_value,
                                              "name": json_value})
chat_body = st.fixed_dictionaries({}, optional={
    "messages": st.one_of(st.lists(message, max_size=3), json_value), "temperature": json_leaf, "top_p": json_leaf,
    "max_tokens": json_leaf, "n": json_leaf, "stream": json_leaf, "stop": json_value, "tools": json_value,
    "logprobs": json_leaf, "episode_id": json_leaf, "model": json_leaf})
completion_body = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(json_value, st.lists(st.integers(-3, 2000), max_size=4)), "max_tokens": json_leaf,
    "logprobs": json_leaf, "echo": json_leaf, "best_of": json_leaf, "temperature": json_leaf})
FIELDS = {"messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stream", "stop", "tools",
          "logprobs", "top_logprobs", "episode_id", "model", "prompt", "echo", "best_of", "suffix"}


def _dump(body) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def _check_refusal(bad_input, err: RequestError) -> None:
    if err.param is not None:  # a field: it is one of the request's, and the message starts with it
        assert err.param.split("[")[0].split(".")[0] in FIELDS and str(err).startswith(err.param + ": ")
    bad_input.check(str(err), err.param or "body")  # else the body as a whole


@BOUNDED
@given(body=st.one_of(chat_body, json_value))
def test_the_chat_parser_accepts_or_names_the_field(bad_input, body):
    try:
        req = parse_request(_dump(body), ChatRequest)
    except RequestError as err:
        _check_refusal(bad_input, err)
        return
    assert req.messages and all(m.role in ("system", "developer", "user", "assistant", "tool") for m in req.messages)
    assert req.temperature is None or math.isfinite(req.temperature)


@BOUNDED
@given(body=st.one_of(completion_body, json_value), raw=st.binary(max_size=20))
def test_the_completion_parser_accepts_or_names_the_field(bad_input, body, raw):
    for payload in (_dump(body), raw):
        try:
            req = parse_request(payload, CompletionRequest)
        except RequestError as err:
            _check_refusal(bad_input, err)
            continue
        assert isinstance(req.prompt, str) and req.prompt or all(t >= 0 for t in req.prompt)


@BOUNDED
@given(out=st.one_of(st.binary(max_size=60), st.text(max_size=60), json_value.map(lambda v: json.dumps(v, allow_nan=True))))
def test_the_agent_output_parser_reads_or_refuses(bad_input, out):
    try:
        reward, answer = parse_agent_output(out)
    except AgentOutputError as err:
        assert str(err).startswith("the agent")
        bad_input.check(str(err), "the agent")  # one line that says what the agent did wrong
        return
    assert (reward is None) != (answer is None)
    assert reward is None or math.isfinite(reward)


@BOUNDED
@given(obj=json_value)
def test_a_persistent_result_line_reads_or_refuses(bad_input, obj):
    try:
        reward, answer = parse_result_object(obj)
    except AgentOutputError as err:
        bad_input.check(str(err), "the agent")
        return
    assert reward is None or math.isfinite(reward)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=st.one_of(chat_body, completion_body, json_value))
def test_no_generated_request_crashes_the_server(bad_input, server, body):
    for route in ("/chat/completions", "/completions"):
        r = post(server, route, _dump(body))
        assert r.status_code in (200, 400), r.text  # never a 500
        if r.status_code == 400:
            err = r.json()["error"]
            assert err["param"] is None or err["message"].startswith(err["param"] + ": ")
            bad_input.check(err["message"], err["param"] or "body")


def test_a_persistent_agent_that_answers_garbage_loses_only_that_episode(bad_input, tmp_path):
    """One process, three requests: a good line, a non-UTF-8 line, a line for another episode."""
    import sys
    import textwrap

    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent('''
        import json, sys
        for i, line in enumerate(sys.stdin):
            req = json.loads(line)
            if i == 1:
                sys.stdout.buffer.write(b"\\xff\\xfe\\n"); sys.stdout.flush(); continue
            eid = req["episode_id"] if i != 2 else "someone-else"
            print(json.dumps({"episode_id": eid, "answer": req["task"]["prompt"][::-1]}), flush=True)
    '''))
    proc = AgentProcess([sys.executable, str(script)], "k")
    try:
        results = [proc.play({"prompt": f"ab{i}"}, "http://127.0.0.1:9/v1", f"e{i}", 30) for i in range(4)]
    finally:
        proc.close()
    assert results[0].answer == "0ba" and results[3].answer == "3ba"
    bad_input.check(results[1].error, "not UTF-8")
    bad_input.check(results[2].error, "answered episode 'someone-else'")
