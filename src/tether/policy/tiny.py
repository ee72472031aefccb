"""Build a tiny causal LM and its tokenizer locally — no model hub needed.

The tokenizer is a byte-level BPE trained with `tokenizers` on the task's own text (digits split
one per token so arithmetic stays learnable) and wrapped in `PreTrainedTokenizerFast` with a
ChatML chat template; the model is a small `LlamaForCausalLM`. Both are saved with
`save_pretrained`, so everything downstream uses the real `from_pretrained` path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tether.policy.config import TinyModelConfig

PAD = "<|pad|>"
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]

# ChatML, as used by Qwen-style models; `tools` render as a JSON system block (issue: agentic envs).
CHATML_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools:\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int, out_dir: str | Path | None = None):
    """Train a byte-level BPE on `corpus` and return a `PreTrainedTokenizerFast`.

    Digits are pre-split one per token. The end-of-sequence token is `<|endoftext|>`; chat turns
    end with `<|im_end|>`, which generation also treats as a stop token (several eos ids).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(cfg: TinyModelConfig, tokenizer, out_dir: str | Path | None = None, seed: int = 0):
    """A randomly initialised `LlamaForCausalLM` sized by `cfg`, matched to `tokenizer`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    eos_ids = [tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(IM_END)]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_ids,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    # No silent sampling filters: generation_config defaults (top_k=50 etc.) never reach
    # tether's sampler, but keep the saved config honest for users who call HF generate().
    model.generation_config = GenerationConfig(
        do_sample=True, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    if out_dir is not None:
        model.save_pretrained(str(out_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir))
    return model
