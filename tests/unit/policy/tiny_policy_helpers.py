"""A tiny locally built policy for the policy tests (imported by file name, like builtin_helpers)."""

from tether.config import TinyModelConfig
from tether.policy.hf import make_policy
from tether.policy.tiny import build_tiny_model, build_tokenizer

CORPUS = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]


def make_tiny_policy(hidden: int = 48, layers: int = 2, heads: int = 2, inter: int = 96, seed: int = 0, tok=None):
    tok = tok or build_tokenizer(CORPUS, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=inter), tok, seed=seed)
    return make_policy(model, tok)
