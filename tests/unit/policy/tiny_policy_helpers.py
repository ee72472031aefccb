"""A tiny locally built policy for the policy tests (imported by file name, like builtin_helpers)."""

from tether.config import TinyModelConfig
from tether.policy.hf import make_policy
from tether.policy.tiny import build_tiny_model, build_tokenizer

CORPUS = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]


def make_tiny_policy(hidden: int = 48, layers: int = 2, heads: int = 2, inter: int = 96, seed: int = 0, tok=None):
    tok = tok or build_tokenizer(CORPUS, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=inter), tok, seed=seed)
    return make_policy(model, tok)


def gqa_models(vocab: int) -> dict:
    """Two small models the Llama-family fast paths must also get right: grouped-query attention
    (2 key heads for 4 query heads) and Qwen2's q/k/v biases."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128))
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128))
    return {"llama-gqa": llama, "qwen2-bias": qwen}


def right_pad(seqs) -> tuple:
    """1-D id tensors -> (ids [B, T] right-padded with 0, bool mask [B, T])."""
    import torch

    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = True
    return ids, mask
