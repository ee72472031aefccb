"""Bad input of every kind ends in one line naming the problem and the fix, exit code 2, no traceback.

Each case runs the `tether` command in-process (typer's CliRunner) and asserts the exit code, a
specific fragment of the message, exactly one `tether: error:` line, and no "Traceback". Most
fail in tether.preflight before a model is built; a few need a tiny model (overlong prompts,
registry names) or a saved Hugging Face directory (`model_dir`). A handful run through a real
subprocess to prove that nothing reaches stderr but the one line, and that `--debug` re-raises.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether.cli import app

runner = CliRunner()
TINY = ["model.tiny.hidden_size=16", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=32", "model.tiny.vocab_size=64", "logging.progress=false",
        "logging.tensorboard=false", "run.threads=1", "checkpoint.every=0", "data.train_size=16", "data.eval_size=4",
        "eval.samples=1", "eval.problems=2", "rollout.problems_per_step=2", "rollout.n=2",
        "rollout.sampling.max_new_tokens=4", "eval.sampling.max_new_tokens=4", "train.steps=1",
        "reward.isolation=inline", "sft.steps=1"]
ROOT = Path(__file__).resolve().parents[2]


def assert_one_line_error(result, fragment: str, code: int = 2) -> None:
    out = result.output
    assert result.exit_code == code, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("tether: error:")]
    assert len(errors) == 1, out
    assert fragment in errors[0], (fragment, errors[0])


def write(path: Path, content: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def config(t: Path, text: str = "train:\n  steps: 1\n") -> str:
    return write(t / "c.yaml", text)


def train(t: Path, *overrides: str, cmd: str = "train") -> list[str]:
    return [cmd, config(t), "--run-dir", str(t / "run"), *TINY, *overrides]


def jsonl(t: Path, content: str | bytes, *overrides: str, name: str = "d.jsonl") -> list[str]:
    return train(t, "data.task=jsonl", f"data.path={write(t / name, content)}", *overrides)


GOOD = '{"prompt": "1+1=", "answer": "2"}\n'
WITH_ID = '{"id": 1, "prompt": "1+1=", "answer": "2"}\n'

# ----------------------------------------------------------------------------- config (before any model)

CONFIG_CASES = [
    ("empty file", lambda t: ["train", config(t, "")], "the config file is empty"),
    ("comments only", lambda t: ["train", config(t, "# nothing yet\n")], "the config file is empty"),
    ("not UTF-8", lambda t: ["train", config(t, b"train:\n  steps: \xff\n")], "c.yaml:2: not UTF-8 text (byte 0xff)"),
    ("not YAML", lambda t: ["train", config(t, "train: [1, 2\n")], "not valid YAML"),
    ("top level list", lambda t: ["train", config(t, "- train\n")], "the top level must be a mapping"),
    ("config is a directory", lambda t: ["train", str(t)], "is a directory; expected a YAML config file"),
    ("config missing", lambda t: ["train", str(t / "nope.yaml")], "config file not found"),
    ("unknown section", lambda t: ["train", config(t, "trian:\n  steps: 1\n")], "did you mean 'train'"),
    ("unknown nested key", lambda t: train(t, "train.stepz=3"), "did you mean 'train.steps'"),
    ("wrong type", lambda t: train(t, "train.lr=fast"), "train.lr: Input should be a valid number"),
    ("out of range", lambda t: train(t, "rollout.n=0"), "rollout.n: Input should be greater than or equal to 1"),
    ("top_p above 1", lambda t: train(t, "rollout.sampling.top_p=1.5"), "rollout.sampling.top_p"),
    ("bad literal", lambda t: train(t, "algo.agg.mode=mean"), "algo.agg.mode"),
    ("bad on_overlong", lambda t: train(t, "data.on_overlong=truncate"), "data.on_overlong"),
    ("betas of one number", lambda t: train(t, "train.betas=[0.9]"), "train.betas"),
    ("override without =", lambda t: train(t, "train.steps"), "is not of the form key.path=value"),
    ("override empty segment", lambda t: train(t, "train..steps=1"), "empty key segment"),
    ("kl reset without coef", lambda t: train(t, "algo.kl.reset_every=5"), "reset_every does nothing"),
    ("grpo with one rollout", lambda t: train(t, "rollout.n=1"), "set rollout.n >= 2"),
    ("mask without a floor", lambda t: train(t, "algo.correction.mode=mask"), "needs algo.correction.threshold_low"),
    ("correctness not a component", lambda t: train(t, "reward.correctness=format"), "is not one of reward.components"),
    ("jsonl without a path", lambda t: train(t, "data.task=jsonl"), "data.task=jsonl needs data.path"),
    ("step credit with grpo", lambda t: train(t, "env.credit=step"), "env.credit=step keeps step rewards"),
    ("dynamic sampling, one rollout", lambda t: train(t, "rollout.n=1", "algo.advantage.name=reinforce_pp",
                                                      "algo.dynamic_sampling.enable=true"), "needs rollout.n >= 2"),
    ("train.steps=0", lambda t: train(t, "train.steps=0"), "train.steps=0: nothing to train"),
    ("sft.steps=0", lambda t: train(t, "sft.steps=0", cmd="sft"), "sft.steps=0: nothing to train"),
]

# ----------------------------------------------------------------------------- data

DATA_CASES = [
    ("jsonl missing", lambda t: train(t, "data.task=jsonl", f"data.path={t / 'none.jsonl'}"), "none.jsonl: file not found"),
    ("jsonl is a directory", lambda t: train(t, "data.task=jsonl", f"data.path={t}"), "is a directory; data.path"),
    ("jsonl not UTF-8", lambda t: jsonl(t, GOOD.encode() + b'{"prompt": "\xff", "answer": "2"}\n'),
     "d.jsonl:2: not UTF-8 text (byte 0xff at column 13)"),
    ("jsonl Latin-1 on line 3", lambda t: jsonl(t, GOOD.encode() * 2 + '{"prompt": "café", "answer": "1"}\n'.encode("latin-1")),
     "d.jsonl:3: not UTF-8 text"),
    ("jsonl malformed", lambda t: jsonl(t, GOOD + '{"prompt": "2+2=" "answer": "4"}\n'), "d.jsonl:2: not valid JSON"),
    ("jsonl truncated line", lambda t: jsonl(t, GOOD + '{"prompt": "2+2=", "ans'), "d.jsonl:2: not valid JSON"),
    ("jsonl array line", lambda t: jsonl(t, GOOD + '["2+2=", "4"]\n'), "d.jsonl:2: expected a JSON object, got list"),
    ("jsonl missing answer", lambda t: jsonl(t, '{"prompt": "1+1="}\n'), "d.jsonl:1: missing key(s) ['answer']"),
    ("jsonl empty prompt", lambda t: jsonl(t, '{"prompt": "", "answer": "1"}\n'), '"prompt" must be a non-empty string'),
    ("jsonl numeric prompt", lambda t: jsonl(t, '{"prompt": 12, "answer": "1"}\n'), '"prompt" must be a non-empty string'),
    ("jsonl null answer", lambda t: jsonl(t, '{"prompt": "1+1=", "answer": null}\n'), 'd.jsonl:1: "answer" is null'),
    ("jsonl duplicate ids", lambda t: jsonl(t, '{"id": "a", "prompt": "1+1=", "answer": "2"}\n' * 2),
     "d.jsonl:2: duplicate id 'a' (first on line 1)"),
    ("jsonl duplicate int/str ids", lambda t: jsonl(t, '{"id": 7, "prompt": "1+1=", "answer": "2"}\n\n'
                                                       '{"id": "7", "prompt": "2+2=", "answer": "4"}\n'),
     "d.jsonl:3: duplicate id '7' (first on line 1)"),
    ("jsonl empty file", lambda t: jsonl(t, ""), "d.jsonl: no problems found"),
    ("jsonl blank lines only", lambda t: jsonl(t, "\n  \n\n"), "d.jsonl: no problems found"),
    ("eval file missing", lambda t: jsonl(t, GOOD, f"data.eval_path={t / 'held.jsonl'}"), "held.jsonl: file not found"),
    ("eval file duplicate ids", lambda t: jsonl(t, GOOD, f"data.eval_path={write(t / 'e.jsonl', WITH_ID * 2)}"),
     "e.jsonl:2: duplicate id '1'"),
    ("task kwargs of the wrong type", lambda t: train(t, "data.task_kwargs={digits: many}"), "data.task_kwargs={'digits': 'many'}"),
    ("held-out split impossible", lambda t: train(t, "data.task_kwargs={digits: 1}", "data.train_size=2000",
                                                  "data.eval_size=50"), "cannot draw 50 held-out problems"),
    ("unknown task", lambda t: train(t, "data.task=arithmetic"), "unknown task 'arithmetic'. Did you mean 'arith'?"),
]

# ----------------------------------------------------------------------------- rewards and environments

REWARD_CASES = [
    ("unknown reward", lambda t: train(t, "reward.components=[{name: exact}]"), "unknown reward function 'exact'"),
    ("reward module missing", lambda t: train(t, "reward.components=[{name: 'no_such_pkg.mod:fn'}]"),
     "cannot import module 'no_such_pkg.mod'"),
    ("reward function missing", lambda t: train(t, "reward.components=[{name: 'tether.rewards.format:nope'}]"),
     "has no attribute 'nope'"),
    ("reward not a function", lambda t: train(t, "reward.components=[{name: 'tether.rewards.base:__doc__'}]"),
     "'__doc__' is a str, not a function"),
    ("reward form", lambda t: train(t, "reward.components=[{name: 'tether.rewards:'}]"), "expected the form 'package.module:function'"),
    ("reward bad kwargs", lambda t: train(t, "reward.components=[{name: exact_match, kwargs: {strictness: 3}}]"),
     "reward component 'exact_match': bad kwargs ['strictness']"),
    ("reward listed twice", lambda t: train(t, "reward.components=[{name: exact_match}, {name: exact_match}]"),
     "listed twice"),
    ("env summarizer missing", lambda t: train(t, "data.task=calc", "env.context.builder=summary",
                                               "env.context.summarizer=tether.envs.context:nope"),
     "env.context.summarizer='tether.envs.context:nope'"),
    ("env summarizer form", lambda t: train(t, "data.task=calc", "env.context.builder=summary",
                                            "env.context.summarizer=summarize"), "expected 'policy' or 'package.module:function'"),
]

# ----------------------------------------------------------------------------- run directories and the CLI

RUN_DIR_CASES = [
    ("run dir is a file", lambda t: [*train(t), "--run-dir", write(t / "f", "x")], "is a file, not a directory"),
    ("run dir under a file", lambda t: [*train(t), "--run-dir", f"{write(t / 'f', 'x')}/run"], "which is a file"),
    ("resume without run dir", lambda t: ["train", config(t), "--resume"], "--resume needs --run-dir"),
    ("show a missing run", lambda t: ["show", str(t / "nope")], "not a directory"),
    ("show a file", lambda t: ["show", config(t)], "not a directory"),
    ("eval a directory that is no run", lambda t: ["eval", str(t)], "not a tether run directory"),
    ("eval a run without checkpoints", lambda t: ["eval", str(Path(write(t / "r" / "config.yaml", "train: {}\n")).parent)],
     "no result model yet"),
    ("eval a config without model.path", lambda t: ["eval", config(t)], "model.path is not set"),
    ("eval a model outside a run", lambda t: ["eval", str(Path(write(t / "m" / "config.json", "{}")).parent)],
     "a model directory outside any run"),
]

CASES = [pytest.param(build, frag, id=f"{group}: {name}") for group, table in
         (("config", CONFIG_CASES), ("data", DATA_CASES), ("rewards/envs", REWARD_CASES), ("run dir/cli", RUN_DIR_CASES))
         for name, build, frag in table]


@pytest.mark.parametrize("build, fragment", CASES)
def test_bad_input_is_one_line_exit_2(tmp_path, build, fragment):
    result = runner.invoke(app, build(tmp_path))
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("argv, fragment", [
    (["no-such-command"], "No such command"),
    (["train", "--no-such-option"], "No such option"),
    (["train"], "Missing argument"),
])
def test_usage_errors_exit_2_without_traceback(argv, fragment):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output


# ----------------------------------------------------------------------------- disks and permissions


def _raise_on_write(err: OSError):
    def write_config(self, cfg):
        raise err
    return write_config


@pytest.mark.parametrize("code, fragment", [
    (errno.ENOSPC, "No space left on device (ENOSPC); free disk space or choose another --run-dir"),
    (errno.EROFS, "Read-only file system (EROFS); choose a --run-dir on a writable file system"),
    (errno.EACCES, "Permission denied (EACCES)"),
    (errno.EDQUOT, "Disk quota exceeded (EDQUOT); free disk space"),
])
def test_disk_errors_name_the_path(tmp_path, monkeypatch, code, fragment):
    from tether.io.run_dir import RunDir

    path = str(tmp_path / "run" / "config.yaml")
    monkeypatch.setattr(RunDir, "write_config", _raise_on_write(OSError(code, os.strerror(code), path)))
    result = runner.invoke(app, train(tmp_path))
    assert_one_line_error(result, f"cannot use {path}: {fragment}")


@pytest.mark.parametrize("read_only, fragment", [(True, "is on a read-only file system"),
                                                 (False, "is not writable (permission denied)")])
def test_unwritable_run_dir_refused_before_the_model(tmp_path, monkeypatch, read_only, fragment):
    import tether.preflight as pf

    class Stat:
        f_flag = os.ST_RDONLY if read_only else 0

    real_access = os.access
    monkeypatch.setattr(pf.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    monkeypatch.setattr(pf.os, "statvfs", lambda p: Stat())
    result = runner.invoke(app, train(tmp_path))
    assert_one_line_error(result, f"{tmp_path} {fragment}")


# ----------------------------------------------------------------------------- prompts past the context (tiny model)


@pytest.mark.parametrize("overrides, fragment", [
    (["rollout.max_prompt_tokens=2"], "16 of 16 training prompts are longer than 2 tokens"),
    (["rollout.max_prompt_tokens=2", "data.on_overlong=error"], "set data.on_overlong=skip"),
    (["model.tiny.max_position_embeddings=8", "rollout.sampling.max_new_tokens=8"], "leaves no room for a prompt"),
])
def test_context_overflow(tmp_path, overrides, fragment):
    assert_one_line_error(runner.invoke(app, train(tmp_path, *overrides)), fragment)


def test_overlong_prompts_are_skipped_and_counted(tmp_path):
    long = '{"prompt": "' + "1+2+3+4+5+6+7+8+9=" * 8 + '", "answer": "45"}\n'
    argv = jsonl(tmp_path, GOOD + long + GOOD.replace("1+1", "2+2"), "rollout.max_prompt_tokens=40",
                 f"data.eval_path={write(tmp_path / 'e.jsonl', GOOD)}")
    with pytest.warns(UserWarning) as caught:
        result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    messages = [str(w.message) for w in caught]
    assert any("1 of 3 training prompts are longer than 40 tokens (first: id 'd-2'" in m
               and "data.on_overlong=error to refuse" in m for m in messages), messages
    assert (tmp_path / "run" / "summary.json").is_file()
    strict = runner.invoke(app, [*argv, "data.on_overlong=error", "--run-dir", str(tmp_path / "strict")])
    assert_one_line_error(strict, "1 of 3 training prompts are longer than 40 tokens")


@pytest.mark.parametrize("override, fragment", [
    ("algo.advantage.name=grpoo", "unknown advantage estimator 'grpoo'"),
    ("algo.policy_loss.name=ppo", "'ppo'"),
    ("algo.kl.estimator=k4", "'k4'"),
])
def test_unknown_algorithm_names(tmp_path, override, fragment):
    extra = ["algo.kl.coef=0.1"] if "kl" in override else []
    assert_one_line_error(runner.invoke(app, train(tmp_path, override, *extra)), fragment)


# ----------------------------------------------------------------------------- model directories


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A saved tiny Hugging Face model (config, weights, tokenizer with a chat template)."""
    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer

    out = tmp_path_factory.mktemp("model")
    tok = build_tokenizer([f"{a}+{b}={a + b}" for a in range(30) for b in range(30)], 64)
    build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), tok, out)
    return out


