"""A user environment in one file, outside the source tree, trains through `tether train`
(`data.task=package.module:factory`, the module found on PYTHONPATH; no change to tether).
The file is the code block of docs/add-an-environment.md, so the documented example is the
one that is tested."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
model: {tiny: {hidden_size: 48, num_layers: 1, num_heads: 2, intermediate_size: 96, vocab_size: 400}}
data: {train_size: 16, eval_size: 4}
rollout: {n: 2, problems_per_step: 2, sampling: {max_new_tokens: 24}}
train: {steps: 2}
eval: {samples: 2, sampling: {max_new_tokens: 24}}
env: {max_turns: 3}
run: {threads: 1}
checkpoint: {every: 0}
logging: {progress: false, tensorboard: false, samples_per_step: 0}
"""


def test_env_from_one_file_trains_from_the_cli(tmp_path):
    doc = (ROOT / "docs" / "add-an-environment.md").read_text()
    (tmp_path / "wordenv.py").write_text(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
    (tmp_path / "c.yaml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "tether.cli", "train", str(tmp_path / "c.yaml"), "data.task=wordenv:make_spec",
                        "--run-dir", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["nonfinite_steps"] == 0
    steps = [json.loads(line) for line in open(run / "metrics.jsonl") if '"pg_loss"' in line]
    assert len(steps) == 2 and all(s["env/episodes"] == 4 for s in steps)  # episodes of the user's env
    assert 0 <= summary["final_accuracy"] <= 1
