"""A farm of tiny finished runs, one of every kind, built once per test session and shared by the
pytest-xdist workers (a file lock per run: two workers build different runs at the same time and
never the same one twice). Tests read them; a test that changes a run copies it first."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from pathlib import Path

import yaml

from tests.unit.runs.runs_helpers import LORA, tether, write_config

# name -> (kind, the run's path inside the farm); stage runs live inside their pipeline
STAGES = ("sft", "rl", "rs", "dpo", "distill", "merged", "final")
STAGE_KINDS = {"sft": "sft", "rl": "rl", "rs": "rs_sft", "dpo": "dpo", "distill": "distill", "merged": "merge",
               "final": "eval"}


@contextlib.contextmanager
def no_plots():
    """matplotlib's PNGs take most of a tiny run's time (85% of an RL run's); the matrix tests commands, not plots."""
    from unittest import mock

    with mock.patch("tether.recipes.rl.plot_metrics", lambda *a, **k: []), \
            mock.patch("tether.sweep.plot_sweep", lambda *a, **k: None):
        yield


def _cli(*args) -> None:
    r = tether(*args)
    assert r.exit_code == 0, r.output


class Farm:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _lock(self, name: str):
        with open(self.root / f".{name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def get(self, name: str) -> Path:
        """The finished run `name` (see TARGETS), built now if no worker built it yet."""
        base = name.split(":")[0]
        with self._lock(base):
            if not (self.root / f".{base}.built").is_file():
                shutil.rmtree(self.root / base, ignore_errors=True)  # a worker killed half way
                with no_plots():
                    BUILDERS[base](self)
                (self.root / f".{base}.built").write_text("ok")
        return self.root / base / name.split(":")[1] if ":" in name else self.root / base

    def config(self, name: str, **sections) -> Path:
        return write_config(self.root / f"{name}.yaml", **sections)


def _single(command: str, lora: bool, chat: bool):
    def build(farm: Farm) -> None:
        name = f"{command}{'-lora' if lora else ''}{'-chat' if chat else ''}"
        sections = {"data": {"chat": True}} if chat else {}
        if lora:
            sections["model"] = {"lora": LORA}
        _cli(command, farm.config(name, **sections), "--run-dir", farm.root / name)
    return build


def _pipeline(farm: Farm) -> None:
    _cli("pipeline", farm.config("pipeline"), "--run-dir", farm.root / "pipeline")


def _pipeline_lora(farm: Farm) -> None:
    """LoRA through every stage kind of one pipeline."""
    pairs = farm.root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": w, "chosen": w[::-1], "rejected": w}) + "\n"
                             for w in ("abc", "hello", "tether", "model", "cat", "dog", "sun", "sky")))
    stages = [
        {"kind": "sft", "name": "sft"},
        {"kind": "rl", "name": "rl"},
        {"kind": "rs_sft", "name": "rs", "overrides": {"sft": {"steps": 2}, "rs_sft": {"problems": 4, "k": 2, "mix_demos": 4}}},
        {"kind": "dpo", "name": "dpo", "overrides": {"dpo": {"pairs": "file", "pairs_path": str(pairs), "steps": 2,
                                                             "batch_size": 4}}},
        {"kind": "distill", "name": "distill", "overrides": {"distill": {"teacher": "rl"}, "train": {"steps": 2}}},
        {"kind": "merge", "name": "merged", "overrides": {"merge": {"models": ["rl", "previous"]}}},
        {"kind": "eval", "name": "final"},
    ]
    cfg = farm.config("pipeline-lora", model={"lora": LORA}, pipeline={"stages": stages})
    _cli("pipeline", cfg, "--run-dir", farm.root / "pipeline-lora")


def _rm(farm: Farm) -> None:
    base = farm.get("sft") / "final_model"
    pairs = farm.root / "rm-pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": w, "chosen": w[::-1], "rejected": w}) + "\n"
                             for w in ("abc", "hello", "tether", "model", "cat", "dog", "sun", "sky", "run", "fast")))
    cfg = farm.config("rm", model={"path": str(base)}, rm={"pairs": str(pairs), "steps": 3, "batch_size": 4,
                                                            "eval_fraction": 0.3})
    _cli("rm", cfg, "--run-dir", farm.root / "rm")


SWEEP_ARGS = ("--grid", "sft.lr=0.001,0.003", "--seeds", "0", "--command", "sft", "--metric", "final_loss")


def _sweep(farm: Farm) -> None:
    """Two SFT runs; each run goes through the in-process command instead of a subprocess (same argv)."""
    from tether.sweep import SweepSpec, load_sweep_config, parse_grid, run_sweep

    cfg = farm.config("sweep")
    base, _ = load_sweep_config(cfg)
    base.setdefault("run", {}).setdefault("name", "sweep")
    spec = SweepSpec(grid=parse_grid(["sft.lr=0.001,0.003"]), seeds=[0], command="sft", metric="final_loss")

    def in_process(argv, run_dir, log_path):
        return tether(*argv, "--run-dir", run_dir).exit_code

    run_sweep(spec, base, farm.root / "sweep", run_fn=in_process, log=lambda m: None)


def _compare_context(farm: Farm) -> None:
    _cli("compare-context", farm.config("cc"), "--builders", "append", "--run-dir", farm.root / "cc")


BUILDERS = {
    **{f"{c}{'-lora' if lo else ''}{'-chat' if ch else ''}": _single(c, lo, ch)
       for c in ("sft", "train") for lo in (False, True) for ch in (False, True)},
    "pipeline": _pipeline, "pipeline-lora": _pipeline_lora, "rm": _rm, "sweep": _sweep, "cc": _compare_context,
}
# every target of the matrix: (farm name, its kind)
TARGETS = {
    **{f"{c}{'-lora' if lo else ''}{'-chat' if ch else ''}": ("sft" if c == "sft" else "rl")
       for c in ("sft", "train") for lo in (False, True) for ch in (False, True)},
    "pipeline": "pipeline", "pipeline-lora": "pipeline",
    **{f"pipeline-lora:{s}": STAGE_KINDS[s] for s in STAGES},
    "rm": "rm", "sweep": "sweep", "cc": "compare_context",
}


def stored_config(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())
