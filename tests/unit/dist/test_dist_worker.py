"""The rollout worker in-process (no Ray): the weight-sync handshake, admission, cross-policy
log-probs, turn-level partial rollouts, and the merging of shard metrics."""

import copy
import dataclasses

import pytest
import torch

from tether.config import load_config
from tether.policy.weights import compute_checksum, make_model_bundle, to_numpy_state
from tether.dist.worker import Order, RolloutWorker, StaleWorkerError, merge_metrics
from tether.policy.hf import compute_logprobs

PROBE = [3, 17, 5, 9, 12, 4, 8]


def _trainer_copy(policy):
    return dataclasses.replace(policy, model=copy.deepcopy(policy.model))


def _probe(policy):
    ids = torch.tensor([PROBE])
    with torch.no_grad():
        return compute_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0][0, 1:]


def _train_step(trainer, version):
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.version = version
    arrays = to_numpy_state(trainer.model.state_dict())
    return arrays, compute_checksum(arrays)


def test_handshake_log_probs_follow_the_new_weights(tiny):
    cfg, train, policy = tiny
    trainer = _trainer_copy(policy)
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=1)
    before = torch.tensor(w.score_probe(PROBE))
    assert torch.allclose(before, _probe(trainer), atol=1e-6)
    arrays, checksum = _train_step(trainer, 1)
    assert (torch.tensor(w.score_probe(PROBE)) - _probe(trainer)).abs().max() > 1e-3  # stale until synced
    ack = w.load_weights(1, arrays, checksum, PROBE)
    assert ack["ok"] and ack["version"] == 1 and ack["checksum"] == checksum
    assert (torch.tensor(ack["probe_logprobs"]) - _probe(trainer)).abs().max() < 1e-5  # follows the new weights
    assert (torch.tensor(ack["probe_logprobs"]) - before).abs().max() > 1e-3


def test_a_bad_checksum_keeps_the_old_version_and_orders_are_refused(tiny):
    cfg, train, policy = tiny
    trainer = _trainer_copy(policy)
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=1)
    arrays, _ = _train_step(trainer, 1)
    ack = w.load_weights(1, arrays, "0" * 16, PROBE)  # what arrived is not what was sent
    assert not ack["ok"] and ack["version"] == 0 and "checksum" in ack["error"]
    order = Order(1, 0, train[:2], cfg, min_version=1, meta={"per_round": 2})
    with pytest.raises(StaleWorkerError, match="holds version 0"):
        w.run_order(order)
    res = w.run_order(dataclasses.replace(order, min_version=0))
    assert len(res["groups"]) == 2 and all(t.turns[0].policy_version == 0 for g in res["groups"] for t in g.trajectories)


def test_lora_worker_gets_the_adapter_shape_once_and_only_adapter_weights_after(tiny):
    from tether.config import LoraConfig
    from tether.policy.weights import make_publish_state
    from tether.policy.lora import apply_lora

    cfg, _, policy = tiny
    trainer = _trainer_copy(policy)
    apply_lora(trainer.model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=1)
    assert torch.allclose(torch.tensor(w.score_probe(PROBE)), _probe(trainer), atol=1e-6)
    with torch.no_grad():  # a training step: only the adapters move
        for n, p in trainer.model.named_parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn_like(p))
    sent = make_publish_state(trainer.model)
    assert sent and all("lora_" in k for k in sent) and len(sent) < len(trainer.model.state_dict()) / 2
    arrays = to_numpy_state(sent)
    ack = w.load_weights(1, arrays, compute_checksum(arrays), PROBE)
    assert ack["ok"] and ack["version"] == 1
    assert (torch.tensor(ack["probe_logprobs"]) - _probe(trainer)).abs().max() < 1e-5  # the adapters took effect
    full = to_numpy_state(trainer.model.state_dict())  # more than the adapters: refused, the version stays
    ack = w.load_weights(2, full, compute_checksum(full), PROBE)
    assert not ack["ok"] and ack["version"] == 1 and "do not fit" in ack["error"]


