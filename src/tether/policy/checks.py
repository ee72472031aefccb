"""Checks of the models a config names, before any weights are loaded (docs/errors.md).

What each check reads is cheap: config.json and the tokenizer of a model directory, the tensor
names and shapes in its safetensors headers, or a model skeleton built on the `meta` device
(no memory, no weights) to try LoRA's target modules with peft itself.

- `check_lora_targets`: every name in `model.lora.target_modules` matches a module of the model
  (peft accepts a list in which only one name matches, so a typo would silently leave a layer
  untrained), and peft accepts the matched modules' types.
- `model_kind` / `check_model_kind`: a reward model is a `*ForSequenceClassification` with one
  label, a judge, teacher or DPO sampler a `*ForCausalLM` (config.json `architectures`).
- `check_same_vocab`: on-policy distillation scores the student's token ids under the teacher.
- `read_shapes` + `find_shape_mismatch`: weight-space merging needs equal tensors and shapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from tether.errors import InputError

CAUSAL_LM, REWARD_MODEL = "ForCausalLM", "ForSequenceClassification"


def read_model_config(path: str | Path, what: str) -> dict[str, Any]:
    """config.json of a model directory (an adapter directory: its base's), or InputError naming `what`."""
    p = Path(path)
    if (p / "adapter_config.json").is_file():
        from tether.policy.lora import adapter_base_path

        try:
            p = adapter_base_path(p)
        except (FileNotFoundError, ValueError) as err:
            raise InputError(f"{what}={path}: {err}") from None
    if not p.is_dir():
        raise InputError(f"{what}={path}: {'is a file' if p.exists() else 'no such directory'} "
                         "(a model directory is expected)")
    f = p / "config.json"
    if not f.is_file():
        raise InputError(f"{what}={path}: no config.json inside; point it at a model directory "
                         "(a run's final_model/ or checkpoints/step_N/)")
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{what}={path}: config.json is not valid JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise InputError(f"{what}={path}: config.json is not a JSON object")
    return data


def model_kind(config: Mapping[str, Any]) -> str | None:
    """CAUSAL_LM, REWARD_MODEL, or None when config.json's `architectures` says neither (or nothing)."""
    archs = config.get("architectures") or []
    for kind in (REWARD_MODEL, CAUSAL_LM):
        if any(isinstance(a, str) and a.endswith(kind) for a in archs):
            return kind
    return None


def check_model_kind(path: str | Path, want: str, what: str) -> dict[str, Any]:
    """`path` is a model directory of kind `want` (or of no stated kind); returns its config.json."""
    config = read_model_config(path, what)
    kind = model_kind(config)
    arch = (config.get("architectures") or ["?"])[0]
    if want == REWARD_MODEL and kind == CAUSAL_LM:
        raise InputError(f"{what}={path} is a causal language model ({arch}), not a reward model: its score head would "
                         "be random; train one with `tether rm` (its final_model/) or name a *ForSequenceClassification "
                         "directory")
    if want == REWARD_MODEL:
        labels = config.get("num_labels", len(config.get("id2label") or {0: None}))
        if isinstance(labels, int) and labels != 1:
            raise InputError(f"{what}={path}: a classifier with {labels} labels; a reward model has one score "
                             "(num_labels=1, as `tether rm` saves it)")
    if want == CAUSAL_LM and kind == REWARD_MODEL:
        raise InputError(f"{what}={path} is a reward model ({arch}), not a causal language model: it cannot generate "
                         "or score tokens; name a causal LM directory (a run's final_model/)")
    return config


def load_tokenizer(path: str | Path, what: str):
    """The tokenizer of a model directory (an adapter: its own, else its base's), or InputError."""
    from transformers import AutoTokenizer

    p = Path(path)
    if (p / "adapter_config.json").is_file() and not (p / "tokenizer_config.json").is_file():
        from tether.policy.lora import adapter_base_path

        p = adapter_base_path(p)
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"{what}={path}: cannot load its tokenizer ({first[:200]})") from None


def check_same_vocab(student_tokenizer, other_tokenizer, what: str, student: str,
                     why: str = "the teacher scores the student's token ids") -> None:
    """Two models that exchange token ids (a distillation teacher scores the student's; DPO's delta models
    sample ids the student trains on) need equal vocabularies, id for id."""
    s, t = student_tokenizer.get_vocab(), other_tokenizer.get_vocab()
    if s != t:
        raise InputError(
            f"{what}: its tokenizer differs from the student's ({student}: {len(t)} vs {len(s)} tokens, "
            f"{len(set(s.items()) ^ set(t.items()))} differing entries); {why}, so use a model trained from the "
            "same base model (e.g. an earlier stage of this pipeline)")


