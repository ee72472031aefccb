"""A pipeline's inputs, checked for every stage before the first one runs (docs/errors.md, "Pipelines").

`tether pipeline` calls `check_pipeline_inputs` after `plan_stages` (stage names, overrides, that
model references exist): a mistake in stage 5 then costs seconds, not the four stages before it,
and whatever the stage order. Per stage: `check_config_inputs` (data, rewards, chat template, LoRA
targets: tether.preflight) and what its kind needs:

- rl / sft / rs_sft / distill: at least one step; distill: a teacher that is a causal LM with the
  student's tokenizer, id for id (a stage name shares it by construction);
- dpo: a known loss; `pairs=file` a readable pairs file; `pairs=delta` two causal LMs with the
  student's tokenizer (their sampled ids train the student);
- rs_sft: a readable `mix_path`;
- merge: enough models and weights, linear weights summing to 1, a base for task arithmetic, and
  every model (directories, stage names, `previous`) with the same tensors and shapes (a stage that
  trains LoRA hands on an adapter, which the merge folds into its base first: the lineage's shapes).

Every stage of a pipeline descends from one starting model (`model.path`, or the tiny model the
first stage builds), so the student's tokenizer and tensor shapes are those of that model: the
`Lineage` computes them once, lazily (the tiny model's tokenizer is built as the first stage would).
"""

from __future__ import annotations

import contextlib
import io
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from tether.config import TetherConfig, build_config
from tether.errors import InputError, UserError
from tether.preflight import check_config_inputs, check_steps
from tether.policy.checks import (CAUSAL_LM, build_skeleton, check_model_kind, check_same_vocab, find_shape_mismatch,
                                     load_tokenizer, read_shapes, skeleton_shapes)

STEP_KINDS = {"rl": "rl", "distill": "rl", "sft": "sft", "rs_sft": "sft"}  # which steps setting a kind trains


class Lineage:
    """The tokenizer and tensor shapes every stage's model shares (the pipeline's starting model)."""

    def __init__(self, first: TetherConfig) -> None:
        self.cfg = first
        self.where = f"model.path={first.model.path}" if first.model.path else "the tiny model the first stage builds"

    @cached_property
    def tokenizer(self):
        if self.cfg.model.path:
            return load_tokenizer(self.cfg.model.path, "model.path")
        from tether.policy.tiny import build_tokenizer
        from tether.rollout import compute_tokenizer_corpus
        from tether.train.setup import setup_problems

        with contextlib.redirect_stdout(io.StringIO()):  # the recipe prints its data notices itself
            train, _ = setup_problems(self.cfg.data)
        return build_tokenizer(compute_tokenizer_corpus(self.cfg.data.task, train), self.cfg.model.tiny.vocab_size)

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        if self.cfg.model.path and not (Path(self.cfg.model.path) / "adapter_config.json").is_file():
            return read_shapes(self.cfg.model.path, "model.path")
        tiny = self.cfg.model.tiny.model_copy(update={"vocab_size": len(self.tokenizer)})
        path = self.cfg.model.path if self.cfg.model.path else None
        return skeleton_shapes(build_skeleton(path, tiny))


def check_pipeline_inputs(cfg: TetherConfig, plan: Sequence[tuple[Any, dict[str, Any]]]) -> None:
    """Every stage's inputs and model references (module docstring); InputError / ConfigError naming
    the stage and the setting."""
    configs = [(st, build_config(data, f"pipeline stage {st.name!r}")) for st, data in plan]
    lineage = Lineage(configs[0][1]) if configs else None
    seen_data: set[str] = set()
    for i, (st, stage_cfg) in enumerate(configs):
        where = f"pipeline stage {st.name!r} (pipeline.stages.{i})"
        try:
            _check_stage(st, stage_cfg, configs[:i], lineage, seen_data)
        except UserError as err:  # DataError, ConfigError, InputError, ...: the same line, with the stage named
            raise InputError(f"{where}: {err}") from None


def _check_stage(st: Any, cfg: TetherConfig, earlier: list[tuple[Any, TetherConfig]], lineage: Lineage,
                 seen_data: set[str]) -> None:
    if st.kind in STEP_KINDS:
        check_steps(cfg, STEP_KINDS[st.kind])
    key = json.dumps([cfg.data.model_dump(mode="json"), cfg.reward.model_dump(mode="json"),
                      cfg.model.model_dump(mode="json")], sort_keys=True)
    if key not in seen_data:  # stages that share data, rewards and model are checked once
        check_config_inputs(cfg)
        seen_data.add(key)
    names = {s.name: c for s, c in earlier}
    if st.kind == "distill":
        _check_distill(cfg, names, lineage)
    elif st.kind == "dpo":
        _check_dpo(cfg, names, lineage)
    elif st.kind == "rs_sft" and cfg.rs_sft.mix_path:
        from tether.tasks import read_jsonl_fields

        read_jsonl_fields(cfg.rs_sft.mix_path, ("prompt", "completion"), "rs_sft.mix_path")
    elif st.kind == "merge":
        _check_merge(cfg, names, earlier, lineage)


