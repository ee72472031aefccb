"""Learned rewards: Bradley-Terry by hand, judge score parsing, batched components as values
(garbage, hangs, slow judges, wrong lengths), an HTTP judge on loopback, and a reward model trained
and used end to end on a tiny model."""

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tether.config import RewardConfig
from tether.rewards import run_rewards
from tether.rewards.judge import _CACHE, judge, parse_judge_score
from tether.rewards.rm import compute_bradley_terry_loss, make_pairs_from_groups, read_pairs
from tether.types import Outcome


def test_bradley_terry_loss_and_gradient_by_hand():
    # pair 1: r_c = 1.0, r_r = 0.0 -> d = 1;  pair 2: r_c = 0.0, r_r = 2.0 -> d = -2
    rc = torch.tensor([1.0, 0.0], requires_grad=True)
    rr = torch.tensor([0.0, 2.0], requires_grad=True)
    loss = compute_bradley_terry_loss(rc, rr)
    value = float(loss.detach())
    # loss = mean(-log sigmoid(d)) = (log(1 + e^-1) + log(1 + e^2)) / 2 = (0.313262 + 2.126928) / 2
    assert value == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(2))) / 2, abs=1e-6)
    assert value == pytest.approx(1.220095, abs=1e-5)
    loss.backward()
    # dL/dr_c_i = -(1 - sigmoid(d_i)) / 2 ; dL/dr_r_i = +(1 - sigmoid(d_i)) / 2
    s1, s2 = 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(2))
    assert rc.grad.tolist() == pytest.approx([-(1 - s1) / 2, -(1 - s2) / 2], abs=1e-6)
    assert rr.grad.tolist() == pytest.approx([(1 - s1) / 2, (1 - s2) / 2], abs=1e-6)
    assert rc.grad.tolist() == pytest.approx([-0.134470, -0.440399], abs=1e-5)


@pytest.mark.parametrize("text,scale,expected", [
    ("Score: 7/10", 10, 0.7),
    ("score = 3", 10, 0.3),
    ("Rating: **8**", 10, 0.8),
    ("The answer is wrong. [[2]]", 10, 0.2),
    ("I'd give it 4 out of 5", 10, 0.8),       # an explicit denominator wins over the scale
    ("3/5", 10, 0.6),
    ("First 2/10 then, on reflection, Score: 9/10", 10, 0.9),  # the most explicit pattern, last match
    ("9", 10, 0.9),
    ("Score: 15/10", 10, 1.0),                  # clamped
    ("Score: -3", 10, 0.0),
    ("Score: 0.8", 1, 0.8),
    ("The response looks fine to me.", 10, None),
    ("", 10, None),
    ("Score: 5/0", 10, None),
])
def test_judge_score_parsing_table(text, scale, expected):
    got = parse_judge_score(text, scale)
    assert got == (None if expected is None else pytest.approx(expected))


def _cfg(kwargs, name="tests.unit.rewards.test_learned_rewards:fake_judge", on_error="mask", timeout=5.0):
    return RewardConfig(components=[{"name": "exact_match"}, {"name": name, "weight": 0.5, "kwargs": kwargs}],
                        isolation="inline", on_error=on_error, timeout_s=timeout, max_error_rate=1.0)


def fake_judge(texts, tasks, mode="ok", delay=0.0):
    """A batched component whose behaviour the test picks."""
    time.sleep(delay)
    if mode == "raise":
        raise RuntimeError("judge exploded")
    if mode == "short":
        return [1.0]
    if mode == "garbage":
        return [parse_judge_score("no idea") if i % 2 else 0.5 for i in range(len(texts))]
    return [0.5 + 0.1 * i for i in range(len(texts))]


fake_judge.batched = True

TEXTS = ["dcba", "xx", "cba"]
TASKS = [{"prompt": "reverse abcd:", "answer": "dcba"}, {"prompt": "reverse ab:", "answer": "ba"},
         {"prompt": "reverse abc:", "answer": "cba"}]


def test_batched_component_scores_every_sample_once():
    results, m = run_rewards(TEXTS, TASKS, _cfg({"mode": "ok"}))
    assert [r.outcome for r in results] == [Outcome.OK] * 3
    assert [r.components["tests.unit.rewards.test_learned_rewards:fake_judge"] for r in results] == pytest.approx([0.5, 0.6, 0.7])
    assert [r.total for r in results] == pytest.approx([1.25, 0.3, 1.35])  # exact_match + 0.5 * judge
    assert [r.correct for r in results] == [True, False, True]  # correctness stays the verifier's


