"""Bad requests to the OpenAI-compatible rollout endpoint (tether.serve.endpoint, tether.serve.schema):
each is an HTTP 400 whose `param` and message name the field, never a 500 or a traceback in the
training log, and the server serves the next request (docs/errors.md, "The rollout endpoint")."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")

from tether.config import SamplingConfig  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.policy.hf import load_policy  # noqa: E402
from tether.serve.endpoint import RolloutServer  # noqa: E402

USER = {"role": "user", "content": "2+2="}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_family_model("qwen2", tmp_path_factory.mktemp("qwen2"),
                              shape=family_shape(hidden_size=32, intermediate_size=64, max_position_embeddings=64))
    with RolloutServer(load_policy(path), SamplingConfig(max_new_tokens=2), seed=0) as s:
        yield s


@dataclass
class Reply:
    status_code: int
    text: str

    def json(self):
        return json.loads(self.text)


def post(server, route: str, body) -> Reply:
    """A raw POST (the body as given: the openai client would refuse to send most of these)."""
    url = urlsplit(server.base_url + route)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", url.path, body=body if isinstance(body, bytes) else json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return Reply(r.status, r.read().decode())


CHAT_CASES = [  # (body, the param the refusal names, a phrase of the message)
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "field required"),  # accepted and trained before
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "input should be"),
    ({"messages": "hello"}, "messages", "valid array"),  # a 500 (AttributeError) before
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content",
     "text"),
    ({"messages": [{"role": "user"}]}, "messages[0]", "needs content"),
    ({"messages": []}, "messages", "at least 1"),
    ({}, "messages", "field required"),
    ({"messages": [USER], "n": 2}, "n", "n must be 1"),
    ({"messages": [USER], "stream": "yes"}, "stream", "valid boolean"),
    ({"messages": [USER], "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage",
     "valid boolean"),
    ({"messages": [USER], "stop": ["\n"]}, "stop", "not supported"),
    ({"messages": [USER], "temperature": "hot"}, "temperature", "valid number"),
    ({"messages": [USER], "temperature": 7}, "temperature", "less than or equal to 2"),
    ({"messages": [USER], "top_p": 0}, "top_p", "greater than 0"),
    ({"messages": [USER], "max_tokens": 0}, "max_tokens", "greater than 0"),
    ({"messages": [USER], "max_tokens": 1.5}, "max_tokens", "valid integer"),
    ({"messages": [USER], "logprobs": "yes"}, "logprobs", "valid boolean"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "field required"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}]},
     "messages[0].tool_calls[0].function.arguments", "valid string"),
    ({"messages": [{"role": "user", "content": "x " * 200}]}, "messages", "no room to sample"),
]


@pytest.mark.parametrize("body,param,phrase", CHAT_CASES, ids=[c[1] + ":" + c[2] for c in CHAT_CASES])
def test_bad_chat_requests_are_400_naming_the_field(bad_input, server, capfd, body, param, phrase):
    r = post(server, "/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param + ":"), err
    assert err["type"] == "invalid_request_error"
    bad_input.check(err["message"], param, phrase, output=capfd.readouterr().out)  # and no traceback in the log


COMPLETION_CASES = [
    ({"prompt": [["a"]]}, "prompt", "string or a list of token ids"),
    ({"prompt": ["a", "b"]}, "prompt", "string or a list of token ids"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": [-1, 2]}, "prompt", ">= 0"),
    ({"prompt": [1, 10 ** 6]}, "prompt[1]", "not in the vocabulary"),  # an index error in the sampler before
    ({"prompt": "1+1=", "echo": True}, "echo", "not supported"),
    ({"prompt": "1+1=", "logprobs": 9}, "logprobs", "less than or equal to 5"),
    ({"prompt": "1+1=", "best_of": 3}, "best_of", "best_of must be 1"),
    ({"prompt": "1+1=", "n": 2}, "n", "n must be 1"),
]


@pytest.mark.parametrize("body,param,phrase", COMPLETION_CASES, ids=[c[1] + ":" + c[2] for c in COMPLETION_CASES])
def test_bad_completion_requests_are_400_naming_the_field(bad_input, server, body, param, phrase):
    r = post(server, "/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    bad_input.check(err["message"], param, phrase)


@pytest.mark.parametrize("raw,field,phrase", [
    (b"{not json", "body", "not valid JSON"), (b"", "body", "not valid JSON"), (b"[1, 2]", "body", "must be a JSON object"),
    (b'{"prompt": "\xff"}', "body", "not UTF-8"), (b'{"prompt": "x", "temperature": NaN}', "temperature", "finite number")])
def test_a_body_that_is_not_a_json_object_is_400(bad_input, server, raw, field, phrase):
    r = post(server, "/completions", raw)
    assert r.status_code == 400, r.text
    bad_input.check(r.json()["error"]["message"], field, phrase)


def test_the_server_serves_after_bad_requests_and_the_good_ones_still_work(bad_input, server):
    for body, param, phrase in CHAT_CASES[:5]:
        bad_input.check(post(server, "/chat/completions", body).json()["error"]["message"], param, phrase)
    r = post(server, "/chat/completions", {"messages": [USER], "max_tokens": 2, "user": "ignored-field"})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"]
    r = post(server, "/completions", {"prompt": "1+1=", "max_tokens": 2, "logprobs": 1})
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) >= 1
