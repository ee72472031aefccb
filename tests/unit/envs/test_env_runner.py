"""Multi-turn rollout: batching per turn, stop reasons, and failures contained and counted."""

from __future__ import annotations

import pytest
from env_stubs import encode_action, tool_task

from tether.train.batching import build_records, pad_records
from tether.config import EnvConfig, SamplingConfig
from tether.rollout.episodes import EpisodeRollout
from tether.rollout.runner import EnvFailure, compute_turn_rewards
from tether.train.groups import compute_compact_weights
from tether.types import Outcome

SAMPLING = SamplingConfig(max_new_tokens=64)
CALL = '<tool_call>{"name": "sentinel_tool", "arguments": {"word": "w"}}</tool_call>'


def run(policy, gen, tasks, n=1, **env):
    return EpisodeRollout(EnvConfig(**env)).run(policy, tasks, n, SAMPLING, generate=gen)


def stops(groups):
    return [t.stop.value for g in groups for t in g.trajectories]


def test_all_live_episodes_of_a_turn_generate_in_one_call(env_policy, scripted):
    tok = env_policy.tokenizer
    # on turn 0, odd rows call a tool and even rows answer at once
    gen = scripted(lambda c, r, p: encode_action(tok, CALL if c == 0 and r % 2 else "done"), env_policy.stop_ids)
    groups, m = run(env_policy, gen, [tool_task(i) for i in range(3)], n=2)
    assert [len(c) for c in gen.calls] == [6, 3]  # one batch per turn, only live episodes
    assert stops(groups) == ["done"] * 6
    assert m["env/turns_mean"] == pytest.approx(1.5) and m["env/success_rate"] == 1.0
    assert [len(t.turns) for t in groups[0].trajectories] == [1, 2]
    assert all(t.reward.total == 1.0 for g in groups for t in g.trajectories)


def test_raising_reset_and_step_are_contained_and_masked(env_policy, scripted):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, "done"), env_policy.stop_ids)
    tasks = [tool_task(0, fail="reset"), tool_task(1, fail="step"), tool_task(2)]
    groups, m = run(env_policy, gen, tasks, max_error_rate=1.0)
    assert stops(groups) == ["env_error", "env_error", "done"]
    assert m["env/env_errors"] == 2 and m["env/stop/env_error"] == pytest.approx(2 / 3)
    bad = groups[1].trajectories[0]
    assert bad.reward.outcome is Outcome.ERROR and "step exploded" in bad.info["error"]
    assert "reset exploded" in groups[0].trajectories[0].info["error"] and groups[0].trajectories[0].turns == ()
    records = build_records(groups)  # failed episodes are excluded from advantages (valid=False)
    assert [r.valid for r in records] == [False, True]


@pytest.mark.parametrize("kind,why", [("dict", "expected a StepResult"), ("nan", "expected a finite number"),
                                      ("obs", "expected an Observation"), ("info", "expected a mapping"),
                                      ("counter", "integer tool counters")])
def test_garbage_step_results_are_env_errors(env_policy, scripted, kind, why):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, "done"), env_policy.stop_ids)
    groups, m = run(env_policy, gen, [tool_task(0, fail="garbage", kind=kind), tool_task(1)], max_error_rate=1.0)
    assert stops(groups) == ["env_error", "done"] and m["env/env_errors"] == 1
    assert why in groups[0].trajectories[0].info["error"]


def test_hanging_step_times_out(env_policy, scripted):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, "done"), env_policy.stop_ids)
    # 2 s: the healthy episode's steps finish in time even on a loaded machine; the hung step sleeps 30 s
    groups, m = run(env_policy, gen, [tool_task(1, fail="hang"), tool_task(2)], step_timeout_s=2.0, max_error_rate=1.0)
    assert stops(groups) == ["timeout", "done"]
    assert m["env/step_timeouts"] == 1 and m["time/env"] < 15


def test_systematic_env_failure_stops_the_run_with_the_cause(env_policy, scripted):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, "done"), env_policy.stop_ids)
    with pytest.raises(EnvFailure, match="2/3 episodes ended in env_error.*_test_tools.*step exploded"):
        run(env_policy, gen, [tool_task(0, fail="step"), tool_task(1, fail="step"), tool_task(2)])


