"""Credit assignment: GiGPO (hand-computed), step_grpo / Kimi gamma decay, anchors from
rollouts, and multi-task normalisation (AgentRL task-level, ERPO environment-level)."""

from __future__ import annotations

import math

import pytest
import torch
from env_stubs import encode_action, tool_task

from tether.algos import ADVANTAGES, AdvantageInputs, compute_advantages, compute_gamma_decayed_rewards
from tether.train.batching import build_records, pad_records
from tether.config import AdvantageConfig, EnvConfig, SamplingConfig
from tether.train.credit import compute_step_fields
from tether.rollout.episodes import EpisodeRollout

M = [0, 1, 1, 0, 1, 1, 0, 0]  # ctx, turn-0 action x2, observation, turn-1 action x2, padding
STEP = [-1, 0, 0, -1, 1, 1, -1, -1]


def inputs(masks, steps, rewards, traj, anchors, group=None, task=None, scores=None):
    B = len(masks)
    return AdvantageInputs(
        scores_B=torch.tensor(scores if scores is not None else [sum(r) for r in rewards], dtype=torch.float32),
        token_rewards_BT=torch.tensor(rewards, dtype=torch.float32),
        mask_BT=torch.tensor(masks, dtype=torch.float32),
        group_B=torch.tensor(group if group is not None else [0] * B),
        traj_B=torch.tensor(traj),
        valid_B=torch.ones(B, dtype=torch.bool),
        task_B=None if task is None else torch.tensor(task),
        step_BT=torch.tensor(steps),
        anchor_BT=torch.tensor(anchors),
    )


def test_gigpo_docstring_example_by_hand():
    # tau0 rewards (0, 1), tau1 (0, 0); turn 0 shares an anchor, turn 1 observations differ.
    # R = (1, 0) -> A^E = +-0.5 (mean_norm); turn-0 returns with gamma 0.5: (0.5, 0) -> A^S = +-0.25.
    inp = inputs([M, M], [STEP, STEP], [[0, 0, 0, 0, 0, 1, 0, 0], [0] * 8], [0, 1],
                 [[-1, 0, 0, -1, 1, 1, -1, -1], [-1, 0, 0, -1, 2, 2, -1, -1]])
    adv = ADVANTAGES["gigpo"](inp, AdvantageConfig(name="gigpo", step_gamma=0.5)).advantages_BT
    assert adv.tolist() == [[0, 0.75, 0.75, 0, 0.5, 0.5, 0, 0], [0, -0.75, -0.75, 0, -0.5, -0.5, 0, 0]]


def test_gigpo_std_norm_omega_and_split_sequences_by_hand():
    # tau0 (0, 1) split over two sequences (sliding window), tau1 (0, 0) merged, tau2 (1) one turn.
    # gamma 1, omega 0.5, std norm. R = (1, 0, 1): mean 2/3, std sqrt(1/3) -> A^E = (s, -2s, s), s = 1/sqrt(3).
    # Turn 0 (shared anchor) returns (1, 0, 1) -> A^S = A^E. Turn 1 of tau0/tau1 (shared anchor)
    # returns (1, 0) -> A^S = +-1/sqrt(2). A = A^E + 0.5 A^S.
    one_turn0 = [0, 1, 1, 0, 0, 0, 0, 0]
    one_turn1 = [0, 0, 0, 0, 1, 1, 0, 0]
    s, h = 1 / math.sqrt(3), 1 / math.sqrt(2)
    inp = inputs(
        masks=[one_turn0, one_turn1, M, one_turn0],
        steps=[[-1, 0, 0, -1, -1, -1, -1, -1], [-1, -1, -1, -1, 1, 1, -1, -1], STEP, [-1, 0, 0, -1, -1, -1, -1, -1]],
        rewards=[[0] * 8, [0, 0, 0, 0, 0, 1, 0, 0], [0] * 8, [0, 0, 1, 0, 0, 0, 0, 0]],
        traj=[0, 0, 1, 2],
        anchors=[[-1, 7, 7, -1, -1, -1, -1, -1], [-1, -1, -1, -1, 9, 9, -1, -1], [-1, 7, 7, -1, 9, 9, -1, -1],
                 [-1, 7, 7, -1, -1, -1, -1, -1]],
    )
    cfg = AdvantageConfig(name="gigpo", step_gamma=1.0, step_weight=0.5, step_std_norm=True, eps=1e-12)
    adv = ADVANTAGES["gigpo"](inp, cfg).advantages_BT.double()
    want = {(0, 1): 1.5 * s, (1, 4): s + 0.5 * h, (2, 1): -3 * s, (2, 4): -2 * s - 0.5 * h, (3, 1): 1.5 * s}
    for (b, t), v in want.items():
        assert adv[b, t].item() == pytest.approx(v, rel=1e-6), (b, t)
    assert adv[inp.mask_BT == 0].abs().sum() == 0


