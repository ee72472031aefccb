"""The OpenAI-compatible rollout endpoint (tether.serve.endpoint) through the official `openai` client,
and the black-box agent harness (tether.rollout.harness) that trains on what it sampled."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from tether.train.batching import build_sequences  # noqa: E402
from tether.config import RewardConfig, SamplingConfig  # noqa: E402
from tether.rollout.harness import HarnessRollout, parse_agent_output  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.policy.hf import load_policy  # noqa: E402
from tether.serve.endpoint import RolloutServer  # noqa: E402
from tether.types import Outcome  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate arithmetic",
                                           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
SAMPLING = SamplingConfig(max_new_tokens=8)
TINY_RUN = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false", "run.threads=1",
            "checkpoint.every=0", "data.task=arith", "data.train_size=16", "data.eval_size=2", "eval.samples=1",
            "rollout.problems_per_step=1", "rollout.n=2", "rollout.sampling.max_new_tokens=4",
            "eval.sampling.max_new_tokens=4", "reward.isolation=inline"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = build_family_model("qwen2", tmp_path_factory.mktemp("qwen2"), shape=family_shape(hidden_size=32, intermediate_size=64))
    return load_policy(path)


@pytest.fixture(scope="module")
def server(policy):
    with RolloutServer(policy, SAMPLING, seed=0) as s:
        yield s


def test_chat_with_tools_returns_sampled_ids_logprobs_and_version(server, policy):
    client = openai.OpenAI(base_url=server.episode_url("chat-1"), api_key=server.api_key)
    r = client.chat.completions.create(model="tether", messages=[{"role": "user", "content": "What is 2+3?"}],
                                       tools=TOOLS, logprobs=True, max_tokens=6, temperature=1.0)
    choice = r.choices[0]
    ids = choice.token_ids
    assert 1 <= len(ids) <= 6 and r.policy_version == policy.version and r.episode_id == "chat-1"
    (turn,) = server.pop_episode("chat-1")
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(list(turn.action_logprobs))
    assert list(turn.action_ids) == ids and list(turn.context_ids) == r.prompt_token_ids
    assert all(lp <= 0 for lp in turn.action_logprobs) and r.usage.completion_tokens == len(ids)
    rendered = policy.tokenizer.decode(r.prompt_token_ids)
    assert "<tools>" in rendered and '"calculator"' in rendered  # the tools went through the family template
    # the returned ids are what the model sampled: a full forward pass over prompt + ids gives the same log-probs
    full = torch.tensor([r.prompt_token_ids + ids])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(full).logits[0].float(), -1)
    start = len(r.prompt_token_ids) - 1
    recomputed = [logp[start + i, t].item() for i, t in enumerate(ids)]
    assert recomputed == pytest.approx([t.logprob for t in choice.logprobs.content], abs=1e-3)


def test_binds_loopback_by_default_and_a_config_off_loopback_needs_a_token(server):
    from tether.config import ConfigError, load_config

    assert server.host == "127.0.0.1" and server.base_url.startswith("http://127.0.0.1:")
    assert load_config(None, []).harness.host == "127.0.0.1" and HarnessRollout(["x"], RewardConfig()).host == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"harness.host='0.0.0.0' is not loopback: set harness.token"):
        load_config(None, ["harness.host=0.0.0.0", "harness.command=[agent]"])
    assert load_config(None, ["harness.host=0.0.0.0", "harness.token=s3cret"]).harness.token == "s3cret"


def test_a_truncated_request_records_its_sampling_mask_on_the_turn(server, policy):
    """Issue 13: a request with top_p samples from a truncated distribution; the turn keeps the
    kept-token counts so that the trainer scores under the same truncation (keep_mask)."""
    client = openai.OpenAI(base_url=server.episode_url("topp-1"), api_key=server.api_key)
    r = client.chat.completions.create(model="tether", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                       temperature=1.0, top_p=0.5)
    (turn,) = server.pop_episode("topp-1")
    vocab = policy.model.config.vocab_size
    assert len(turn.action_kept) == len(turn.action_ids) == len(r.choices[0].token_ids)
    assert all(1 <= k < vocab for k in turn.action_kept)  # a real truncation, not the full vocabulary
    client.chat.completions.create(model="tether", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                   extra_body={"episode_id": "full-1"})
    assert server.pop_episode("full-1")[0].action_kept == ()  # no filter: nothing to record


def test_completions_with_logprobs_and_token_prompt(server, policy):
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
    prompt = policy.tokenizer("12+30=", add_special_tokens=False)["input_ids"]
    r = client.completions.create(model="tether", prompt=prompt, max_tokens=5, logprobs=1,
                                  extra_body={"episode_id": "cmp-1"})
    c = r.choices[0]
    (turn,) = server.pop_episode("cmp-1")
    assert list(turn.context_ids) == prompt and c.token_ids == list(turn.action_ids)
    assert c.logprobs.token_logprobs == pytest.approx(list(turn.action_logprobs))
    assert "".join(c.logprobs.tokens) == policy.tokenizer.decode(c.token_ids)
    g1 = client.completions.create(model="tether", prompt="12+30=", max_tokens=5, temperature=0)
    g2 = client.completions.create(model="tether", prompt="12+30=", max_tokens=5, temperature=0)
    assert g1.choices[0].token_ids == g2.choices[0].token_ids  # temperature 0 is greedy


def test_second_turn_splices_the_sampled_ids_verbatim(server):
    client = openai.OpenAI(base_url=server.episode_url("multi"), api_key=server.api_key)
    msgs = [{"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model="tether", messages=msgs, max_tokens=6)
    msgs += [first.choices[0].message.model_dump(exclude_none=True, exclude={"token_ids"}),
             {"role": "user", "content": "and again"}]
    second = client.chat.completions.create(model="tether", messages=msgs, max_tokens=6)
    a, b = server.pop_episode("multi")
    assert b.context_ids[: len(a.context_ids) + len(a.action_ids)] == a.context_ids + a.action_ids
    assert list(b.action_ids) == second.choices[0].token_ids
    before = server.template_mismatches
    client.chat.completions.create(model="tether", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    client.chat.completions.create(model="tether", max_tokens=3, messages=[
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "rewritten by the agent"}])
    assert server.template_mismatches == before + 1  # an edited assistant turn is rendered as text and counted
    server.pop_episode("multi")


def test_token_is_required_off_loopback_and_enforced(policy):
    with pytest.raises(ValueError, match="not a loopback address: set a token"):
        RolloutServer(policy, SAMPLING, host="0.0.0.0")
    with RolloutServer(policy, SAMPLING, token="s3cret") as s:
        bad = openai.OpenAI(base_url=s.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="tether", prompt="1", max_tokens=2)
        good = openai.OpenAI(base_url=s.base_url, api_key="s3cret")
        assert good.completions.create(model="tether", prompt="1", max_tokens=2).choices[0].token_ids


def test_bad_requests_are_400_not_crashes(server):
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.completions.create(model="tether", prompt="1", max_tokens=2, n=2)
    with pytest.raises(openai.BadRequestError, match="prompt must be"):
        client.completions.create(model="tether", prompt=[["a"]], max_tokens=2)


AGENT = '''
import json, os, sys
from openai import OpenAI
task = json.loads(os.environ["TETHER_TASK"])
assert "answer" not in task
if task.get("crash"):
    sys.exit(3)
client = OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the harness
msgs = [{"role": "user", "content": task["prompt"]}]
r = client.chat.completions.create(model="tether", messages=msgs, max_tokens=4)
msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "sure?"}]
r = client.chat.completions.create(model="tether", messages=msgs, max_tokens=4)
print("thinking...")
print(json.dumps({"answer": r.choices[0].message.content}))
'''


@pytest.mark.slow
def test_harness_runs_a_black_box_agent_and_trains_on_its_sampled_tokens(policy, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(AGENT))
    rollout = HarnessRollout([sys.executable, str(agent)], RewardConfig(isolation="inline"), timeout_s=120,
                             concurrency=4)
    problems = [{"id": "p0", "prompt": "1+1=", "answer": "2"}, {"id": "p1", "prompt": "2+2=", "answer": "4", "crash": 1}]
    groups, m = rollout.run(policy, problems, 2, SAMPLING)
    ok, crashed = groups
    for traj in ok.trajectories:
        assert len(traj.turns) == 2 and traj.reward.outcome is Outcome.OK and traj.stop.value in ("done", "length")
        (seq,) = build_sequences(traj, 0, 0, True)  # the second call extended the first: one training sequence
        assert [i for i, k in zip(seq.ids, seq.loss_mask) if k] == [*traj.turns[0].action_ids, *traj.turns[1].action_ids]
    for traj in crashed.trajectories:
        assert traj.reward.outcome is Outcome.ERROR and "exited with 3" in traj.reward.error and not traj.turns
    assert m["harness/error_rate"] == 0.5 and m["harness/calls_mean"] == 1.0


def test_the_shipped_agent_plays_one_episode(server, policy):
    """configs/agents/complete_agent.py (the harness benchmark's agent) against the endpoint."""
    from pathlib import Path

    from tether.rollout.harness import run_agent
    from tether.policy.chat import decode_completion

    agent = Path(__file__).resolve().parents[3] / "configs" / "agents" / "complete_agent.py"
    res = run_agent([sys.executable, str(agent)], {"prompt": "12+30=", "answer": "42"}, server.episode_url("shipped"),
                    server.api_key, "shipped", 60)
    assert res.outcome is Outcome.OK and res.error == "", res.error
    (turn,) = server.pop_episode("shipped")
    assert res.answer == decode_completion(policy.tokenizer, turn.action_ids, policy.stop_ids)


def test_agent_output_protocol():
    assert parse_agent_output('log\n{"reward": 0.5}\n') == (0.5, None)
    assert parse_agent_output('{"answer": 42}') == (None, "42")
    assert parse_agent_output("a\nAnswer: 7\n\n") == (None, "Answer: 7")
    with pytest.raises(ValueError, match="printed nothing"):
        parse_agent_output("\n")


@pytest.mark.slow
def test_tether_train_with_a_harness_command(tmp_path):
    import json

    from typer.testing import CliRunner

    from tether.cli import app

    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(AGENT))
    cfg = tmp_path / "h.yaml"
    cfg.write_text(f"harness:\n  command: [{sys.executable!r}, {str(agent)!r}]\n  concurrency: 4\n")
    rd = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", str(cfg), *TINY_RUN, "train.steps=2", "--run-dir", str(rd)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "pg_loss" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert all(row["harness/calls_mean"] == 2.0 and row["harness/error_rate"] == 0.0 for row in trained)


