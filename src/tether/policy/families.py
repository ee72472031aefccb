"""Tiny random-initialised models of real families (Llama 3, Qwen2.5, Qwen3, Mistral), built
locally, each with a BPE tokenizer that carries the family's special tokens and a chat template
in the family's format — tool-call and tool-response markup included.

    path = build_family_model("qwen3", "models/tiny-qwen3", corpus=texts)
    policy = load_policy(path)                        # AutoModelForCausalLM / AutoTokenizer.from_pretrained

What is faithful and what is simplified:
- architecture: the real transformers class of the family (`LlamaForCausalLM`, `Qwen2ForCausalLM`
  with q/k/v biases, `Qwen3ForCausalLM` with q/k norms, `MistralForCausalLM`), grouped-query
  attention, shrunk to a hidden size of 32-64 and two layers;
- special tokens: the family's own strings (`<|begin_of_text|>`, `<|eot_id|>`, `<|im_start|>`,
  `<tool_call>`, `[INST]`, `[TOOL_CALLS]`, ...), with the family's end-of-turn ids as stop ids;
- chat templates follow the released ones (Llama 3.1 JSON tool calls and `ipython` tool turns,
  Qwen's Hermes `<tool_call>` / `<tool_response>` blocks, Qwen3's reasoning stripping of earlier
  turns, Mistral v3's `[AVAILABLE_TOOLS]` / `[TOOL_RESULTS]`); Mistral's tool list is rendered
  once before the first user turn instead of before the last (the released template moves it,
  which rewrites history and breaks append-only contexts);
- the vocabulary is a small byte-level BPE trained on `corpus` (digits split one per token),
  not the family's 32k-152k vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from tether.policy.config import TinyModelConfig

_LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{%- if system_message or tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n\\nYou have access to the following functions. To call a function, "
    "respond with JSON of the form {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.\\n\\n' }}{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- system_message }}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] in ['ipython', 'tool'] %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- elif message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- for tc in message['tool_calls'] %}"
    "{{- '{\"name\": \"' + tc['function']['name'] + '\", \"parameters\": ' + (tc['function']['arguments'] | tojson) + '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_QWEN_TOOLS = (
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}"
    "{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
)
_QWEN_SYSTEM = "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
_QWEN_TOOL_CALLS = (
    "{%- for tc in message['tool_calls'] %}{{- '\\n<tool_call>\\n{\"name\": \"' + tc['function']['name'] + "
    "'\", \"arguments\": ' + (tc['function']['arguments'] | tojson) + '}\\n</tool_call>' }}{%- endfor %}"
)
_QWEN_TOOL_RESPONSE = (
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
)
_QWEN2_TEMPLATE = (
    "{%- if tools %}" + _QWEN_TOOLS + _QWEN_SYSTEM + "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) or "
    "(message['role'] == 'assistant' and not message['tool_calls']) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}" + _QWEN_TOOL_CALLS +
    "{{- '<|im_end|>\\n' }}" + _QWEN_TOOL_RESPONSE + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3: as Qwen2.5, and an assistant turn before the last user query loses its reasoning (<think>...</think>)
_QWEN3_TEMPLATE = (
    "{%- if tools %}" + _QWEN_TOOLS + _QWEN_SYSTEM + "{%- endif %}"
    "{%- set ns = namespace(last_query=messages | length - 1) %}"
    "{%- for m in messages[::-1] %}{%- set i = messages | length - 1 - loop.index0 %}"
    "{%- if m['role'] == 'user' and ns.last_query == messages | length - 1 and "
    "not (m['content'].startswith('<tool_response>')) %}{%- set ns.last_query = i %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{%- set content = message['content'] %}"
    "{%- if '</think>' in content and loop.index0 < ns.last_query %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message['tool_calls'] %}" + _QWEN_TOOL_CALLS + "{%- endif %}"
    "{{- '<|im_end|>\\n' }}" + _QWEN_TOOL_RESPONSE + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{%- set ns = namespace(first_user=true) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if ns.first_user and tools %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if ns.first_user and system_message %}{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}{%- set ns.first_user = false %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['tool_calls'] %}{{- '[TOOL_CALLS] [' }}{%- for tc in message['tool_calls'] %}"
    "{{- '{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": ' + (tc['function']['arguments'] | tojson) + '}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ']</s>' }}"
    "{%- else %}{{- message['content'] + '</s>' }}{%- endif %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + (message['content'] | tojson) + '}[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)


@dataclass(frozen=True)
class FamilySpec:
    """A model family: its transformers config class, special tokens and chat template."""

    name: str
    config_class: str
    bos: str | None
    eos: str  # the tokenizer's eos_token
    stops: tuple[str, ...]  # every token that ends an assistant turn (generation_config.eos_token_id)
    pad: str
    special: tuple[str, ...]  # further special tokens
    markup: tuple[str, ...]  # tool-call markup added as (non-special) tokens, as Qwen's tokenizer does
    chat_template: str
    config_kwargs: tuple[tuple[str, Any], ...] = ()


FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(
        "llama", "LlamaConfig", "<|begin_of_text|>", "<|eot_id|>", ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"),
        "<|finetune_right_pad_id|>", ("<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>"), (),
        _LLAMA_TEMPLATE, (("rope_theta", 500000.0),)),
    "qwen2": FamilySpec(
        "qwen2", "Qwen2Config", None, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
        ("<|im_start|>",), ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        _QWEN2_TEMPLATE, (("rope_theta", 1000000.0), ("use_sliding_window", False))),
    "qwen3": FamilySpec(
        "qwen3", "Qwen3Config", None, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>",
        ("<|im_start|>",), ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        _QWEN3_TEMPLATE, (("rope_theta", 1000000.0), ("use_sliding_window", False))),
    "mistral": FamilySpec(
        "mistral", "MistralConfig", "<s>", "</s>", ("</s>",), "<pad>",
        ("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
         "[/TOOL_RESULTS]"), (), _MISTRAL_TEMPLATE, (("rope_theta", 1000000.0), ("sliding_window", None))),
}


def get_family(name: str) -> FamilySpec:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def format_tool_call(family: str, name: str, arguments: Mapping[str, Any]) -> str:
    """An assistant's tool call as the family writes it (what `tether.envs.tools.parse_tool_calls` reads)."""
    args = json.dumps(dict(arguments))
    if family == "llama":
        return '{"name": "%s", "parameters": %s}' % (name, args)
    if family == "mistral":
        return '[TOOL_CALLS] [{"name": "%s", "arguments": %s}]' % (name, args)
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, args)


