"""Atomic, resumable checkpoints that are also Hugging Face exports (docs/design.md, correctness rule 14).

One checkpoint is one directory ``<run>/checkpoints/step_000010/``::

    config.json, generation_config.json, model.safetensors   model.save_pretrained (safetensors)
    tokenizer.json, tokenizer_config.json, ...                tokenizer.save_pretrained
    optimizer.pt, scheduler.pt                                state_dicts (torch.save)
    trainer_state.pt                                          step, RNG states, extra_state
    manifest.json                                             size + sha256 of every file, written last

The directory loads with ``AutoModelForCausalLM.from_pretrained(dir)`` as it is: no merger
script (verl#1438, #2252, #1246). Resume restores optimizer and scheduler state (prime-rl
PR#3399) and the python/numpy/torch(/CUDA) RNG states, so k steps + resume + (N-k) steps equals N
steps (open-r1#450, open-instruct PR#910); put the data position, KL controller state, etc. in
`extra_state`.

Atomicity: everything is written into ``checkpoints/.tmp-step_000010/``, fsynced, then renamed
into place with ``os.replace``; the ``latest`` pointer file is replaced atomically afterwards.
A crash leaves at most a ``.tmp-*`` directory, which `find_latest_checkpoint` ignores and the
next save removes. Assumes a single writer (rank 0) and a plain, unwrapped model. A LoRA model
(tether.policy.lora) is saved as its adapter in peft format (``adapter_model.safetensors`` +
``adapter_config.json`` naming the base directory); `tether export` merges it into a plain model.

Verification: `verify_checkpoint` checks every file against the manifest (a disk that lost or
truncated a file after the rename, a half-copied directory); `find_latest_checkpoint` skips a
checkpoint that fails, naming the file, and falls back to the previous one; with
`move_aside=True` (resume) the damaged directory is renamed ``step_000010.corrupt`` — kept for
inspection, never deleted, and out of the way of the next save. A model with a non-finite weight
is never saved (`CheckpointError`): a NaN model must not look like a result.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import warnings
from collections import defaultdict
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tether.io.killpoints import do_kill_point
from tether.io.run_dir import RunDir, do_fsync_dir, write_text_atomic
from tether.optim import compute_all_finite
from tether.phase import marks_phase

CKPT_RE = re.compile(r"^step_(\d+)$")
LATEST = "latest"
TRAINER_STATE = "trainer_state.pt"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a LoRA run's checkpoint: peft format, base named in adapter_config.json


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or none can be read; the message names the file and the fix."""


def _checkpoints_root(run_dir: RunDir | str | os.PathLike[str]) -> Path:
    """`<run>/checkpoints` from a RunDir or a run directory path."""
    root = run_dir.root if isinstance(run_dir, RunDir) else Path(run_dir)
    return root / "checkpoints"


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(path: str | os.PathLike[str]) -> int:
    """The step encoded in a checkpoint directory name (`step_000010` -> 10)."""
    m = CKPT_RE.match(Path(path).name)
    if not m:
        raise ValueError(f"{path} is not a checkpoint directory (expected a name like step_000010)")
    return int(m.group(1))


def _is_complete(path: Path) -> bool:
    # A non-.tmp step directory only exists after os.replace, i.e. complete; the file check
    # guards against hand-made directories (`verify_checkpoint` then checks every file).
    return path.is_dir() and CKPT_RE.match(path.name) is not None and (
        (path / MANIFEST).is_file() or (path / TRAINER_STATE).is_file())


def _list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest step first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _is_complete(p)), key=checkpoint_step)


# ----------------------------------------------------------------------------- RNG


def compute_rng_state() -> dict[str, Any]:
    """Python, numpy (global), torch CPU and CUDA RNG states, in a `weights_only`-loadable form."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = torch.from_numpy(np_state["state"]["key"].astype(np.int64))
    return {
        "python": random.getstate(),
        "numpy": np_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def do_restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `compute_rng_state`."""
    random.setstate(state["python"])
    np_state = dict(state["numpy"])
    np_state["state"] = dict(np_state["state"])
    np_state["state"]["key"] = np.asarray(np_state["state"]["key"].numpy(), dtype=np.uint32)
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda)} devices, this process sees "
                f"{torch.cuda.device_count()}: CUDA RNG not restored", RuntimeWarning, stacklevel=2
            )
        else:
            torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------- save