def test_step_grpo_equals_grpo_with_gamma_one_and_decays_with_gamma():
    rewards = [[0, 0, 0, 0, 0, 1, 0, 0], [0] * 8, [0, 0, 0, 0, 0, 1, 0, 0]]
    inp = inputs([M, M, M], [STEP] * 3, rewards, [0, 1, 2], [STEP] * 3)
    grpo = ADVANTAGES["grpo"](inp, AdvantageConfig()).advantages_BT
    same = ADVANTAGES["step_grpo"](inp, AdvantageConfig(name="step_grpo", step_gamma=1.0)).advantages_BT
    assert torch.equal(grpo, same)
    # gamma 0.5: turn t of a successful 2-turn episode sees G = r * gamma^(T-1-t) (Kimi-Researcher)
    decayed = compute_gamma_decayed_rewards(1.0, 2, 0.5)  # [0.5, 1.0]
    adv = ADVANTAGES["step_grpo"](inp, AdvantageConfig(name="step_grpo", step_gamma=0.5)).advantages_BT
    mean, std = 2 / 3, math.sqrt(1 / 3)  # group returns (1, 0, 1)
    assert adv[0, 1].item() == pytest.approx((decayed[0].item() - mean) / std, rel=1e-5)
    assert adv[0, 4].item() == pytest.approx((decayed[1].item() - mean) / std, rel=1e-5)
    assert adv[1, 1].item() == pytest.approx(-mean / std, rel=1e-5)


def test_anchor_ids_come_from_identical_observations(env_policy, scripted):
    tok = env_policy.tokenizer
    call = lambda w: encode_action(tok, f'<tool_call>{{"name": "sentinel_tool", "arguments": {{"word": "{w}"}}}}</tool_call>')  # noqa: E731
    first = [call("a"), call("a"), call("b")]
    gen = scripted(lambda c, r, p: first[r] if c == 0 else encode_action(tok, "done"), env_policy.stop_ids)
    groups, _ = EpisodeRollout(EnvConfig()).run(
        env_policy, [tool_task(0)], 3, SamplingConfig(max_new_tokens=64), generate=gen)
    p = pad_records(build_records(groups), env_policy.pad_id)
    f = compute_step_fields(groups, p)
    anchors = [sorted(set(f["anchor_BT"][b][f["step_BT"][b] == k].tolist())) for b in range(3) for k in (0, 1)]
    assert anchors[0] == anchors[2] == anchors[4]  # turn 0: the same task observation
    assert anchors[1] == anchors[3] != anchors[5]  # turn 1: tool said "a <|endoftext|>" twice, "b ..." once
    assert f["task_B"].tolist() == [0, 0, 0]


