"""The verifiers adapter against the real `verifiers` package (0.2-0.3: `vf.SingleTurnEnv`,
`vf.MultiTurnEnv`, `vf.Rubric`, built in vf_real_env.py from a local datasets.Dataset): the
environment runs its own rollout loop against tether's endpoint, its rubric is the reward, and
tether trains on exactly the tokens it sampled.

verifiers is not in the dev extra (0.2-0.3 pin mcp<2, 0.4 pins openai<3 and mcp 2.0 and has no
Environment/Rubric stack), so these tests skip where it is not installed (docs/byo.md says how
to install it alongside tether)."""

from __future__ import annotations

import json

import pytest

vf = pytest.importorskip("verifiers")
try:
    vf.SingleTurnEnv, vf.MultiTurnEnv, vf.Rubric  # noqa: B018
except AttributeError:
    pytest.skip(f"verifiers {vf.__version__} has no Environment/Rubric stack (0.4 moved to verifiers.v1)",
                allow_module_level=True)
pytest.importorskip("fastapi")

from tether.train.batching import build_sequences  # noqa: E402
from tether.config import load_config  # noqa: E402
from tether.rollout.harness import HarnessRollout  # noqa: E402
from tether.policy.chat import decode_completion  # noqa: E402
from tether.policy.families import build_family_model, family_shape  # noqa: E402
from tether.policy.hf import load_policy  # noqa: E402
from tether.train.setup import setup_problems  # noqa: E402
from tether.rollout import make_rollout  # noqa: E402

import vf_real_env  # noqa: E402  (tests/unit/envs, on sys.path as for vf_env_stub)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = ["Answer with one word. Name a fruit like apple banana cherry dates elder figs grape honey. "
              "Are you sure?"] * 20
    return build_family_model("qwen2", tmp_path_factory.mktemp("m"), corpus, family_shape(hidden_size=32, intermediate_size=64))


def _config(model_dir, kind, *extra):
    kwargs = json.dumps({"env": "vf_real_env", "args": {"kind": kind}})
    return load_config(None, [f"model.path={model_dir}", "data.task=verifiers", f"data.task_kwargs={kwargs}",
                              "data.train_size=8", "data.eval_size=2", "harness.concurrency=4",
                              "rollout.sampling.max_new_tokens=6", "eval.sampling.max_new_tokens=6", *extra])


@pytest.mark.parametrize("kind,turns", [("single", 1), ("multi", 2)])
def test_a_real_env_plays_its_own_loop_through_the_endpoint_scored_by_its_rubric(model_dir, kind, turns):
    cfg = _config(model_dir, kind)
    rollout = make_rollout(cfg)
    assert isinstance(rollout, HarnessRollout) and rollout.agent is not None
    train, _ = setup_problems(cfg.data)
    policy = load_policy(model_dir)
    groups, m = rollout.run(policy, train[:2], 2, cfg.rollout.sampling)
    assert m["harness/error_rate"] == 0.0 and m["harness/calls_mean"] == turns
    assert m["harness/template_mismatches"] == 0  # verifiers sent back what tether sampled: spliced as ids
    for g in groups:
        for traj in g.trajectories:
            assert len(traj.turns) == turns
            (seq,) = build_sequences(traj, 0, 0, True)  # a later turn extends the earlier: one training sequence
            assert [i for i, k in zip(seq.ids, seq.loss_mask) if k] == [t for x in traj.turns for t in x.action_ids]
            reply = [{"role": "assistant",
                      "content": decode_completion(policy.tokenizer, traj.turns[-1].action_ids, policy.stop_ids)}]
            expected = vf_real_env.has_letter(reply, g.task["answer"]) + 0.5 * vf_real_env.short_reply(reply)
            assert traj.reward.total == pytest.approx(expected)  # the rubric, on the reply tether sampled


def test_a_real_tool_env_calls_its_tool_and_the_context_keeps_the_sampled_ids(model_dir, monkeypatch):
    """vf.ToolEnv: the (scripted) model calls the calculator in Qwen's markup; the endpoint hands
    verifiers OpenAI tool_calls, verifiers runs its tool and sends the result back, and the next
    context is the sampled ids verbatim plus the family's <tool_response> block."""
    import tether.serve.endpoint
    from tether.types import Sample, StopReason

    cfg = _config(model_dir, "tool")
    train, _ = setup_problems(cfg.data)
    task = train[0]
    a, b = task["prompt"].removeprefix("What is ").rstrip("?").split("+")
    policy = load_policy(model_dir)
    tok = policy.tokenizer
    end = [tok.convert_tokens_to_ids("<|im_end|>")]
    call = tok('<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s+%s"}}\n</tool_call>' % (a, b),
               add_special_tokens=False)["input_ids"] + end
    answer = tok(f"Answer: {task['answer']}", add_special_tokens=False)["input_ids"] + end
    script = iter([call, answer])

    def scripted(pol, prompts, sampling, generator=None, batch_size=256, greedy=False):
        ids = next(script)
        return [Sample(tuple(p), tuple(ids), tuple(-0.5 for _ in ids), StopReason.EOS, pol.version) for p in prompts]

    monkeypatch.setattr(tether.serve.endpoint, "run_generate", scripted)
    (group,), m = make_rollout(cfg).run(policy, [task], 1, cfg.rollout.sampling)
    (traj,) = group.trajectories
    assert m["harness/error_rate"] == 0.0 and m["harness/template_mismatches"] == 0
    assert traj.reward.total == 1.0 and [list(t.action_ids) for t in traj.turns] == [call, answer]
    first, second = traj.turns
    assert second.context_ids[: len(first.context_ids) + len(call)] == first.context_ids + first.action_ids
    tail = tok.decode(list(second.context_ids[len(first.context_ids) + len(call):]))
    assert f"<tool_response>\n{task['answer']}\n</tool_response>" in tail  # verifiers ran the calculator
    assert '"calculator"' in tok.decode(list(first.context_ids))  # its tool schema went through the template


@pytest.mark.slow
def test_a_real_multi_turn_env_trains_end_to_end(model_dir, tmp_path):
    from tether.recipes.rl import run_rl

    cfg = _config(model_dir, "multi", "train.steps=2", "rollout.n=2", "rollout.problems_per_step=2",
                  "eval.samples=1", "logging.progress=false", "logging.tensorboard=false", "run.threads=1",
                  "checkpoint.every=0", "train.lr=1e-3")
    summary = run_rl(cfg, tmp_path / "rl")
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "pg_loss" in r]
    assert summary["steps"] == 2 and [r["step"] for r in trained] == [1, 2]
    assert all(r["harness/calls_mean"] == 2.0 and r["harness/error_rate"] == 0.0 for r in trained)
    assert all(r["pg_loss"] == r["pg_loss"] for r in trained) and summary["final_eval"]["eval/problems"] == 2.0
