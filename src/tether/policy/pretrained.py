"""A local Hugging Face model directory, checked before it is loaded: a directory with a config.json,
weights transformers can read, and a tokenizer whose ids fit the embedding (one InputError line
naming `model.path` and the fix otherwise; `tether.preflight` runs the same checks before a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.errors import InputError


def check_model_dir(p: Path) -> None:
    """A directory with a config.json (what `from_pretrained` reads first)."""
    if not p.is_dir():
        what = "is a file" if p.exists() else "no such directory"
        raise InputError(f"model.path={str(p)!r}: {what} (a local Hugging Face model directory is expected)")
    if not (p / "config.json").is_file():
        raise InputError(f"model.path={str(p)!r}: no config.json inside — is this a Hugging Face model directory?")


def load_pretrained(p: Path, dtype) -> tuple[Any, Any]:
    """(model, tokenizer) of a local directory; whatever stops transformers (damaged weights, a foreign
    config, a size mismatch) and a tokenizer larger than the embedding become one InputError line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - SafetensorError, OSError, ValueError, RuntimeError, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"model.path={str(p)!r}: transformers cannot load it ({first})") from err
    check_tokenizer(tokenizer, model.get_input_embeddings().num_embeddings, None, f"model.path={str(p)!r}")
    return model, tokenizer


def check_tokenizer(tokenizer, embedding_rows: int | None, needs_template: str | None, where: str) -> None:
    """The tokenizer's ids fit the embedding; a chat template exists when `needs_template` says why."""
    if needs_template and getattr(tokenizer, "chat_template", None) is None:
        other = {"data.chat": "set data.chat=false", "data.prompt_key": "store the prompts as plain text"}.get(
            needs_template.split("=")[0], "use a built-in single-turn task")
        raise InputError(f"{needs_template} renders prompts with a chat template, but the tokenizer of {where} has "
                         f"none: use a chat model (or add chat_template to its tokenizer_config.json), or {other}")
    n = len(tokenizer)
    if embedding_rows is not None and n > embedding_rows:
        raise InputError(f"{where}: the tokenizer has {n} tokens but the model's embedding has {embedding_rows} rows "
                         "(ids past it would crash): use the tokenizer saved with this model")


__all__ = ["check_model_dir", "check_tokenizer", "load_pretrained"]
