"""The env runner carries keys/values from one turn to the next (tether.policy.kv_reuse): the
episodes sampled with reuse are those sampled without, and the prefill runs fewer positions."""

import dataclasses
from typing import Any, Mapping

import torch

from tether.config import EnvConfig, SamplingConfig
from tether.envs import ENVS, Action, EnvSpec, Message, Observation, StepResult, register_env
from tether.rollout.episodes import EpisodeRollout


class ChattyEnv:
    """Answers every action with the same note and never ends: every episode plays max_turns."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task

    def reset(self) -> Observation:
        return Observation((Message("system", "test env"), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        return StepResult(Observation((Message("user", "go on, 12+3"),)), 0.0, False, {})


if "_test_chatty" not in ENVS:
    register_env("_test_chatty")(lambda: EnvSpec("_test_chatty", lambda rng, i, kw: {"id": f"c{i}", "prompt": f"task {i}"},
                                                 ChattyEnv, None, "test env"))


def _play(policy, reuse: bool, config_switch: bool = True):
    pol = dataclasses.replace(policy, reuse_turn_kv=reuse)
    tasks = [{"env": "_test_chatty", "id": f"c{i}", "prompt": f"task {i}"} for i in range(3)]
    return EpisodeRollout(EnvConfig(max_turns=3, reuse_kv=config_switch), on_drift="fail").run(
        pol, tasks, 2, SamplingConfig(max_new_tokens=12), generator=torch.Generator().manual_seed(0))


def test_turns_sampled_with_reused_keys_values_equal_whole_prefills(env_policy):
    with_reuse, m = _play(env_policy, True)
    without, m0 = _play(env_policy, False)
    assert m["env/turns_mean"] == 3 and m["rollout/tokenization_drift_count"] == 0
    # turns 2 and 3 reuse their context up to the note: most of the prompt positions are not run again
    assert m["rollout/prefill_reused_frac"] > 0.4 and m["rollout/prefill_run_frac"] < 0.6, m
    assert "rollout/prefill_reused_frac" not in m0
    assert "rollout/prefill_reused_frac" not in _play(env_policy, True, config_switch=False)[1]  # env.reuse_kv=false
    assert env_policy.turn_kv is None  # the runner's scope is closed: nothing kept past the rollout
    for g, h in zip(with_reuse, without):
        for a, b in zip(g.trajectories, h.trajectories):
            assert [t.action_ids for t in a.turns] == [t.action_ids for t in b.turns]
            for ta, tb in zip(a.turns, b.turns):
                assert ta.context_ids == tb.context_ids
                assert torch.allclose(torch.tensor(ta.action_logprobs), torch.tensor(tb.action_logprobs), atol=2e-5)
