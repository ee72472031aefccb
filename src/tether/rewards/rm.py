"""Learned rewards: a Bradley–Terry reward model and the `reward_model` reward component.

    loss = compute_bradley_terry_loss(r_chosen_B, r_rejected_B)      # -log sigmoid(r_c - r_r), mean
    scores = score_texts(rm, tokenizer, prompts, completions)        # one scalar per (prompt, completion)

The reward model is transformers' own `*ForSequenceClassification` with one label (a causal-LM
backbone and a scalar `score` head): it saves with `save_pretrained` and loads with
`AutoModelForSequenceClassification.from_pretrained` like any Hugging Face model. tether pools the
hidden state of each sequence's last real token itself, located from the attention mask's
lengths (house rule 6: never from token values — the model's own pooling looks for the pad id,
which may equal eos).

Bradley–Terry (Ouyang et al., arXiv 2203.02155 §3.5; the RM of DeepSeek-R1, arXiv 2501.12948 §2.3.4):
P(chosen > rejected) = sigmoid(r_c - r_r); training minimises the negative log-likelihood.

The `reward_model` component is *batched* (`fn.batched = True`): it loads the model once per
process and scores a whole rollout batch per call. Normalisation options: `none` (raw score),
`sigmoid` (sigmoid of the score: a probability-like value in (0, 1)), `batch` (z-scored within
the call — the scale of an RM is arbitrary; group-relative estimators do not need it), `winrate`
(each sample's Bradley–Terry win rate against the other samples of the same prompt in the call,
SPPO's reward, arXiv 2405.00675: `compute_win_rates`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from tether.rewards.base import REWARD_FUNCTIONS


def compute_bradley_terry_loss(r_chosen_B: torch.Tensor, r_rejected_B: torch.Tensor) -> torch.Tensor:
    """Mean over pairs of -log sigmoid(r_chosen - r_rejected) (arXiv 2203.02155 eq. 1)."""
    return -F.logsigmoid(r_chosen_B - r_rejected_B).mean()


def load_reward_model(path: str | Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a reward-model directory, or of a causal LM (the head starts random)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: no config.json — expected a Hugging Face model directory")
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, dtype=dtype)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    return model, tok


def encode_pair_texts(tokenizer, prompts: Sequence[str], completions: Sequence[str], max_length: int) -> list[list[int]]:
    """prompt + completion token ids (the prompt's ids first, then the completion's), cut from the left."""
    out = []
    for p, c in zip(prompts, completions):
        ids = list(tokenizer.encode(p, add_special_tokens=True)) + list(tokenizer.encode(c, add_special_tokens=False))
        out.append(ids[-max_length:] or [tokenizer.pad_token_id or 0])
    return out


def compute_scores(model, ids: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """One scalar per sequence: the `score` head on the hidden state of its last real token."""
    lengths = torch.tensor([len(x) for x in ids])
    width = int(lengths.max())
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    dev = next(model.parameters()).device
    backbone = getattr(model, model.base_model_prefix)
    h = backbone(input_ids=input_ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state
    last = h[torch.arange(len(ids), device=dev), (lengths - 1).to(dev)]
    return model.score(last).squeeze(-1).float()


def score_texts(model, tokenizer, prompts: Sequence[str], completions: Sequence[str], max_length: int = 512,
                batch_size: int = 32) -> list[float]:
    """Scores of (prompt, completion) pairs in batches, no grad."""
    ids = encode_pair_texts(tokenizer, prompts, completions, max_length)
    pad = model.config.pad_token_id or 0
    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(ids), batch_size):
            out.extend(compute_scores(model, ids[i : i + batch_size], pad).tolist())
    return out


def compute_pair_accuracy(model, tokenizer, pairs: Sequence[Mapping[str, str]], max_length: int = 512) -> float:
    """Fraction of pairs the model ranks right (r_chosen > r_rejected)."""
    if not pairs:
        return float("nan")
    prompts = [p["prompt"] for p in pairs]
    rc = score_texts(model, tokenizer, prompts, [p["chosen"] for p in pairs], max_length)
    rr = score_texts(model, tokenizer, prompts, [p["rejected"] for p in pairs], max_length)
    return sum(c > r for c, r in zip(rc, rr)) / len(pairs)


def make_pairs_from_groups(groups, limit_per_group: int = 4) -> list[dict[str, str]]:
    """Preference pairs from verifier outcomes: within a group, a correct sample over an incorrect one."""
    pairs = []
    for g in groups:
        good = [t for t in g.trajectories if t.reward.correct]
        bad = [t for t in g.trajectories if t.reward.correct is False]
        for good_t, bad_t in list(zip(good, bad))[:limit_per_group]:
            pairs.append({"prompt": str(g.task.get("prompt", "")), "chosen": good_t.info.get("text", ""),
                          "rejected": bad_t.info.get("text", "")})
    return pairs


_MODELS: dict[str, tuple[Any, Any]] = {}
NORMALIZE = ("none", "sigmoid", "batch", "winrate")


def _cached_model(path: str):
    if path not in _MODELS:
        model, tok = load_reward_model(path)
        model.eval()
        _MODELS[path] = (model, tok)
    return _MODELS[path]


def compute_win_rates(scores: Sequence[float], keys: Sequence[Any]) -> list[float]:
    """Each sample's Bradley–Terry win rate against the other samples of its prompt:
    mean over j != i with keys[j] == keys[i] of sigmoid(s_i - s_j); 0.5 for a sample alone.

    The win rate of a response against the current policy's own samples is the reward of SPPO
    (Wu et al., arXiv 2405.00675 §3, P(y > pi_t | x) estimated from K samples). It reads the RM
    only through score differences within a prompt, so a per-prompt offset in the scores (which
    pairwise training does not constrain) cancels, and a near-tie is worth ~0.5 to both sides.
    """
    by_key: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    out = [0.5] * len(scores)
    for idx in by_key.values():
        for i in idx if len(idx) > 1 else ():
            out[i] = sum(1.0 / (1.0 + math.exp(scores[j] - scores[i])) for j in idx if j != i) / (len(idx) - 1)
    return out


def reward_model(texts: Sequence[str], tasks: Sequence[Mapping[str, Any]], path: str, normalize: str = "none",
                 max_length: int = 512, batch_size: int = 32) -> list[float]:
    """Reward component: the reward model at `path` scores (task prompt, completion) — batched."""
    if normalize not in NORMALIZE:
        raise ValueError(f"reward_model: normalize={normalize!r}; valid: {', '.join(NORMALIZE)}")
    model, tok = _cached_model(str(path))
    prompts = [str(t.get("prompt", "")) for t in tasks]
    scores = score_texts(model, tok, prompts, list(texts), max_length, batch_size)
    if normalize == "winrate":
        return compute_win_rates(scores, prompts)
    if normalize == "sigmoid":
        return [1.0 / (1.0 + math.exp(-s)) for s in scores]
    if normalize == "batch" and len(scores) > 1:
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        return [(s - mean) / (std + 1e-6) for s in scores]
    return scores


def _check_reward_model_kwargs(kwargs: Mapping[str, Any]) -> None:
    """`path` is a reward-model directory (one-label *ForSequenceClassification), `normalize` a known mode."""
    from tether.policy.checks import REWARD_MODEL, check_model_kind

    if kwargs.get("normalize", "none") not in NORMALIZE:
        raise ValueError(f"kwargs.normalize={kwargs['normalize']!r}: valid: {', '.join(NORMALIZE)}")
    check_model_kind(kwargs["path"], REWARD_MODEL, "kwargs.path")


reward_model.check_kwargs = _check_reward_model_kwargs  # type: ignore[attr-defined]
reward_model.batched = True  # type: ignore[attr-defined]
reward_model.learned = True  # type: ignore[attr-defined]  # a suspect for the health layer (detectors_learned)
REWARD_FUNCTIONS.register("reward_model")(reward_model)


def read_pairs(path: str | Path) -> list[dict[str, str]]:
    """Preference pairs from JSONL: {"prompt", "chosen", "rejected"} per line; errors name file:line."""
    from tether.tasks import read_jsonl_fields

    fields = ("prompt", "chosen", "rejected")
    return [{k: row[k] for k in fields} for row in read_jsonl_fields(path, fields, "rm.pairs / rm.eval_pairs")]