def test_raising_and_slow_tools_are_observations_not_failures(env_policy, scripted):
    tok = env_policy.tokenizer
    calls = ['<tool_call>{"name": "raising_tool", "arguments": {"x": "1"}}</tool_call>'
             '<tool_call>{"name": "slow_tool", "arguments": {"x": "1"}}</tool_call>', "done"]
    gen = scripted(lambda c, r, p: encode_action(tok, calls[c]), env_policy.stop_ids)
    groups, m = run(env_policy, gen, [tool_task(0)])
    traj = groups[0].trajectories[0]
    assert traj.stop.value == "done" and traj.reward.total == 1.0
    assert (m["env/tool_calls"], m["env/tool_errors"], m["env/tool_timeouts"]) == (2, 1, 1)
    obs = traj.info["transitions"][0].next_observation.messages
    assert "tool exploded" in obs[0].content and obs[1].content.startswith("error: timeout")


def test_malformed_calls_become_error_observations_then_parse_error(env_policy, scripted):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, '<tool_call>{"name": "sentinel_tool", "arg'), env_policy.stop_ids)
    groups, m = run(env_policy, gen, [tool_task(0)], max_parse_errors=2)
    traj = groups[0].trajectories[0]
    assert traj.stop.value == "parse_error" and len(traj.turns) == 2 and m["env/parse_errors"] == 2
    assert traj.info["transitions"][0].next_observation.messages[0].content.startswith("error: unbalanced")


def test_max_turns_context_overflow_and_episode_timeout(env_policy, scripted):
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, CALL), env_policy.stop_ids)
    groups, _ = run(env_policy, gen, [tool_task(0)], max_turns=3)
    assert stops(groups) == ["max_turns"] and len(groups[0].trajectories[0].turns) == 3
    first_ctx = len(gen.calls[0][0])
    gen = scripted(lambda c, r, p: encode_action(tok, CALL), env_policy.stop_ids)
    groups, m = run(env_policy, gen, [tool_task(0)], max_turns=5, max_context_tokens=first_ctx + 10)
    assert stops(groups) == ["context_overflow"] and len(groups[0].trajectories[0].turns) == 1
    assert all(len(p) <= first_ctx + 10 for c in gen.calls for p in c)
    gen = scripted(lambda c, r, p: encode_action(tok, CALL), env_policy.stop_ids)
    groups, _ = run(env_policy, gen, [tool_task(0)], max_turns=5, episode_timeout_s=1e-9)
    assert stops(groups) == ["timeout"]


def test_stop_reasons_reach_compact_filtering(env_policy, scripted):
    """max_turns masked (DeepSWE), done kept; the per-reason rate is logged."""
    tok = env_policy.tokenizer
    gen = scripted(lambda c, r, p: encode_action(tok, CALL if r == 0 else "done"), env_policy.stop_ids)
    groups, _ = run(env_policy, gen, [tool_task(0)], n=2, max_turns=2)
    assert stops(groups) == ["max_turns", "done"]
    groups2, weights, cm = compute_compact_weights(groups, {"max_turns": "mask"})
    assert weights == {(0, 0): 0.0, (0, 1): 1.0}
    assert cm["compact/max_turns_frac"] == 0.5 and cm["compact/masked_frac"] == 0.5
    p = pad_records(build_records(groups2, weights), env_policy.pad_id)
    assert p.loss_mask_BT[0].sum() == 0 and p.loss_mask_BT[1].sum() > 0


def test_turn_reward_placement():
    assert compute_turn_rewards([0.0, 0.5, 1.0], "broadcast") == ([0.0, 0.0, 0.0], 1.5)
    assert compute_turn_rewards([0.0, 0.5, 1.0], "step") == ([0.0, 0.5, 0.0], 1.0)
    assert compute_turn_rewards([], "step") == ([], 0.0)
    with pytest.raises(ValueError, match="broadcast, step"):
        compute_turn_rewards([1.0], "gamma")
