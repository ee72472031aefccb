"""Advantage estimators: hand-computed values, edge cases, and equivalence with plain loops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tether.algos import ADVANTAGES, AdvantageInputs, compute_masked_whiten, normalize_by_task
from tether.config import AdvantageConfig
from tether.registry import UnknownNameError

NAN = float("nan")


def make_inputs(
    scores,
    lengths,
    group=None,
    traj=None,
    valid=None,
    T=None,
    token_rewards=None,
    values=None,
    baseline=None,
    dtype=torch.float32,
) -> AdvantageInputs:
    B = len(scores)
    T = T or max(max(lengths), 1) + 1  # at least one padded column
    mask_BT = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)
    rewards_BT = torch.zeros(B, T, dtype=dtype) if token_rewards is None else torch.tensor(token_rewards, dtype=dtype)
    return AdvantageInputs(
        scores_B=torch.tensor(scores, dtype=dtype),
        token_rewards_BT=rewards_BT,
        mask_BT=mask_BT,
        group_B=torch.tensor(group if group is not None else [0] * B),
        traj_B=torch.tensor(traj if traj is not None else list(range(B))),
        valid_B=torch.tensor(valid if valid is not None else [True] * B),
        values_BT=None if values is None else torch.tensor(values, dtype=dtype),
        baseline_B=None if baseline is None else torch.tensor(baseline, dtype=dtype),
    )


def run(name: str, inp: AdvantageInputs, **cfg):
    return ADVANTAGES[name](inp, AdvantageConfig(name=name, **cfg))


def seq_values(adv_BT: torch.Tensor, inp: AdvantageInputs) -> list[float]:
    """The (constant) advantage of each sequence, read at its first token (0 for empty ones)."""
    return [adv_BT[i, 0].item() for i in range(adv_BT.shape[0])]


def assert_zero_off_mask(adv_BT: torch.Tensor, inp: AdvantageInputs) -> None:
    assert (adv_BT[inp.mask_BT == 0] == 0).all()
    assert torch.isfinite(adv_BT).all()


# ----------------------------------------------------------------------------- GRPO


def test_grpo_hand_values_bessel_std():
    # rewards [1,0,0,1]: mean 0.5, deviations +-0.5,
    # Bessel var = (4 * 0.25) / (4 - 1) = 1/3, std = 0.57735
    # A = +-0.5 / (0.57735 + 1e-6) = +-0.866024
    inp = make_inputs([1, 0, 0, 1], lengths=[2, 3, 1, 2])
    out = run("grpo", inp)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert a == pytest.approx(0.866024, abs=1e-6)
    assert seq_values(out.advantages_BT, inp) == pytest.approx([a, -a, -a, a], rel=1e-6)
    assert_zero_off_mask(out.advantages_BT, inp)
    # every action token of a sequence carries its advantage
    assert out.advantages_BT[1, :3].tolist() == pytest.approx([-a] * 3, rel=1e-6)


def test_grpo_eps_from_config():
    # same group, eps = 0.1: A = 0.5 / (0.57735 + 0.1) = 0.738173
    out = run("grpo", make_inputs([1, 0, 0, 1], lengths=[1] * 4), eps=0.1)
    assert out.advantages_BT[0, 0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1), rel=1e-6)


def test_grpo_two_groups_are_independent():
    # group 0: [1, 0] -> mean 0.5, Bessel std sqrt(0.5) = 0.70711 -> A = +-0.70711
    # group 1: [3, 1, 2] -> mean 2, devs [1,-1,0], var (1+1+0)/2 = 1 -> A = [1, -1, 0]
    inp = make_inputs([1, 0, 3, 1, 2], lengths=[1] * 5, group=[0, 0, 1, 1, 1])
    got = seq_values(run("grpo", inp).advantages_BT, inp)
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert got == pytest.approx([b, -b, 1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0], rel=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_all_equal_group_is_exactly_zero(name):
    # [0.1, 0.1, 0.1] in float32: verl's float32 path gives -0.0015; tether must give exact 0
    inp = make_inputs([0.1, 0.1, 0.1], lengths=[2, 2, 2])
    adv = run(name, inp).advantages_BT
    assert (adv == 0).all()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_group_of_one_gets_zero(name):
    # group 1 holds a single trajectory (score 5): no comparison -> 0
    inp = make_inputs([1, 0, 5], lengths=[1, 1, 2], group=[0, 0, 1])
    adv = run(name, inp).advantages_BT
    assert (adv[2] == 0).all()
    assert adv[0, 0].item() > 0 > adv[1, 0].item()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "remax"])
def test_invalid_sequences_excluded_and_zero(name):
    # the invalid sequence's score (NaN, a failed reward) must neither poison nor shift the group:
    # valid rewards [1,0,0,1] give the same advantages as without it
    inp = make_inputs([1, 0, NAN, 0, 1], lengths=[1] * 5, valid=[True, True, False, True, True],
                      baseline=[0.0] * 5)
    ref = make_inputs([1, 0, 0, 1], lengths=[1] * 4, baseline=[0.0] * 4)
    adv = run(name, inp).advantages_BT
    assert (adv[2] == 0).all()
    assert torch.isfinite(adv).all()
    kept = adv[[0, 1, 3, 4]]
    torch.testing.assert_close(kept, run(name, ref).advantages_BT)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "reinforce_pp"])
def test_empty_sequence_row_is_zero(name):
    inp = make_inputs([1, 0, 1], lengths=[2, 0, 1], token_rewards=[[0, 1, 0], [0, 0, 0], [1, 0, 0]])
    adv = run(name, inp).advantages_BT
    assert (adv[1] == 0).all()
    assert_zero_off_mask(adv, inp)


def test_trajectories_counted_once():
    # traj 0 was split into 3 sequences (score 1), traj 1 is one sequence (score 0).
    # Per trajectory: [1, 0] -> mean 0.5, Bessel std sqrt(0.5) -> A = +-0.5/0.70711 = +-0.70711.
    # (Counting sequences would give mean 0.75 and A = [0.5, 0.5, 0.5, -1.5].)
    inp = make_inputs([1, 1, 1, 0], lengths=[1] * 4, traj=[0, 0, 0, 1])
    got = seq_values(run("grpo", inp).advantages_BT, inp)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert got == pytest.approx([a, a, a, -a], rel=1e-6)
    # RLOO: A_0 = 1 - 0 = 1, A_1 = 0 - 1 = -1
    assert seq_values(run("rloo", inp).advantages_BT, inp) == pytest.approx([1, 1, 1, -1])


# ----------------------------------------------------------------------------- Dr. GRPO, RLOO, ReMax


def test_dr_grpo_hand_values():
    # [1,0,0,1] -> R - 0.5 = [0.5,-0.5,-0.5,0.5];  [3,1,2] -> R - 2 = [1,-1,0]
    inp = make_inputs([1, 0, 0, 1, 3, 1, 2], lengths=[1] * 7, group=[0, 0, 0, 0, 1, 1, 1])
    got = seq_values(run("dr_grpo", inp).advantages_BT, inp)
    assert got == pytest.approx([0.5, -0.5, -0.5, 0.5, 1, -1, 0])


def test_rloo_hand_values():
    # [1,0,0,1]: A_0 = 1 - (0+0+1)/3 = 2/3, A_1 = 0 - (1+0+1)/3 = -2/3
    # [3,1,2]:   3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0
    inp = make_inputs([1, 0, 0, 1, 3, 1, 2], lengths=[1] * 7, group=[0, 0, 0, 0, 1, 1, 1])
    got = seq_values(run("rloo", inp).advantages_BT, inp)
    assert got == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0])


def test_remax_hand_values_and_missing_baseline():
    # A = score - greedy baseline, no normalisation: [1 - 0.5, 0.5 - 0.5, 0 - 0.5]
    inp = make_inputs([1.0, 0.5, 0.0], lengths=[2, 1, 1], baseline=[0.5, 0.5, 0.5])
    adv = run("remax", inp).advantages_BT
    assert seq_values(adv, inp) == pytest.approx([0.5, 0.0, -0.5])
    assert adv[0, :2].tolist() == [0.5, 0.5]
    assert_zero_off_mask(adv, inp)
    with pytest.raises(ValueError, match="baseline_B"):
        run("remax", make_inputs([1.0], lengths=[1]))


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_reward_to_go_and_whitening_hand_values():
    # gamma = 0.5. seq 0 rewards [0,0,1] -> to-go: t2 = 1, t1 = 0.5, t0 = 0.25
    #               seq 1 rewards [0,-1] -> to-go: t1 = -1, t0 = -0.5
    # tokens [0.25, 0.5, 1, -0.5, -1]: mean 0.25/5 = 0.05
    # devs [0.2, 0.45, 0.95, -0.55, -1.05]; sum sq = .04+.2025+.9025+.3025+1.1025 = 2.55
    # Bessel var 2.55/4 = 0.6375, std 0.798436
    inp = make_inputs([1, -1], lengths=[3, 2], T=4, token_rewards=[[0, 0, 1, 0], [0, -1, 9, 9]])
    out = run("reinforce_pp", inp, gamma=0.5)
    assert out.returns_BT.tolist() == [[0.25, 0.5, 1.0, 0.0], [-0.5, -1.0, 0.0, 0.0]]
    std = math.sqrt(0.6375)
    expected = [d / (std + 1e-6) for d in [0.2, 0.45, 0.95, -0.55, -1.05]]
    got = out.advantages_BT[inp.mask_BT > 0].tolist()
    assert got == pytest.approx(expected, rel=1e-5)
    assert_zero_off_mask(out.advantages_BT, inp)


def test_reinforce_pp_skips_off_mask_positions():
    # mask [1,0,1] (an environment token in the middle with reward 5, ignored); gamma = 0.5:
    # t2 = 1, t1 skipped, t0 = 0 + 0.5 * 1 = 0.5 (the env token is not a discount step)
    inp = make_inputs([1], lengths=[3], T=3, token_rewards=[[0, 5, 1]])
    inp = AdvantageInputs(**{**inp.__dict__, "mask_BT": torch.tensor([[1.0, 0.0, 1.0]])})
    out = run("reinforce_pp", inp, gamma=0.5)
    assert out.returns_BT.tolist() == [[0.5, 0.0, 1.0]]


def test_reinforce_pp_baseline_hand_values():
    # group 0 [1,0] -> centred [0.5,-0.5]; group 1 [3,1] -> [1,-1]; one token each
    # tokens [0.5,-0.5,1,-1]: mean 0, Bessel var (0.25+0.25+1+1)/3 = 0.83333, std 0.912871
    inp = make_inputs([1, 0, 3, 1], lengths=[1] * 4, group=[0, 0, 1, 1])
    got = seq_values(run("reinforce_pp_baseline", inp).advantages_BT, inp)
    std = math.sqrt(2.5 / 3)
    assert got == pytest.approx([0.5 / std, -0.5 / std, 1 / std, -1 / std], rel=1e-5)


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_values_gamma_lambda_one():
    # values [0.5, 0.2], rewards [0, 1], gamma = lambda = 1:
    # delta_1 = 1 + 0 - 0.2 = 0.8 (terminal: next V = 0) -> A_1 = 0.8
    # delta_0 = 0 + 0.2 - 0.5 = -0.3 -> A_0 = -0.3 + 0.8 = 0.5
    # returns = A + V = [1.0, 1.0]
    # whitening of [0.5, 0.8]: mean 0.65, devs -+0.15, Bessel var 0.045, std 0.212132
    inp = make_inputs([1], lengths=[2], T=3, token_rewards=[[0, 1, 0]], values=[[0.5, 0.2, NAN]])
    out = run("gae", inp)
    assert out.returns_BT[0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    w = 0.15 / (math.sqrt(0.045) + 1e-6)
    assert out.advantages_BT[0].tolist() == pytest.approx([-w, w, 0.0], rel=1e-5)
    assert out.advantages_BT[0, 2].item() == 0.0 and out.returns_BT[0, 2].item() == 0.0


def test_gae_hand_values_discounted_with_mask_hole():
    # gamma 0.9, lambda 0.8; mask [1,0,1]: the middle (env) token is skipped entirely.
    # delta_2 = 1 - 0.2 = 0.8 -> A_2 = 0.8
    # delta_0 = 0 + 0.9*0.2 - 0.5 = -0.32 -> A_0 = -0.32 + 0.9*0.8*0.8 = 0.256
    # returns = [0.256 + 0.5, 0, 0.8 + 0.2] = [0.756, 0, 1.0]
    inp = make_inputs([1], lengths=[3], T=3, token_rewards=[[0, 7, 1]], values=[[0.5, 99.0, 0.2]])
    inp = AdvantageInputs(**{**inp.__dict__, "mask_BT": torch.tensor([[1.0, 0.0, 1.0]])})
    out = run("gae", inp, gamma=0.9, lam=0.8)
    assert out.returns_BT[0].tolist() == pytest.approx([0.756, 0.0, 1.0], rel=1e-6)
    assert out.advantages_BT[0, 1].item() == 0.0


def test_gae_requires_values():
    with pytest.raises(ValueError, match="values_BT"):
        run("gae", make_inputs([1], lengths=[1]))


# ----------------------------------------------------------------------------- loop equivalence


def _random_case(seed: int, with_values: bool = False):
    rng = random.Random(seed)
    B, T = 14, 6
    lengths = [rng.randint(0, T) for _ in range(B)]
    group = [rng.randint(0, 3) for _ in range(B)]
    # some trajectories span several sequences (same group, same score)
    traj = list(range(B))
    for i in range(1, B):
        if rng.random() < 0.3 and group[i] == group[i - 1]:
            traj[i] = traj[i - 1]
    base_scores = {t: rng.choice([0.0, 1.0, 0.5, rng.random()]) for t in set(traj)}
    scores = [base_scores[t] for t in traj]
    valid_traj = {t: rng.random() > 0.15 for t in set(traj)}
    valid = [valid_traj[t] for t in traj]
    rewards = [[rng.uniform(-1, 1) for _ in range(T)] for _ in range(B)]
    values = [[rng.uniform(-1, 1) for _ in range(T)] for _ in range(B)] if with_values else None
    inp = make_inputs(scores, lengths, group, traj, valid, T=T, token_rewards=rewards, values=values,
                      dtype=torch.float64)
    return inp, dict(lengths=lengths, group=group, traj=traj, scores=scores, valid=valid,
                     rewards=rewards, values=values)


def _loop_group_advantage(case, name: str, eps: float = 1e-6) -> list[float]:
    # one score per valid trajectory, per group
    per_group: dict[int, dict[int, float]] = {}
    for i, t in enumerate(case["traj"]):
        if case["valid"][i]:
            per_group.setdefault(case["group"][i], {})[t] = case["scores"][i]
    out = []
    for i, t in enumerate(case["traj"]):
        if not case["valid"][i]:
            out.append(0.0)
            continue
        rs = list(per_group[case["group"][i]].values())
        n, r = len(rs), case["scores"][i]
        if n < 2:
            out.append(0.0)
            continue
        mean = sum(rs) / n
        if name == "grpo":
            std = math.sqrt(sum((x - mean) ** 2 for x in rs) / (n - 1))
            out.append((r - mean) / (std + eps))
        elif name in ("dr_grpo", "reinforce_pp_baseline"):
            out.append(r - mean)
        elif name == "rloo":
            out.append(r - (sum(rs) - r) / (n - 1))
    return out


def _loop_whiten(values: list[list[float | None]], eps: float = 1e-6) -> list[list[float]]:
    flat = [v for row in values for v in row if v is not None]
    n = len(flat)
    mean = sum(flat) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / (n - 1)) if n > 1 else 0.0
    return [[0.0 if v is None else (v - mean) / (std + eps) for v in row] for row in values]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_outcome_estimators_match_plain_loop(name, seed):
    inp, case = _random_case(seed)
    adv = run(name, inp).advantages_BT
    expected = _loop_group_advantage(case, name)
    for i, n_tok in enumerate(case["lengths"]):
        row = [expected[i]] * n_tok + [0.0] * (adv.shape[1] - n_tok)
        assert adv[i].tolist() == pytest.approx(row, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_baseline_matches_plain_loop(seed):
    inp, case = _random_case(seed)
    centred = _loop_group_advantage(case, "reinforce_pp_baseline")
    T = inp.mask_BT.shape[1]
    table = [[centred[i] if (t < n and case["valid"][i]) else None for t in range(T)]
             for i, n in enumerate(case["lengths"])]
    expected = _loop_whiten(table)
    got = run("reinforce_pp_baseline", inp).advantages_BT
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-12)


def _loop_token_returns(case, gamma: float) -> list[list[float | None]]:
    out = []
    for i, n in enumerate(case["lengths"]):
        row: list[float | None] = [None] * len(case["rewards"][i])
        if case["valid"][i]:
            g = 0.0
            for t in reversed(range(n)):
                g = case["rewards"][i][t] + gamma * g
                row[t] = g
        out.append(row)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_pp_matches_plain_loop(seed):
    inp, case = _random_case(seed)
    out = run("reinforce_pp", inp, gamma=0.9)
    table = _loop_token_returns(case, 0.9)
    expected = _loop_whiten(table)
    torch.testing.assert_close(out.advantages_BT, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_plain_loop(seed):
    inp, case = _random_case(seed, with_values=True)
    gamma, lam = 0.95, 0.9
    out = run("gae", inp, gamma=gamma, lam=lam)
    T = inp.mask_BT.shape[1]
    raw: list[list[float | None]] = []
    returns = []
    for i, n in enumerate(case["lengths"]):
        row: list[float | None] = [None] * T
        ret = [0.0] * T
        if case["valid"][i]:
            adv, next_v = 0.0, 0.0
            for t in reversed(range(n)):
                v = case["values"][i][t]
                delta = case["rewards"][i][t] + gamma * next_v - v
                adv = delta + gamma * lam * adv
                row[t], ret[t], next_v = adv, adv + v, v
        raw.append(row)
        returns.append(ret)
    torch.testing.assert_close(out.returns_BT, torch.tensor(returns, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.advantages_BT, torch.tensor(_loop_whiten(raw), dtype=torch.float64),
                               rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- helpers, registry


def test_masked_whiten_constant_and_single_token_give_zero():
    keep = torch.tensor([[True, True, False]])
    x = torch.tensor([[0.1, 0.1, NAN]])
    assert (compute_masked_whiten(x, keep, 1e-6) == 0).all()
    one = torch.tensor([[True, False, False]])
    assert (compute_masked_whiten(torch.tensor([[3.0, 1.0, 2.0]]), one, 1e-6) == 0).all()


def test_normalize_by_task_hand_values():
    # task 0 tokens [1, 3]: mean 2, devs -+1, Bessel std sqrt(2) -> -+0.707107
    # task 1 tokens [10, 20, 30]: mean 20, devs [-10,0,10], Bessel std 10 -> [-1, 0, 1]
    adv_BT = torch.tensor([[1.0, 3.0, 99.0], [10.0, 20.0, 30.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    got = normalize_by_task(adv_BT, mask_BT, torch.tensor([0, 1]), eps=1e-6)
    w = 1 / (math.sqrt(2) + 1e-6)
    assert got[0].tolist() == pytest.approx([-w, w, 0.0], rel=1e-6)
    assert got[1].tolist() == pytest.approx([-10 / (10 + 1e-6), 0.0, 10 / (10 + 1e-6)], rel=1e-6)


def test_normalize_by_task_matches_loop():
    gen = torch.Generator().manual_seed(3)
    adv_BT = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    mask_BT = (torch.rand(8, 5, generator=gen) > 0.3).to(torch.float64)
    task_B = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0])
    got = normalize_by_task(adv_BT, mask_BT, task_B)
    for task in range(3):
        table = [[adv_BT[i, t].item() if (mask_BT[i, t] > 0 and task_B[i] == task) else None for t in range(5)]
                 for i in range(8)]
        exp = _loop_whiten(table)
        for i in range(8):
            if task_B[i] == task:
                assert got[i].tolist() == pytest.approx(exp[i], rel=1e-9, abs=1e-12)


def test_misspelled_estimator_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        ADVANTAGES["grpoo"]
    msg = str(err.value)
    assert "Did you mean 'grpo'" in msg
    for name in ["dr_grpo", "gae", "grpo", "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo"]:
        assert name in msg


@pytest.mark.parametrize("name", ["reinforce_pp", "gae"])
def test_reward_on_padding_does_not_leak_into_peers(name):
    # docs/design.md, correctness rule 10 (verl PR#6310): an empty response whose reward was written at index -1, and
    # a reward on the first pad after a response, must not change anyone's advantage.
    clean = [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    dirty = [[0.0, 1.0, 7.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    values = [[0.1, 0.2, 0.3]] * 3
    kw = dict(lengths=[2, 0, 1], T=3, values=values)
    a = run(name, make_inputs([1, 1, 1], token_rewards=clean, **kw)).advantages_BT
    b = run(name, make_inputs([1, 1, 1], token_rewards=dirty, **kw)).advantages_BT
    assert torch.equal(a, b)
    assert (b[1] == 0).all()