def test_judge_garbage_is_counted_and_masked_or_zeroed():
    results, m = run_rewards(TEXTS, TASKS, _cfg({"mode": "garbage"}))
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.INVALID, Outcome.OK]
    assert m["reward/invalid_count"] == 1.0
    zero, mz = run_rewards(TEXTS, TASKS, _cfg({"mode": "garbage"}, on_error="zero"))
    assert zero[1].outcome is Outcome.OK and zero[1].total == 0.0 and "scored 0" in zero[1].error
    assert mz["reward/tests.unit.rewards.test_learned_rewards:fake_judge/fail_count"] == 1.0


def test_hung_judge_times_out_and_errors_are_values():
    t0 = time.monotonic()
    results, m = run_rewards(TEXTS, TASKS, _cfg({"mode": "ok", "delay": 30.0}, timeout=0.2))
    assert time.monotonic() - t0 < 20  # 0.2 s per sample x 3 = 0.6 s budget; wide margin for a busy machine
    assert all(r.outcome is Outcome.TIMEOUT for r in results) and m["reward/timeout_count"] == 3.0
    results, m = run_rewards(TEXTS, TASKS, _cfg({"mode": "raise"}))
    assert all(r.outcome is Outcome.ERROR and "judge exploded" in r.error for r in results)
    results, _ = run_rewards(TEXTS, TASKS, _cfg({"mode": "short"}))
    assert all(r.outcome is Outcome.INVALID and "expected a list of 3" in r.error for r in results)


def test_slow_judge_within_its_budget_is_fine():
    results, _ = run_rewards(TEXTS, TASKS, _cfg({"mode": "ok", "delay": 0.3}, timeout=5.0))
    assert all(r.outcome is Outcome.OK for r in results)


class _Judge(BaseHTTPRequestHandler):
    replies = {"dcba": "Looks right. Score: 9/10", "xx": "Score: 1/10", "cba": "hmm"}
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        _Judge.seen.append((self.headers.get("Authorization"), body["model"]))
        response = prompt.split("Response: ")[1].split("\n")[0]
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": self.replies[response]}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def test_http_judge_against_a_local_stub_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _CACHE.clear()
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        scores = judge(TEXTS, TASKS, base_url=url, model_name="j", api_key="k")
        assert scores[:2] == pytest.approx([0.9, 0.1]) and scores[2] is None
        assert _Judge.seen[0] == ("Bearer k", "j")
        n = len(_Judge.seen)
        judge(TEXTS, TASKS, base_url=url, model_name="j", api_key="k")
        assert len(_Judge.seen) == n  # cached by content hash: no second request
        results, m = run_rewards(TEXTS, TASKS, RewardConfig(
            components=[{"name": "exact_match"}, {"name": "judge", "kwargs": {"base_url": url, "model_name": "j"}}],
            max_error_rate=1.0))
        assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK, Outcome.INVALID]
    finally:
        server.shutdown()


def test_judge_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        judge(["a"], [{"prompt": "p"}])


def test_pairs_file_errors_name_file_and_line(tmp_path):
    from tether.tasks import DataError

    p = tmp_path / "pairs.jsonl"
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: missing or non-string field\(s\) \['rejected'\]"):
        read_pairs(p)
    p.write_text("{not json\n")
    with pytest.raises(DataError, match="pairs.jsonl:1: not valid JSON"):
        read_pairs(p)


def test_pairs_from_verifier_outcomes():
    from tether.types import RewardResult, StopReason, Trajectory, TrajectoryGroup

    def traj(text, ok):
        return Trajectory(task_id="t", turns=(), reward=RewardResult(float(ok), {}, Outcome.OK, ok),
                          stop=StopReason.EOS, info={"text": text})

    g = TrajectoryGroup("t", (traj("good1", True), traj("bad1", False), traj("good2", True), traj("bad2", False)),
                        {"prompt": "p"})
    assert make_pairs_from_groups([g]) == [{"prompt": "p", "chosen": "good1", "rejected": "bad1"},
                                           {"prompt": "p", "chosen": "good2", "rejected": "bad2"}]


