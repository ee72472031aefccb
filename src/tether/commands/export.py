"""CLI: `tether export RUN_DIR|CHECKPOINT --out DIR` — a plain Hugging Face model directory.

A LoRA run's checkpoints hold adapters (peft format, base named in adapter_config.json); export
merges the adapter into its base (`merge_and_unload`) so that `AutoModelForCausalLM.from_pretrained`
loads the result with no peft installed. A full-model checkpoint is written out as it is.
"""

from __future__ import annotations

from pathlib import Path

import typer


def run_export(target: Path, out: Path) -> Path:
    """Export the model of a run directory (its latest checkpoint, else final_model/) or of one
    checkpoint / model directory to `out`; returns `out`."""
    from tether.policy.hf import load_policy
    from tether.policy.lora import is_adapter_dir
    from tether.recipes.evaluate import find_model_dir, resolve_run

    target = Path(target)
    if not target.is_dir():
        raise FileNotFoundError(f"{target}: no such directory (a run directory or a checkpoint is expected)")
    if is_adapter_dir(target) or (target / "config.json").is_file():
        model_dir = target
    else:
        model_dir = find_model_dir(resolve_run(target))
    if Path(out).exists() and any(Path(out).iterdir()):
        raise FileExistsError(f"--out {out}: the directory exists and is not empty; choose a new one")
    policy = load_policy(model_dir)  # a LoRA adapter is merged into its base here
    policy.model.save_pretrained(str(out), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(out))
    return Path(out)


def register(app: typer.Typer) -> None:
    from tether.commands import common

    @app.command("export")
    def export(target: Path = typer.Argument(..., help="a run directory or a checkpoint (LoRA adapters are merged)"),
               out: Path = typer.Option(..., "--out", help="the directory to write (a plain Hugging Face model)")) -> None:
        """Write a run's model as a plain Hugging Face model directory (LoRA adapters merged in)."""
        common.offline_env()
        try:
            path = run_export(target, out)
        except (FileNotFoundError, FileExistsError, ValueError) as err:
            common.fail(str(err))
        typer.echo(f"exported: {path}")
