"""Real model families (tether.policy.families): tiny Llama 3, Qwen2.5, Qwen3 and Mistral models
with their own special tokens and tool-calling chat templates, loaded with from_pretrained,
through a 2-turn tool episode with the no-drift assertion, SFT, RL and a checkpoint reload."""

from __future__ import annotations
import json

import pytest
import torch
from tether.rollout.episodes import EpisodeRollout
from tether.train.batching import build_sequences
from tether.config import EnvConfig, SamplingConfig, load_config
import tether.envs  # noqa: F401  (registers the built-in environments)
from tether.envs.base import compute_corpus_text
from tether.io.checkpoint import find_latest_checkpoint
from tether.policy import lean_train
from tether.policy.chat import is_prefix_preserving, render_chat
from tether.policy.families import FAMILIES, build_family_model, family_shape, format_tool_call
from tether.policy.hf import load_policy
from tether.tasks import make_problems
from tether.types import Sample, StopReason

LEAN = {"llama": True, "qwen2": True, "qwen3": False, "mistral": True}  # qwen3's q/k norms: transformers' forward


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    problems = make_problems("calc", 24, 0)
    corpus = [compute_corpus_text(p) for p in problems]
    corpus += [format_tool_call(f, "calculator", {"expression": s}) for p in problems for s in p["steps"] for f in FAMILIES]
    root = tmp_path_factory.mktemp("families")
    return {f: build_family_model(f, root / f, corpus, family_shape(vocab_size=420, hidden_size=32, num_heads=4,
                                                                        intermediate_size=64), num_kv_heads=2) for f in FAMILIES}


class Scripted:
    """Stands in for the sampler: returns the family's token ids of a fixed action per turn."""

    def __init__(self, actions_by_turn):
        self.actions_by_turn = actions_by_turn
        self.calls: list[list[tuple[int, ...]]] = []

    def __call__(self, policy, prompts, sampling, generator=None, batch_size=256, greedy=False):
        ids = self.actions_by_turn[len(self.calls)]
        self.calls.append([tuple(p) for p in prompts])
        return [Sample(tuple(p), tuple(ids), tuple(-0.5 for _ in ids), StopReason.EOS) for p in prompts]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loads_with_the_family_class_tokens_and_template(family, family_dirs):
    from transformers import AutoConfig

    policy = load_policy(family_dirs[family])
    assert AutoConfig.from_pretrained(family_dirs[family]).model_type == family
    tok = policy.tokenizer
    spec = FAMILIES[family]
    assert {tok.convert_tokens_to_ids(t) for t in spec.stops} == set(policy.stop_ids)
    for t in (*spec.special, *spec.markup):  # every family token is one id, never split by the BPE
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    assert is_prefix_preserving(tok, [{"type": "function", "function": {"name": "f", "parameters": {}}}]) == (True, "ok")
    assert lean_train.supports(policy.model) is LEAN[family]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_turn_tool_episode_trains_on_exactly_the_sampled_tokens(family, family_dirs):
    policy = load_policy(family_dirs[family])
    tok = policy.tokenizer
    task = make_problems("calc", 1, 5)[0]
    eot = tok.convert_tokens_to_ids(FAMILIES[family].eos)  # the end-of-turn token the template writes
    call = format_tool_call(family, "calculator", {"expression": task["steps"][0]})
    actions = [tok(call, add_special_tokens=False)["input_ids"] + [eot],
               tok(f"Answer: {task['answer']}", add_special_tokens=False)["input_ids"] + [eot]]
    gen = Scripted(actions)
    groups, m = EpisodeRollout(EnvConfig(max_turns=4), on_drift="fail").run(
        policy, [task], 1, SamplingConfig(max_new_tokens=64), generate=gen)
    traj = groups[0].trajectories[0]
    assert len(traj.turns) == 2 and traj.stop.value == "done" and traj.reward.correct
    assert m["rollout/tokenization_drift_count"] == 0 and m["env/tool_calls"] == 1 and m["env/tool_errors"] == 0
    first, second = traj.turns
    assert second.context_ids[: len(first.context_ids) + len(first.action_ids)] == first.context_ids + first.action_ids
    assert gen.calls[1][0] == second.context_ids  # the model saw exactly the context that is trained on
    text = tok.decode(list(second.context_ids))
    result = str(int(eval(task["steps"][0])))  # the calculator's output, in the family's tool-response markup
    expected = {"llama": f"<|start_header_id|>ipython<|end_header_id|>\n\n{result}<|eot_id|>",
                "mistral": f'[TOOL_RESULTS] {{"content": "{result}"}}[/TOOL_RESULTS]'}
    assert expected.get(family, f"<tool_response>\n{result}\n</tool_response>") in text
    (seq,) = build_sequences(traj, 0, 0, True)
    assert [i for i, k in zip(seq.ids, seq.loss_mask) if k] == actions[0] + actions[1]
    # the same conversation rendered as text by the family's template: the same tokens (no template drift)
    msgs = [m.to_dict() for m in traj.info["transitions"][0].observation.messages]
    msgs += [{"role": "assistant", "content": call}, *[m.to_dict() for m in traj.info["transitions"][0].next_observation.messages]]
    rendered = render_chat(tok, msgs, [t.schema for t in _calc_tools()])
    assert text == rendered


def _calc_tools():
    from tether.envs import make_env

    return make_env({**make_problems("calc", 1, 0)[0], "env": "calc"}).tools


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sft_then_rl_then_reload(family, family_dirs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tether.recipes.rl import run_rl
    from tether.recipes.sft import run_sft

    common = ["data.task=calc", "data.train_size=16", "data.eval_size=2", "logging.progress=false",
              "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "reward.isolation=inline",
              "env.max_turns=2", "rollout.sampling.max_new_tokens=10", "eval.sampling.max_new_tokens=10",
              "eval.samples=1", "eval.problems=2"]
    sft_cfg = load_config(None, common + [f"model.path={family_dirs[family]}", "sft.steps=3", "sft.batch_size=4",
                                          "sft.warmup_steps=0", "sft.lr=3e-3"])
    _, sft = run_sft(sft_cfg, tmp_path / "sft")
    assert sft["steps"] == 3 and sft["final_loss"] == sft["final_loss"]  # finite
    rl_cfg = load_config(None, common + [f"model.path={sft['final_model']}", "train.steps=2", "rollout.n=2",
                                         "rollout.problems_per_step=2", "train.share_prefix='on'", "train.lr=1e-4",
                                         "rollout.on_drift=fail"])
    summary = run_rl(rl_cfg, tmp_path / "rl")
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "pg_loss" in r]
    assert [r["step"] for r in trained] == [1, 2] and all(r["pg_loss"] == r["pg_loss"] for r in trained)
    assert all(r["rollout/tokenization_drift_count"] == 0 for r in trained)  # sampled multi-turn episodes: no drift
    assert summary["steps"] == 2
    ckpt = find_latest_checkpoint(tmp_path / "rl")
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    assert model.config.model_type == family and tok.chat_template == FAMILIES[family].chat_template
    ids = torch.tensor([tok("Answer: 12", add_special_tokens=False)["input_ids"]])
    assert torch.isfinite(model(ids).logits).all()
    base, sft_model = load_policy(family_dirs[family]).model, load_policy(sft["final_model"]).model
    assert not all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), sft_model.state_dict().values()))