@pytest.mark.slow
def test_reward_model_trains_and_scores(tmp_path):
    """A tiny RM learns to prefer the reversed word; the `reward_model` component then ranks rollouts."""
    import random

    from tether.config import load_config
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.recipes.rm import run_rm

    rng = random.Random(0)
    rows = []
    for _ in range(300):
        w = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
        wrong = "".join(rng.choice("xyz") for _ in range(len(w)))  # an easy preference: a test of the loop
        rows.append({"prompt": f"reverse {w}:", "chosen": w[::-1], "rejected": wrong})
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    tok = build_tokenizer([r["prompt"] + r["chosen"] + r["rejected"] for r in rows], 256)
    build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), tok,
                     tmp_path / "base", seed=0)
    cfg = load_config(None, [f"model.path={tmp_path / 'base'}", f"rm.pairs={tmp_path / 'pairs.jsonl'}", "rm.steps=60",
                             "rm.lr=1e-3", "rm.batch_size=32", "rm.eval_every=0", "logging.progress=false", "run.threads=1"])
    summary = run_rm(cfg, tmp_path / "rm")
    assert summary["final_pair_accuracy"] >= 0.8 > summary["baseline_pair_accuracy"] - 0.2
    rm_dir = tmp_path / "rm" / "final_model"
    results, m = run_rewards(["dcba", "zyxz"], [{"prompt": "reverse abcd:", "answer": "dcba"}] * 2, RewardConfig(
        components=[{"name": "exact_match"}, {"name": "reward_model", "kwargs": {"path": str(rm_dir), "normalize": "sigmoid"}}]))
    assert results[0].components["reward_model"] > results[1].components["reward_model"]
    assert 0 < results[1].components["reward_model"] < 1
    from tether.runs.resume import RunDirError

    with pytest.raises(RunDirError, match="already holds a run"):  # a finished RM run is never overwritten
        run_rm(cfg, tmp_path / "rm")
    assert (rm_dir / "model.safetensors").is_file()


TINY_RL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
           "model.tiny.intermediate_size=64", "logging.progress=false", "logging.tensorboard=false",
           "logging.samples_per_step=0", "run.threads=1", "checkpoint.every=0", "eval.samples=1", "eval.problems=2",
           "data.task=reverse", "data.train_size=16", "data.eval_size=2", "train.steps=2",
           "rollout.problems_per_step=2", "rollout.n=2", "rollout.sampling.max_new_tokens=4",
           "eval.sampling.max_new_tokens=4", "reward.on_error=zero", "reward.max_error_rate=1.0"]


@pytest.mark.slow
@pytest.mark.parametrize("judge_model", ["policy", "dir"])
def test_judge_rewarded_and_self_critique_runs_complete(tmp_path, judge_model):
    """A random tiny judge mostly fails to answer with a score: those calls are counted (INVALID)
    and scored 0 under on_error=zero; the run completes."""
    from tether.config import TinyModelConfig, load_config
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.recipes.rl import run_rl

    model = "policy"
    if judge_model == "dir":
        tok = build_tokenizer(["Score: 7/10 reverse abc: cba"], 256)
        build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok,
                         tmp_path / "judge", seed=0)
        model = str(tmp_path / "judge")
    comps = ("reward.components=[{name: exact_match}, {name: judge, weight: 0.5, kwargs: {model: '" + model +
             "', max_new_tokens: 4}}]")
    cfg = load_config(None, TINY_RL + [comps])
    summary = run_rl(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r.get("step", 0) > 0 and "reward/judge/fail_count" in r]
    assert len(step_rows) == 2  # the judge was called on every step
    # 2 problems x 2 rollouts per step: each sample's judge call either parsed (a value in [0, 1]) or was counted
    for r in step_rows:
        assert 0 <= r["reward/judge/fail_count"] <= 4
        assert r["reward/judge/fail_count"] == 4 or 0.0 <= r["reward/judge/mean"] <= 1.0


def test_rm_save_at_is_the_model_of_the_shorter_run(tmp_path):
    """rm.save_at=[3] in a 5-step run saves step-3/final_model: the same weights, and the same
    held-out pair accuracy, as a 3-step run (constant learning rate, same batches)."""
    import random

    from safetensors.torch import load_file

    from tether.config import TinyModelConfig, load_config
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.recipes.rm import run_rm

    rng = random.Random(1)
    rows = [{"prompt": f"reverse {w}:", "chosen": w[::-1], "rejected": w} for w in
            ("".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(40))]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    tok = build_tokenizer([r["prompt"] + r["chosen"] for r in rows], 256)
    build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok,
                     tmp_path / "base", seed=0)
    base = [f"model.path={tmp_path / 'base'}", f"rm.pairs={tmp_path / 'pairs.jsonl'}", "rm.batch_size=8",
            "rm.eval_every=0", "logging.progress=false", "run.threads=1"]
    long = run_rm(load_config(None, base + ["rm.steps=5", "rm.save_at=[3]"]), tmp_path / "long")
    short = run_rm(load_config(None, base + ["rm.steps=3"]), tmp_path / "short")
    snap = json.loads((tmp_path / "long" / "step-3" / "summary.json").read_text())
    assert snap["steps"] == 3 and snap["final_pair_accuracy"] == short["final_pair_accuracy"]
    assert long["steps"] == 5 and not (tmp_path / "short" / "step-3").exists()
    a = load_file(tmp_path / "long" / "step-3" / "final_model" / "model.safetensors")
    b = load_file(tmp_path / "short" / "final_model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = load_file(tmp_path / "long" / "final_model" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the 5-step model went on training