def _fsync_tree(path: Path) -> None:
    """fsync every file and directory under `path`, so the rename publishes durable data."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        do_fsync_dir(Path(dirpath))


def _write_into(tmp: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                extra_state: dict[str, Any]) -> None:
    """Write every part of a checkpoint into the (not yet visible) directory `tmp`."""
    # safe_serialization is the default (and the only format) in recent transformers; passing
    # it keeps older 4.x versions on safetensors too.
    peft_model = getattr(model, "__dict__", {}).get("_tether_peft")  # LoRA (tether.policy.lora): the adapter only
    if peft_model is not None:
        peft_model.save_pretrained(tmp, safe_serialization=True)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    if not any(tmp.glob("model*.safetensors")) and not (tmp / ADAPTER_WEIGHTS).is_file():
        raise RuntimeError(f"save_pretrained wrote no model*.safetensors into {tmp}")
    do_kill_point("ckpt/model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        do_kill_point("ckpt/optimizer")
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / SCHEDULER)
    state = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "rng": compute_rng_state(),
        "extra_state": extra_state,
    }
    torch.save(state, tmp / TRAINER_STATE)
    do_kill_point("ckpt/state")
    _write_manifest(tmp, step)  # written last: a checkpoint with a manifest was complete once
    do_kill_point("ckpt/manifest")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _write_manifest(path: Path, step: int) -> None:
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.name != MANIFEST)
    entries = {str(f.relative_to(path)): {"size": f.stat().st_size, "sha256": _sha256(f)} for f in files}
    doc = {"format_version": FORMAT_VERSION, "step": step, "files": entries}
    (path / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")


def verify_checkpoint(path: str | os.PathLike[str]) -> str | None:
    """None when every file of the checkpoint matches its manifest, else what is wrong (naming the file).

    A checkpoint written before manifests existed (no manifest.json) passes when its trainer
    state is present; its files are then only checked by loading them."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None if (path / TRAINER_STATE).is_file() else f"{path / TRAINER_STATE}: missing"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"{manifest}: unreadable manifest ({err})"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{f}: missing"
        size = f.stat().st_size
        if size != want["size"]:
            return f"{f}: {size} bytes, the manifest says {want['size']} (truncated or overwritten)"
        if _sha256(f) != want["sha256"]:
            return f"{f}: sha256 differs from the manifest (corrupted)"
    return None