def build_family_tokenizer(family: str, corpus: Iterable[str], vocab_size: int = 400):
    """A byte-level BPE trained on `corpus` with the family's special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = get_family(family)
    specials = list(dict.fromkeys([spec.pad, *([spec.bos] if spec.bos else []), spec.eos, *spec.stops, *spec.special]))
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.markup])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos,
                                   additional_special_tokens=[t for t in specials if t not in (spec.eos, spec.pad, spec.bos)])
    fast.chat_template = spec.chat_template
    fast.padding_side = "left"
    return fast


# the size of a family model unless told otherwise: small enough for a unit test, a context of 1024
FAMILY_SHAPE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=400,
                               max_position_embeddings=1024)


def family_shape(**sizes: int) -> TinyModelConfig:
    """FAMILY_SHAPE with some sizes changed (`hidden_size=32, intermediate_size=64`)."""
    return FAMILY_SHAPE.model_copy(update=sizes)


def build_family_model(family: str, out_dir: str | Path, corpus: Iterable[str] = (),
                       shape: TinyModelConfig = FAMILY_SHAPE, num_kv_heads: int = 2, seed: int = 0) -> Path:
    """Build, randomly initialise and `save_pretrained` a tiny model of `family` (of `shape`, with
    `num_kv_heads` key/value heads) with its tokenizer into `out_dir`; returns the directory (load it
    with `from_pretrained`)."""
    vocab_size, hidden_size, num_layers, num_heads = shape.vocab_size, shape.hidden_size, shape.num_layers, shape.num_heads
    intermediate_size, max_positions = shape.intermediate_size, shape.max_position_embeddings
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = get_family(family)
    corpus = list(corpus) or [_DEFAULT_CORPUS]
    tok = build_family_tokenizer(family, corpus, vocab_size)
    stop_ids = [tok.convert_tokens_to_ids(t) for t in spec.stops]
    config = getattr(transformers, spec.config_class)(
        vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size, max_position_embeddings=max_positions,
        head_dim=hidden_size // num_heads, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=stop_ids, **dict(spec.config_kwargs))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                               eos_token_id=stop_ids, pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


_DEFAULT_CORPUS = ("You are a helpful assistant. Use the calculator for arithmetic. What is 12+30? "
                   '{"name": "calculator", "arguments": {"expression": "12+30"}} Answer: 42 0123456789')
