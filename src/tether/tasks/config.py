"""The `data:` section: a built-in task, a JSONL file or a `datasets` source (tether.tasks)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tether.section import Section


class DataConfig(Section):
    task: str = Field("arith", description="built-in task name, 'jsonl' to read `path`, or 'hf' to load `path` "
                                           "with `datasets` (tether.tasks.hf)")
    path: str | None = Field(None, description="jsonl: one {prompt, answer, ...} per line; hf: a parquet/JSONL/arrow/"
                                               "CSV file, a save_to_disk directory or a Hub dataset name")
    eval_path: str | None = Field(None, description="held-out problems; default: data.eval_size rows held out of path")
    prompt_key: str = Field("prompt", description="hf: the prompt column (a string or a list of chat messages); "
                                                  "dotted paths reach into nested columns")
    answer_key: str = Field("answer", description="hf: the gold-answer column (falls back to verl's "
                                                  "reward_model.ground_truth)")
    split: str = Field("train", description="hf: the split of a dataset directory or Hub dataset")
    eval_split: str | None = Field(None, description="hf: a held-out split of the same source (instead of eval_path)")
    streaming: bool = Field(False, description="hf: read rows lazily, the first train_size (+ eval_size) only")
    train_size: int = Field(2000, gt=0)
    eval_size: int = Field(200, gt=0)
    task_kwargs: dict[str, Any] = Field(default_factory=dict)
    chat: bool = Field(False, description="render prompts with the tokenizer's chat template")
    on_overlong: Literal["skip", "error"] = Field(
        "skip", description="a prompt longer than rollout.max_prompt_tokens (or the model's context minus "
                            "max_new_tokens): skip it with a counted warning, or refuse to start")
    seed: int = 1234


__all__ = ["DataConfig"]