def _check_student_model(ref: str | None, what: str, names: dict[str, TetherConfig], lineage: Lineage,
                         why: str = "the teacher scores the student's token ids") -> None:
    """A model that works on the student's token ids: an earlier stage, or a causal LM directory with the
    student's tokenizer."""
    if not ref:
        raise InputError(f"{what} is not set: name a model directory or an earlier stage")
    if ref == "previous":
        raise InputError(f"{what}=previous names the stage's own starting model; name an earlier stage or a directory")
    if ref in names:
        return
    check_model_kind(ref, CAUSAL_LM, what)
    check_same_vocab(lineage.tokenizer, load_tokenizer(ref, what), f"{what}={ref}", lineage.where, why)


def _check_distill(cfg: TetherConfig, names: dict[str, TetherConfig], lineage: Lineage) -> None:
    _check_student_model(cfg.distill.teacher, "distill.teacher", names, lineage)


def _check_dpo(cfg: TetherConfig, names: dict[str, TetherConfig], lineage: Lineage) -> None:
    from tether.algos.preference import PREFERENCE_LOSSES

    d = cfg.dpo
    problem = PREFERENCE_LOSSES.check(d.loss, "dpo.loss")
    if problem:
        raise InputError(problem)
    if d.pairs == "file":
        if not d.pairs_path:
            raise InputError("dpo.pairs=file needs dpo.pairs_path=<JSONL of {prompt, chosen, rejected}>")
        from tether.tasks import read_jsonl_fields

        read_jsonl_fields(d.pairs_path, ("prompt", "chosen", "rejected"), "dpo.pairs_path")  # recipes.dpo's rows
    elif d.pairs == "delta":
        for key in ("strong_model", "weak_model"):
            _check_student_model(getattr(d, key), f"dpo.{key}", names, lineage,
                                 "the student trains on the token ids it samples")


def _check_merge(cfg: TetherConfig, names: dict[str, TetherConfig], earlier: list[tuple[Any, TetherConfig]],
                 lineage: Lineage) -> None:
    m = cfg.merge
    need = 1 if m.method == "task_arithmetic" else 2
    if len(m.models) < need:
        raise InputError(f"merge.models={m.models}: merge.method={m.method} needs at least {need} model(s) "
                         "(directories, earlier stages' names, or previous)")
    if m.weights is not None and len(m.weights) != len(m.models):
        raise InputError(f"merge.weights={m.weights}: {len(m.weights)} weights for {len(m.models)} merge.models")
    if m.method == "linear" and m.weights is not None and abs(sum(m.weights) - 1.0) > 1e-6:
        raise InputError(f"merge.weights={m.weights} sum to {sum(m.weights):g}; linear weights must sum to 1 "
                         "(use merge.method=task_arithmetic to extrapolate)")
    refs = [("merge.models", r) for r in m.models]
    if m.method == "task_arithmetic":
        refs.append(("merge.base", m.base or "previous"))
    previous = earlier[-1] if earlier else None
    first: tuple[str, dict[str, tuple[int, ...]]] | None = None
    for what, ref in refs:
        shapes = _merge_shapes(ref, what, names, previous, lineage)
        if first is None:
            first = (f"{what}={ref}", shapes)
        elif (diff := find_shape_mismatch(first[1], shapes)) is not None:
            raise InputError(f"{what}={ref} cannot be merged with {first[0]}: {diff}; merge models of one architecture "
                             "and size (e.g. stages of this pipeline)")


def _merge_shapes(ref: str, what: str, names: dict[str, TetherConfig], previous: tuple[Any, TetherConfig] | None,
                  lineage: Lineage) -> dict[str, tuple[int, ...]]:
    """The tensor shapes merging `ref` will read: a directory's, or the lineage's for a stage (a LoRA stage's
    adapter is merged into its base first, so its shapes are the lineage's too: tether.recipes.merge)."""
    stage = names.get(ref)
    if ref == "previous":
        if previous is None and not lineage.cfg.model.path:
            raise InputError(f"{what}=previous: the pipeline's first stage has no incoming model; set model.path")
        stage = previous[1] if previous else None
    return lineage.shapes if stage is not None or ref == "previous" else read_shapes(ref, what)