@pytest.mark.slow
def test_a_harness_that_always_fails_stops_the_run_naming_the_cause(tmp_path):
    from typer.testing import CliRunner

    from tether.cli import app

    cfg = tmp_path / "h.yaml"
    cfg.write_text(f"harness:\n  command: [{sys.executable!r}, '-c', 'import sys; sys.exit(7)']\n")
    r = CliRunner().invoke(app, ["train", str(cfg), *TINY_RUN, "train.steps=1", "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 1 and "harness: 100% of the agent runs failed" in r.output and "exited with 7" in r.output


def test_tool_call_round_trip_keeps_the_sampled_ids(policy, monkeypatch):
    """The model calls a tool: the response carries OpenAI tool_calls; the agent sends them back
    with the tool's result, and the next context holds the sampled ids verbatim (no mismatch)."""
    import tether.serve.endpoint
    from tether.types import Sample, StopReason

    tok = policy.tokenizer
    call_ids = tok('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>',
                   add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    answer_ids = tok("Answer: 5", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    script = iter([call_ids, answer_ids])

    def scripted(pol, prompts, sampling, generator=None, batch_size=256, greedy=False):
        ids = next(script)
        return [Sample(tuple(p), tuple(ids), tuple(-0.25 for _ in ids), StopReason.EOS, pol.version) for p in prompts]

    monkeypatch.setattr(tether.serve.endpoint, "run_generate", scripted)
    with RolloutServer(policy, SAMPLING) as s:
        client = openai.OpenAI(base_url=s.episode_url("tools"), api_key=s.api_key)
        msgs = [{"role": "user", "content": "What is 2+3?"}]
        first = client.chat.completions.create(model="tether", messages=msgs, tools=TOOLS)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "calculator" and call.function.arguments == '{"expression": "2+3"}'
        msgs += [choice.message.model_dump(exclude_none=True, exclude={"token_ids"}),
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        second = client.chat.completions.create(model="tether", messages=msgs, tools=TOOLS)
        assert second.choices[0].message.content == "Answer: 5" and s.template_mismatches == 0
        a, b = s.pop_episode("tools")
    assert list(a.action_ids) == call_ids and list(b.action_ids) == answer_ids
    assert b.context_ids[: len(a.context_ids) + len(a.action_ids)] == a.context_ids + a.action_ids
    assert "<tool_response>\n5\n</tool_response>" in tok.decode(list(b.context_ids[len(a.context_ids):]))