def _variant(model_dir: Path, t: Path, change) -> str:
    out = t / "variant"
    shutil.copytree(model_dir, out)
    change(out)
    return str(out)


def _no_template(d: Path) -> None:
    (d / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


def _edit_config(**kv):
    def change(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(kv)
        (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return change


MODEL_CASES = [
    ("model.path missing", lambda m, t: str(t / "none"), [], "no such directory"),
    ("model.path is a file", lambda m, t: write(t / "m.bin", "x"), [], "is a file (a local Hugging Face model"),
    ("no config.json", lambda m, t: _variant(m, t, lambda d: (d / "config.json").unlink()), [], "no config.json inside"),
    ("config.json not JSON", lambda m, t: _variant(m, t, lambda d: (d / "config.json").write_text("{")), [],
     "config.json: not valid JSON"),
    ("config.json without model_type", lambda m, t: _variant(m, t, _edit_config(model_type=None)), [],
     'no "model_type" key'),
    ("no tokenizer", lambda m, t: _variant(m, t, lambda d: [f.unlink() for f in d.glob("tokenizer*")]), [],
     "cannot load its tokenizer"),
    ("chat without a template", lambda m, t: _variant(m, t, _no_template), ["data.chat=true"],
     "data.chat=true renders prompts with a chat template, but the tokenizer"),
    ("environment without a template", lambda m, t: _variant(m, t, _no_template), ["data.task=calc"],
     "data.task=calc renders prompts with a chat template"),
    ("vocab larger than the embedding", lambda m, t: _variant(m, t, _edit_config(vocab_size=40)), [],
     "but the model's embedding has 40 rows"),
    ("damaged weights", lambda m, t: _variant(m, t, lambda d: (d / "model.safetensors").write_bytes(b"\0" * 64)), [],
     "transformers cannot load it"),
]


@pytest.mark.parametrize("make, extra, fragment", [pytest.param(*c[1:], id=c[0]) for c in MODEL_CASES])
def test_bad_model_directory(tmp_path, model_dir, make, extra, fragment):
    result = runner.invoke(app, train(tmp_path, f"model.path={make(model_dir, tmp_path)}", *extra))
    assert_one_line_error(result, fragment)


def test_eval_of_a_damaged_checkpoint(tmp_path, model_dir):
    run = tmp_path / "run"
    write(run / "config.yaml", "train: {steps: 1}\n")
    ckpt = run / "checkpoints" / "step_000001"
    shutil.copytree(model_dir, ckpt)
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    assert_one_line_error(runner.invoke(app, ["eval", str(ckpt)]), "transformers cannot load it")


# ----------------------------------------------------------------------------- internal errors and --debug


def test_an_internal_error_is_one_line_and_debug_reraises(tmp_path, monkeypatch):
    import tether.recipes.rl as rl

    def boom(*a, **k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(rl, "run_rl", boom)
    result = runner.invoke(app, train(tmp_path))
    assert_one_line_error(result, "RuntimeError: boom second line (an internal error; rerun with --debug", code=1)
    debug = runner.invoke(app, ["--debug", *train(tmp_path)])
    assert isinstance(debug.exception, RuntimeError) and str(debug.exception) == "boom\nsecond line"
    user = runner.invoke(app, ["--debug", "train", config(tmp_path, "")])
    assert type(user.exception).__name__ == "ConfigError"


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tether.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_real_process_prints_one_line_and_no_traceback(tmp_path):
    cases = [  # each in its own directory: a case that did not fail would train, so the timeout is short
        (lambda t: ["train", config(t, "")], "the config file is empty"),
        (lambda t: jsonl(t, GOOD.encode() + b'{"prompt": "\xfe", "answer": "1"}\n'), "d.jsonl:2: not UTF-8 text"),
        (lambda t: [*train(t), "--run-dir", write(t / "f", "x")], "is a file, not a directory"),
    ]
    for i, (build, fragment) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        r = _cli(*build(tmp_path / str(i)), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        assert r.stderr.strip().splitlines()[-1].startswith("tether: error:") and fragment in r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    r = _cli("--debug", "train", config(tmp_path, ""), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr and "ConfigError" in r.stderr