def do_move_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `<name>.corrupt` (`.corrupt-1`, ... if taken); never deletes."""
    target = path.with_name(path.name + ".corrupt")
    k = 0
    while target.exists():
        k += 1
        target = path.with_name(f"{path.name}.corrupt-{k}")
    os.replace(path, target)
    do_fsync_dir(path.parent)
    return target


def do_prune_checkpoints(root: Path, keep: int, protect: Path) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (by step); `protect` is never deleted."""
    others = [p for p in reversed(_list_checkpoints(root)) if p != protect]
    doomed = others[max(keep - 1, 0):]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _remove_stale_tmp(root: Path) -> None:
    """Remove `.tmp-*` directories left by crashed saves (single writer: none is in progress)."""
    for p in root.glob(".tmp-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


@marks_phase("checkpoint")
def save_checkpoint(run_dir: RunDir | str | os.PathLike[str], step: int, model: Any, tokenizer: Any = None,
                    optimizer: Any = None, scheduler: Any = None, extra_state: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Write `<run>/checkpoints/step_<step:06d>/` atomically and point `latest` at it.

    `extra_state` is anything `torch.save` can store and `torch.load(weights_only=True)` can
    read back (dicts, lists, numbers, strings, tensors): data position, step, KL controller, ...
    Keeps the newest `keep` checkpoints by step, never deleting the one just written.
    Returns the checkpoint directory.
    """
    if keep < 1:
        raise ValueError(f"save_checkpoint: keep must be >= 1, got {keep}")
    if not compute_all_finite(list(model.parameters())):
        bad = [n for n, t in model.named_parameters() if not bool(torch.isfinite(t.detach()).all())]
        raise CheckpointError(f"refusing to save step {step}: the model has non-finite weights ({', '.join(bad[:3])}"
                              f"{', ...' if len(bad) > 3 else ''}); the previous checkpoints are kept")
    root = _checkpoints_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    final, tmp = root / name, root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    _write_into(tmp, step, model, tokenizer, optimizer, scheduler, dict(extra_state or {}))
    _fsync_tree(tmp)
    if final.exists():
        # Re-saving a step (after a resume): os.replace cannot overwrite a non-empty directory,
        # so move the old one aside first; it is deleted once the new one is in place.
        old = root / f".tmp-old-{name}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    do_fsync_dir(root)
    do_kill_point("ckpt/renamed")
    write_text_atomic(root / LATEST, name + "\n")
    do_prune_checkpoints(root, keep, protect=final)
    _remove_stale_tmp(root)
    do_kill_point("ckpt/done")
    return final


# ----------------------------------------------------------------------------- find / load


def find_latest_checkpoint(run_dir: RunDir | str | os.PathLike[str], *, verify: bool = True,
                           move_aside: bool = False, log=None) -> Path | None:
    """The checkpoint to resume from, or None. Ignores `.tmp-*` leftovers of a crashed save.

    Candidates: the `latest` pointer's target (it is only moved after a checkpoint is fully in
    place), then every complete step, newest first. With `verify`, a candidate that fails
    `verify_checkpoint` is skipped with a warning naming the file (and, with `move_aside`, renamed
    `*.corrupt`); the previous one is used. `log(message)` receives those messages (default:
    `warnings.warn`).
    """
    root = _checkpoints_root(run_dir)
    pointer = root / LATEST
    candidates = list(reversed(_list_checkpoints(root)))
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if _is_complete(target):
            candidates = [target] + [c for c in candidates if c != target]
    for path in candidates:
        problem = verify_checkpoint(path) if verify else None
        if problem is None:
            return path
        do_report_damaged(path, problem, move_aside, log)
    return None


def do_report_damaged(path: Path, problem: str, move_aside: bool, log=None) -> None:
    """Warn about a damaged checkpoint (and rename it `*.corrupt` when `move_aside`)."""
    where = f"; moved aside to {do_move_aside(path).name}" if move_aside else ""
    message = f"checkpoint {path.name} skipped: {problem}{where}"
    if log is None:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        log(message)


def _aliases(model: torch.nn.Module) -> dict[str, set[str]]:
    """name -> all names sharing that tensor (tied weights are saved under one name only)."""
    by_id: dict[int, set[str]] = defaultdict(set)
    named = chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        by_id[id(tensor)].add(name)
    return {n: names for names in by_id.values() for n in names}


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("model*.safetensors"))  # one file or model-0000x-of-0000y shards
    if not files:
        raise FileNotFoundError(f"{path}: no model*.safetensors (is this a checkpoint directory?)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f), device="cpu"))
    return state


def _load_via_from_pretrained(path: Path, model: Any) -> None:
    """Fallback when the file's names differ from `state_dict()` (transformers may convert
    weights on save/load for some architectures): let from_pretrained map them, then copy."""
    dtype = next(model.parameters()).dtype
    loaded, info = type(model).from_pretrained(path, dtype=dtype, output_loading_info=True)
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        raise RuntimeError(f"{path}: weights do not match {type(model).__name__}: {problems}")
    model.load_state_dict(loaded.state_dict(), strict=True)


def do_load_weights(path: str | os.PathLike[str], model: Any) -> None:
    """Load the checkpoint's safetensors into the existing `model` in place (dtype/device kept)."""
    path = Path(path)
    if (path / ADAPTER_WEIGHTS).is_file():
        from tether.policy.lora import load_adapter_into

        load_adapter_into(model, path)
        return
    state = _read_safetensors(path)
    expected = set(model.state_dict())
    aliases = _aliases(model)
    missing = [k for k in expected - set(state) if not (aliases.get(k, set()) & set(state))]
    unexpected = set(state) - expected
    if missing or unexpected:
        _load_via_from_pretrained(path, model)
        return
    with torch.no_grad():
        model.load_state_dict(state, strict=False)  # strict=False only for tied aliases


def load_checkpoint(path: str | os.PathLike[str], model: Any, optimizer: Any = None, scheduler: Any = None,
                    *, restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (in place), optimizer, scheduler and RNG states; return `extra_state`.

    Passing an optimizer/scheduler whose state is missing from the checkpoint is an error:
    resuming with fresh Adam moments silently changes the run (prime-rl PR#3399).
    """
    path = Path(path)
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path}: no {TRAINER_STATE}; not a complete tether checkpoint")
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    do_load_weights(path, model)
    for obj, fname in ((optimizer, OPTIMIZER), (scheduler, SCHEDULER)):
        if obj is None:
            continue
        if not (path / fname).is_file():
            raise FileNotFoundError(f"{path}: no {fname}, but a {type(obj).__name__} was passed to restore")
        obj.load_state_dict(torch.load(path / fname, map_location="cpu", weights_only=True))
    if restore_rng:
        do_restore_rng_state(state["rng"])  # last: nothing above may consume the restored streams
    return state["extra_state"]
