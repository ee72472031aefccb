"""A synthetic but complete run directory, written with the real writers (RunDir)."""

from __future__ import annotations

import math
from html.parser import HTMLParser
from pathlib import Path

from tether.io.run_dir import make_run_dir


def make_fake_run(root: Path, steps: int = 12, n: int = 4, bp: int = 8, health: bool = True, reward_shift: float = 0.0) -> Path:
    rd = make_run_dir(root)
    (rd.root / "config.yaml").write_text(f"run:\n  name: fake\nrollout:\n  n: {n}\n  problems_per_step: {bp}\n"
                                         "algo:\n  advantage:\n    name: grpo\n")
    rd.append_metrics(0, {"eval/pass@1": 0.2, "eval/pass@2": 0.3, "eval/greedy_accuracy": 0.25})
    for s in range(1, steps + 1):
        m = {"reward/mean": 0.2 + 0.03 * s + reward_shift, "reward/std": 0.4, "accuracy": 0.2 + 0.03 * s,
             "kl_loss": 0.001 * s, "entropy": 1.5 - 0.05 * s, "response_length/mean": 10 + s % 3,
             "clip_frac": 0.01, "grad_norm": 0.5 if s != 7 else math.nan, "rollout/tokens_per_s": 1000.0,
             "train/tokens_per_s": 5000.0, "pg_loss": 0.01, "time/step": 0.2, "rollout/gen_tokens": 320.0}
        if s == steps:
            m.update({"eval/pass@1": 0.4, "eval/pass@2": 0.5, "eval/greedy_accuracy": 0.45})
        rd.append_metrics(s, m)
        rows = [{"task_id": f"t{i}", "prompt": f"2+{i}=", "answer": str(2 + i),
                 "completion": str(2 + i) if i % 2 else "<script>alert(1)</script>",
                 "reward": float(i % 2), "correct": bool(i % 2), "components": {"exact_match": float(i % 2)},
                 "outcome": "ok", "stop": "eos", "tokens": 2} for i in range(4)]
        if s == steps:  # a multi-turn episode, as environment runs will log it
            rows.insert(0, {"task_id": "env-1", "reward": 1.0, "correct": True, "turns": [
                {"role": "user", "content": "what is 3*7?"},
                {"role": "assistant", "content": "let me compute", "tool_calls": [{"name": "calc", "arguments": {"expr": "3*7"}}]},
                {"role": "tool", "content": "21", "latency_s": 0.01},
                {"role": "assistant", "content": "<answer>21</answer>"}]})
        rd.write_samples(s, rows)
    for step in (0, steps):
        rows = [{"task_id": f"e{p}", "prompt": f"q{p}", "answer": "1", "completion": "1" if (j < p + (step > 0)) else "0",
                 "reward": float(j < p + (step > 0)), "correct": j < p + (step > 0), "pred": "1" if (j < p + (step > 0)) else "0",
                 "score": -float(j)} for p in range(3) for j in range(4)]
        rd.write_samples(step, rows, kind="eval")
    if health:
        rd.append_health({"kind": "finding", "step": 5, "detector": "entropy_collapse", "severity": "warn",
                          "evidence": {"entropy": 0.2}})
        rd.append_health({"kind": "action", "event": "apply", "step": 6, "action": "raise_entropy_coef",
                          "changes": [{"key": "algo.entropy_coef", "old": 0.0, "new": 0.01}]})
        rd.append_health({"kind": "something_new", "note": "a record kind the report has never seen"})
    rd.write_summary({"kind": "rl", "steps": steps, "baseline_accuracy": 0.2, "final_accuracy": 0.4, "wall_seconds": 3.5,
                      "health": {"healthy": False}})
    return rd.root


class DomIndex(HTMLParser):
    """Tags with their attributes, plus text, for assertions on the rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and all(
            v in (a.get(k.rstrip("_")) or "").split() or a.get(k.rstrip("_")) == v for k, v in attrs.items())]


def parse(text: str) -> DomIndex:
    d = DomIndex()
    d.feed(text)
    return d
