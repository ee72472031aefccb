"""Step (process) rewards: household's subgoal rewards, and step rewards reaching the advantages
of a 3-step episode with env.credit=step (hand-computed)."""

import random

import pytest
import torch

from tether.algos import ADVANTAGES, AdvantageInputs
from tether.config import AdvantageConfig
from tether.envs.base import Action
from tether.envs.builtin.household import CLOSED, HouseholdEnv, household_expert, make_household_task
from tether.rollout.runner import compute_turn_rewards


def _run_expert(task):
    env, history, rewards, infos = HouseholdEnv(task), [], [], []
    from tether.policy.chat import Message

    env.reset()
    for _ in range(8):
        cmd = household_expert(task, history)
        res = env.step(Action(text=cmd, token_ids=()))
        history += [Message("assistant", cmd)]
        rewards.append(res.reward)
        infos.append(res.info)
        if res.done:
            break
    return rewards, infos


def _task(closed_goal: bool, s: float):
    rng = random.Random(0)
    for i in range(200):
        t = make_household_task(rng, i, {"subgoal_reward": s})
        if (t["goal"] in CLOSED) == closed_goal:
            return t
    raise AssertionError("no such task")


@pytest.mark.parametrize("closed_goal,expected", [
    (True, [0.0, 0.25, 0.25, 0.25, 1.0]),   # go to source, take, go to goal, open it, put
    (False, [0.0, 0.25, 0.25, 1.0]),        # the goal is open: no open step
])
def test_household_pays_each_subgoal_once(closed_goal, expected):
    rewards, infos = _run_expert(_task(closed_goal, 0.25))
    assert rewards == pytest.approx(expected)
    assert infos[-1]["correct"] is True


def test_outcome_only_by_default():
    rewards, infos = _run_expert(_task(True, 0.0))
    assert rewards == [0.0, 0.0, 0.0, 0.0, 1.0] and infos[-1]["correct"] is True


def test_step_rewards_reach_the_advantages_of_a_three_step_episode():
    # one sequence: ctx, turn-0 action (2 tokens), obs, turn-1 action (2), obs, turn-2 action (2)
    mask = [0, 1, 1, 0, 1, 1, 0, 1, 1]
    step_r, score = compute_turn_rewards([0.25, 0.25, 1.0], "step")
    assert step_r == [0.25, 0.25, 0.0] and score == 1.0
    # batching puts turn t's reward on its last action token and the score on the final one
    rewards = [0, 0, 0.25, 0, 0, 0.25, 0, 0, 1.0]
    inp = AdvantageInputs(scores_B=torch.tensor([1.5]), token_rewards_BT=torch.tensor([rewards]),
                          mask_BT=torch.tensor([mask], dtype=torch.float32), group_B=torch.tensor([0]),
                          traj_B=torch.tensor([0]), valid_B=torch.tensor([True]))
    out = ADVANTAGES["reinforce_pp"](inp, AdvantageConfig(name="reinforce_pp", gamma=1.0))
    # reward-to-go (gamma 1): turn 0 tokens 1.5, turn 1 tokens 1.25, turn 2 tokens 1.0
    assert out.returns_BT[0].tolist() == pytest.approx([0, 1.5, 1.5, 0, 1.25, 1.25, 0, 1.0, 1.0])
    # whitened over the 6 action tokens (mean 1.25): the earlier turns, which earned more, get more
    vals = torch.tensor([1.5, 1.5, 1.25, 1.25, 1.0, 1.0])
    expect = (vals - vals.mean()) / (vals.std() + 1e-6)  # Bessel std, eps = algo.advantage.eps
    got = out.advantages_BT[0][torch.tensor(mask, dtype=torch.bool)]
    assert got.tolist() == pytest.approx(expect.tolist(), abs=1e-5)
    # the same return broadcast to the end (outcome only) gives every token the same advantage
    flat = AdvantageInputs(scores_B=torch.tensor([1.5]), token_rewards_BT=torch.tensor([[0] * 8 + [1.5]]),
                           mask_BT=torch.tensor([mask], dtype=torch.float32), group_B=torch.tensor([0]),
                           traj_B=torch.tensor([0]), valid_B=torch.tensor([True]))
    flat_adv = ADVANTAGES["reinforce_pp"](flat, AdvantageConfig(name="reinforce_pp", gamma=1.0)).advantages_BT[0]
    assert torch.allclose(flat_adv[torch.tensor(mask, dtype=torch.bool)], torch.zeros(6), atol=1e-5)