def test_inflight_weights_reach_a_running_order_between_decode_steps(tiny, tiny_overrides):
    """dist.inflight: load_weights (another actor thread) hands the weights to the running order's
    decode loop and acks once it switched; the decode loop here waits at its 3rd poll of the feed for the offer,
    so the switch lands mid-generation deterministically."""
    import threading

    from tether.policy.inflight import WeightFeed

    cfg = load_config(None, tiny_overrides + ["dist.inflight=true", "dist.max_staleness=1", "dist.correction=tis",
                                              "algo.correction.mode=truncate", "rollout.sampling.max_new_tokens=8"])
    _, train, policy = tiny
    trainer = _trainer_copy(policy)
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=1)
    offered = threading.Event()

    class WaitAtThirdStep(WeightFeed):
        polls = 0

        def offer(self, version, state):
            super().offer(version, state)
            offered.set()

        def take(self):
            self.polls += 1
            if self.polls == 3:
                assert offered.wait(120), "load_weights never offered"
            return super().take()

    w.policy.weight_feed = WaitAtThirdStep()
    arrays, checksum = _train_step(trainer, 1)
    out = {}
    order = threading.Thread(target=lambda: out.update(res=w.run_order(Order(1, 0, train[:2], cfg, 0, meta={"per_round": 2}))))
    order.start()
    while not w._order_lock.locked() and order.is_alive():  # wait for the order to hold the worker
        order.join(0.01)
    ack = w.load_weights(1, arrays, checksum, PROBE)
    order.join(120)
    assert ack["ok"] and ack["version"] == 1 and w.inflight_switches == 1  # adopted by the decode loop, not after
    assert (torch.tensor(ack["probe_logprobs"]) - _probe(trainer)).abs().max() < 1e-5
    assert w.policy.weight_feed.polls > 3 and out["res"]["version"] == 1  # the order went on with version 1
    assert out["res"]["metrics"]["rollout/inflight_switch_count"] == 1.0
    assert all(t.turns[0].policy_version == 0 for g in out["res"]["groups"] for t in g.trajectories)  # started at 0
    switched = [t.turns[0].action_versions for g in out["res"]["groups"] for t in g.trajectories]
    switched = [v for v in switched if v]  # the samples that were running at the switch: version 0, then 1
    assert switched and all(set(v) == {0, 1} and v == tuple(sorted(v)) for v in switched), switched
    assert len({v.index(1) for v in switched}) == 1  # one batch, one switch point


def test_cross_policy_log_probs_come_from_the_policy_that_acted(tiny, tiny_overrides):
    _, train, policy = tiny
    cfg = load_config(None, tiny_overrides + ["dist.cross_policy.pool_size=1", "dist.cross_policy.rule=uniform",
                                    "dist.correction=tis"])
    trainer = _trainer_copy(policy)
    old = _trainer_copy(trainer)
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=3)
    arrays, checksum = _train_step(trainer, 1)
    assert w.load_weights(1, arrays, checksum)["ok"]
    seen = set()
    for i in range(8):
        res = w.run_order(Order(1, 0, train[2 * i:2 * i + 2], cfg, 1, meta={"per_round": 2}))
        actor = {0: old, 1: trainer}[res["acting_version"]]
        seen.add(res["acting_version"])
        for g in res["groups"]:
            for t in g.trajectories:
                turn = t.turns[0]
                assert turn.policy_version == res["acting_version"]
                ids = torch.tensor([list(turn.context_ids) + list(turn.action_ids)])
                lp = compute_logprobs(actor, ids, torch.ones_like(ids), cfg.rollout.sampling.temperature)[0][0]
                n = len(turn.action_ids)
                assert torch.allclose(lp[-n:], torch.tensor(turn.action_logprobs), atol=1e-4)
    assert seen == {0, 1}


def test_partial_rollouts_park_and_record_the_version_switch_per_turn(tiny_overrides, tmp_path):
    import tests.integration.dist_stubs  # noqa: F401  (registers the fixed-length environment)
    from tether.train.setup import setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus

    cfg = load_config(None, tiny_overrides + ["data.task=_test_turns", "data.task_kwargs={turns: 3}", "env.max_turns=6",
                                    "dist.max_staleness=1", "dist.correction=tis", "dist.partial.token_budget=20",
                                    "dist.partial.max_parks=1", "rollout.sampling.max_new_tokens=8"])
    train, _ = setup_problems(cfg.data)
    trainer = setup_policy(cfg.model, cfg.run.seed, tmp_path, lambda: compute_tokenizer_corpus(cfg.data.task, train))
    w = RolloutWorker(0, make_model_bundle(trainer), cfg, seed=1)
    out = []
    for step in range(3):
        # two episodes x <= 8 tokens per turn: the budget of 20 is crossed during turn 2 -> parked
        out.append(w.run_order(Order(step, 0, train[2 * step:2 * step + 2], cfg, step - 1, meta={"per_round": 2})))
        arrays, checksum = _train_step(trainer, step + 1)
        assert w.load_weights(step + 1, arrays, checksum)["ok"]
    assert len(out[0]["groups"]) == 0 and out[0]["parked"] == 2
    for step in (1, 2):
        assert out[step]["resumed"] == 2 and len(out[step]["groups"]) == 2
        for g in out[step]["groups"]:
            for t in g.trajectories:
                versions = [turn.policy_version for turn in t.turns]
                assert len(versions) == 3 and versions[0] == versions[1] == step - 1 and versions[2] == step


def test_merge_metrics_rules():
    a = {"rollout/gen_tokens": 10.0, "time/generate": 1.0, "reward/error_count": 1.0, "accuracy": 1.0,
         "response_length/max": 5.0, "response_length/min": 2.0, "env/episodes": 4.0}
    b = {"rollout/gen_tokens": 30.0, "time/generate": 2.0, "reward/error_count": 0.0, "accuracy": 0.0,
         "response_length/max": 9.0, "response_length/min": 1.0, "env/episodes": 4.0}
    m = merge_metrics([(a, 1.0), (b, 3.0)])
    assert m["rollout/gen_tokens"] == 40.0 and m["time/generate"] == 3.0 and m["reward/error_count"] == 1.0
    assert m["accuracy"] == pytest.approx(0.25) and m["env/episodes"] == 8.0
    assert m["response_length/max"] == 9.0 and m["response_length/min"] == 1.0