def build_skeleton(path: str | Path | None, tiny: Any = None, what: str = "model.path"):
    """The model of directory `path` (an adapter: its base) or of the tiny-model settings `tiny`, on the
    meta device: module names and tensor shapes without memory or weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if path is not None:
        read_model_config(path, what)  # one line for a missing directory or a broken config.json
        p = Path(path)
        if (p / "adapter_config.json").is_file():
            from tether.policy.lora import adapter_base_path

            p = adapter_base_path(p)
        try:
            hf_config = AutoConfig.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError, KeyError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise InputError(f"{what}={path}: transformers cannot read its config.json ({first[:200]})") from None
    else:
        hf_config = LlamaConfig(vocab_size=tiny.vocab_size, hidden_size=tiny.hidden_size,
                                num_hidden_layers=tiny.num_layers, num_attention_heads=tiny.num_heads,
                                num_key_value_heads=tiny.num_heads, intermediate_size=tiny.intermediate_size,
                                max_position_embeddings=tiny.max_position_embeddings, tie_word_embeddings=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config)


def _linear_names(model) -> list[str]:
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_target_names(model, targets: list[str] | str, what: str = "model.lora.target_modules") -> None:
    """Every name in `targets` matches a module of `model` (peft's own matching rule)."""
    import peft
    from peft.tuners.tuners_utils import check_target_module_exists

    names = [n for n, _ in model.named_modules() if n]
    have = f"this model's linear layers: {', '.join(_linear_names(model))}"
    if isinstance(targets, str):
        if targets != "all-linear" and not any(check_target_module_exists(peft.LoraConfig(target_modules=targets), n)
                                               for n in names):
            raise InputError(f"{what}={targets!r} (a regular expression) matches no module of "
                             f"{type(model).__name__}; {have}")
        return
    if not targets:
        raise InputError(f"{what} is empty: name the layers to adapt ({have}), or 'all-linear'")
    missing = [t for t in targets
               if not any(check_target_module_exists(peft.LoraConfig(target_modules=[t]), n) for n in names)]
    if missing:
        raise InputError(f"{what}: {', '.join(map(repr, missing))} names no module of {type(model).__name__}; "
                         f"{have} (or 'all-linear')")


def describe_peft_refusal(model, targets: list[str] | str, err: BaseException,
                          what: str = "model.lora.target_modules") -> InputError:
    """peft's ValueError for targets it cannot adapt (a norm layer, ...) as one line naming the setting."""
    return InputError(f"{what}={targets!r}: peft cannot adapt it ({' '.join(str(err).split())[:200]}); this model's "
                      f"linear layers: {', '.join(_linear_names(model))}")


def check_lora_targets(model, lora: Any, what: str = "model.lora.target_modules") -> None:
    """`lora.target_modules` on a skeleton of the model: every name matches, and peft accepts them."""
    import peft

    check_target_names(model, lora.target_modules, what)
    try:
        peft.get_peft_model(model, peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules,
                                                   task_type="CAUSAL_LM"))
    except (ValueError, TypeError) as err:  # e.g. a norm layer: "Target module ... is not supported"
        raise describe_peft_refusal(model, lora.target_modules, err, what) from None


def read_shapes(model_dir: str | Path, what: str) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from the safetensors headers of a model directory (no weights read)."""
    from safetensors import SafetensorError, safe_open

    files = sorted(Path(model_dir).glob("model*.safetensors"))
    if (Path(model_dir) / "adapter_config.json").is_file() and not files:
        raise InputError(f"{what}: {model_dir} is a LoRA adapter; merging needs full models: export it first "
                         "(`tether export`) and name the exported directory")
    if not files:
        raise InputError(f"{what}: {model_dir} has no model*.safetensors; point it at a trained model directory "
                         "(a run's final_model/ or checkpoints/step_N/) or an earlier stage's name")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    shapes[k] = tuple(st.get_slice(k).get_shape())
        except (SafetensorError, OSError) as err:
            raise InputError(f"{what}: {f} is not a readable safetensors file ({err})") from None
    return shapes


def skeleton_shapes(model) -> dict[str, tuple[int, ...]]:
    """What `save_pretrained` writes for a skeleton: its tensors less a tied output embedding."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        out = model.get_output_embeddings()
        for name, mod in model.named_modules():
            if mod is out:
                shapes.pop(f"{name}.weight", None)
    return shapes


def find_shape_mismatch(a: Mapping[str, tuple[int, ...]], b: Mapping[str, tuple[int, ...]]) -> str | None:
    """How two state dicts' tensor names or shapes differ (the first difference), or None."""
    if set(a) != set(b):
        diff = sorted(set(a) ^ set(b))[:3]
        return f"different tensors (e.g. {diff}): another architecture"
    bad = [k for k in sorted(a) if a[k] != b[k]]
    return f"tensor {bad[0]!r} has shape {b[bad[0]]} vs {a[bad[0]]}: another size" if bad else None
