"""Non-finite numbers never reach the weights (issue 14): the config refuses inf/nan, an optimizer
step that leaves a non-finite weight is undone and counted, repeated ones halt the run."""

from __future__ import annotations

import copy

import pytest
import torch
from typer.testing import CliRunner

from tether.cli import app
from tether.config import ConfigError, load_config
from tether.train.step import TrainingHalted, UpdateState, do_guarded_step


@pytest.mark.parametrize("override", ["train.lr=inf", "train.lr=.nan", "sft.lr=-inf", "algo.kl.coef=nan",
                                      "health.thresholds={grad_spike.factor: .inf}",
                                      "reward.components=[{name: exact_match, weight: .nan}]"])
def test_config_refuses_nonfinite_numbers(override):
    with pytest.raises(ConfigError, match="finite number"):
        load_config(None, [override])


def test_cli_refuses_an_infinite_lr_before_training(tmp_path):
    r = CliRunner().invoke(app, ["train", str(tmp_path / "none.yaml"), "train.lr=inf"])
    assert r.exit_code == 2
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: .inf\n")
    r = CliRunner().invoke(app, ["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2 and "train.lr" in r.output and "finite" in r.output
    assert not (tmp_path / "run").exists()


def _setup(lr=1e-2):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters(), lr=lr)
    return lin, opt, list(lin.parameters())


def _backward(lin):
    lin(torch.randn(2, 4)).pow(2).sum().backward()


def test_a_step_that_makes_weights_nan_is_undone_counted_and_repeats_halt():
    lin, opt, params = _setup()
    state = UpdateState()
    _backward(lin)
    assert do_guarded_step(opt, None, params, 1.0, 3, state) > 0  # a good step: optimizer state exists now
    weights, opt_state = [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())
    real_step = opt.step

    def poisoned_step(*a, **k):  # a step whose update is NaN (e.g. a NaN slipping past the gradient check)
        real_step(*a, **k)
        with torch.no_grad():
            params[0][0, 0] = float("nan")

    opt.step = poisoned_step
    _backward(lin)
    g = do_guarded_step(opt, None, params, 1.0, 3, state)
    assert g != g  # NaN: the step was undone
    assert state.nonfinite_steps == 1 and state.bad_steps_in_a_row == 1
    # the undone step left weights and Adam moments exactly as before it
    assert all(torch.equal(a, b) for a, b in zip(weights, params))
    for k, v in opt_state["state"].items():
        for name, t in v.items():
            assert torch.equal(opt.state_dict()["state"][k][name], t), name
    with pytest.raises(TrainingHalted, match="made the weights non-finite"):
        for _ in range(3):
            _backward(lin)
            do_guarded_step(opt, None, params, 1.0, 3, state)
    assert all(torch.isfinite(p).all() for p in params)


def test_a_huge_learning_rate_cannot_blow_the_weights_up():
    lin, opt, params = _setup(lr=1e30)  # finite, so the config allows it; fp32 weights of 1e30 overflow any norm
    state = UpdateState()
    before = [p.detach().clone() for p in params]
    _backward(lin)
    gnorm = do_guarded_step(opt, None, params, 1.0, 3, state)
    assert gnorm != gnorm and state.nonfinite_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, params))