def test_task_and_env_level_normalisation():
    masks = [[0, 1, 1, 0]] * 4
    inp = inputs(masks, [[-1, 0, 0, -1]] * 4, [[0, 0, 1, 0], [0] * 4, [0, 0, 10, 0], [0] * 4], [0, 1, 2, 3],
                 [[-1, 0, 0, -1]] * 4, group=[0, 0, 1, 1], task=[0, 0, 1, 1], scores=[1, 0, 10, 0])
    plain = compute_advantages(inp, AdvantageConfig(name="dr_grpo"))
    assert plain.advantages_BT[:, 1].tolist() == [0.5, -0.5, 5.0, -5.0]  # scales differ by task
    task = compute_advantages(inp, AdvantageConfig(name="dr_grpo", task_norm="task")).advantages_BT
    assert task[0, 1] == pytest.approx(task[2, 1].item(), rel=1e-4) and task[1, 1] == pytest.approx(task[3, 1].item(), rel=1e-4)
    # ERPO: one baseline per environment; here groups 0 and 1 are one environment
    inp_env = inputs(masks, [[-1, 0, 0, -1]] * 4, [[0] * 4] * 4, [0, 1, 2, 3], [[-1, 0, 0, -1]] * 4,
                     group=[0, 0, 1, 1], task=[0, 0, 0, 0], scores=[1, 0, 3, 0])
    env = compute_advantages(inp_env, AdvantageConfig(name="dr_grpo", task_norm="env")).advantages_BT
    assert env[:, 1].tolist() == [0.0, -1.0, 2.0, -1.0]  # mean over the environment: 1


def _reference_gigpo(episodes, gamma, omega, std_norm, eps):
    """GiGPO by plain loops over episodes and steps: {(episode, turn): advantage}."""
    from collections import defaultdict

    def rel(values):  # (x - mean) / F over one group; singleton -> 0
        if len(values) < 2:
            return [0.0] * len(values)
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return [(v - mean) / ((std + eps) if std_norm else 1.0) for v in values]

    returns = [sum(e["rewards"]) for e in episodes]
    groups, steps = defaultdict(list), defaultdict(list)
    G = {}
    for i, e in enumerate(episodes):
        groups[e["group"]].append(i)
        running = 0.0
        for t in reversed(range(len(e["rewards"]))):
            running = e["rewards"][t] + gamma * running
            G[(i, t)] = running
            steps[(e["group"], e["anchors"][t])].append((i, t))
    A_E = {i: a for idx in groups.values() for i, a in zip(idx, rel([returns[i] for i in idx]))}
    A_S = {k: a for keys in steps.values() for k, a in zip(keys, rel([G[k] for k in keys]))}
    return {k: A_E[k[0]] + omega * A_S[k] for k in G}


@pytest.mark.parametrize("seed", range(5))
def test_gigpo_equals_a_plain_loop_on_random_batches(seed):
    import random

    rng = random.Random(seed)
    episodes = [{"group": g, "rewards": [rng.choice([0.0, 0.5, 1.0]) for _ in range(T)],
                 "anchors": [rng.choice("ab") if t else "start" for t in range(T)]}
                for g in range(3) for T in [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]]
    rows = []  # (traj, [(turn or -1, reward)]) per sequence: turns merge or split at random
    for i, e in enumerate(episodes):
        seq = [(-1, 0.0)]
        for t, r in enumerate(e["rewards"]):
            if t and rng.random() < 0.5:
                rows.append((i, seq))
                seq = [(-1, 0.0)]
            seq += [(-1, 0.0)] * (t > 0) + [(t, 0.0)] * rng.randint(0, 2) + [(t, r)]
        rows.append((i, seq))
    T = max(len(s) for _, s in rows)
    pad = lambda s, v: s + [v] * (T - len(s))  # noqa: E731
    steps = [pad([k for k, _ in s], -1) for _, s in rows]
    anchor_ids = {}
    anchors = [[-1 if k < 0 else anchor_ids.setdefault((episodes[i]["group"], episodes[i]["anchors"][k]), len(anchor_ids))
                for k in st] for (i, _), st in zip(rows, steps)]
    inp = inputs([[float(k >= 0) for k in st] for st in steps], steps, [pad([r for _, r in s], 0.0) for _, s in rows],
                 [i for i, _ in rows], anchors, group=[episodes[i]["group"] for i, _ in rows])
    cfg = AdvantageConfig(name="gigpo", step_gamma=0.9, step_weight=0.7, step_std_norm=bool(seed % 2), eps=1e-6)
    adv = ADVANTAGES["gigpo"](inp, cfg).advantages_BT
    want = _reference_gigpo(episodes, 0.9, 0.7, bool(seed % 2), 1e-6)
    for b, ((i, _), st) in enumerate(zip(rows, steps)):
        for t, k in enumerate(st):
            assert adv[b, t].item() == pytest.approx(want[(i, k)] if k >= 0 else 0.0, abs=1e-5), (b, t)
