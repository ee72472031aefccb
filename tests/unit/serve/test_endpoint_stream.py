"""`stream: true` on the rollout endpoint (tether.serve.sse): the official openai client reassembles
the same completion it gets without streaming, with usage when asked, and the episode is captured
as usual (verifiers 0.4's agent programs always stream)."""

from __future__ import annotations

import openai
import pytest

from tether.config import SamplingConfig
from tether.policy.hf import load_policy
from tether.serve.endpoint import RolloutServer


@pytest.fixture(scope="module")
def server(tiny_dir):
    with RolloutServer(load_policy(tiny_dir), SamplingConfig(max_new_tokens=8)) as srv:
        yield srv


def test_streamed_chat_equals_the_plain_answer(server):
    client = openai.OpenAI(base_url=server.episode_url("s1"), api_key=server.api_key)
    msgs = [{"role": "user", "content": "hello"}]
    plain = client.chat.completions.create(model="tether", messages=msgs, temperature=0)
    chunks = list(client.chat.completions.create(model="tether", messages=msgs, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # the usage chunk comes last
    assert len(server.pop_episode("s1")) == 2  # both calls captured, token-exactly, as one episode


def test_streamed_completion(server):
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
    plain = client.completions.create(model="tether", prompt="abc", temperature=0)
    streamed = list(client.completions.create(model="tether", prompt="abc", temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text
