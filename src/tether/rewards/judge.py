"""LLM-as-judge and rubric rewards: the `judge` reward component.

    reward:
      components:
        - {name: exact_match}                                   # the verifier (correctness)
        - name: judge
          weight: 0.5
          kwargs: {model: runs/judge-model, rubric: "Is the answer the reverse of the words?"}
        # or a judge served elsewhere (OpenAI-compatible):
        #   kwargs: {base_url: "http://127.0.0.1:8000/v1", model_name: judge, rubric: ...}
        # or the policy itself grading its own answers (Kimi K2's self-critique rubric reward):
        #   kwargs: {model: policy, rubric: ...}

A judge is asked, per completion, to grade it against a rubric (the task's `rubric` field when it
has one, else the component's `rubric`) with a prompt template (`template`, with the fields
{prompt}, {response}, {rubric}, {answer}); its free-text reply is parsed into a number
(`parse_judge_score`) and divided by `scale` (default 10: "7/10" -> 0.7). A reply with no score
is INVALID — counted, and masked or scored 0 by `reward.on_error` like any failed reward. Replies
are cached by a hash of (judge, template, prompt, response, rubric), so the same completion is
never graded twice; the whole batch runs under the reward time-out (`reward.timeout_s` per
sample; a hung judge is TIMEOUT, not a stalled run).

A local judge is any causal LM directory (greedy decoding with transformers' `generate`); the
policy itself is reached through `tether.rewards.live` (the RL recipe registers it). A remote
judge is any OpenAI-compatible `/chat/completions` endpoint (stdlib `urllib`; the `openai`
client could replace it — kept dependency-free on purpose).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request
from typing import Any, Mapping, Sequence

from tether.rewards.base import REWARD_FUNCTIONS

DEFAULT_TEMPLATE = (
    "Grade the response against the rubric. Reply with 'Score: N/10'.\n"
    "Rubric: {rubric}\nQuestion: {prompt}\nResponse: {response}\n"
)

# Most explicit first: "Score: 7/10", "[[7]]", "rating: 7", "7/10", "7 out of 10", then a lone number.
_PATTERNS = [
    re.compile(r"(?:score|rating|grade)\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.I),
    re.compile(r"\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]()"),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:/|out of)\s*(\d+(?:\.\d+)?)", re.I),
    re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*\.?\s*$()"),
]


def parse_judge_score(text: str, scale: float = 10.0) -> float | None:
    """The judge's score as a fraction of `scale` (clamped to [0, 1]), or None when there is none.

    An explicit denominator ("3/5") wins over `scale`. The last match of the most explicit
    pattern counts (judges often reason first and conclude with the score).
    """
    if not isinstance(text, str):
        return None
    for pat in _PATTERNS:
        hits = pat.findall(text)
        if hits:
            num, den = hits[-1]
            denom = float(den) if den else scale
            if denom <= 0:
                return None
            return min(1.0, max(0.0, float(num) / denom))
    return None


_CACHE: dict[str, float | None] = {}
CACHE_LIMIT = 200_000  # entries; the cache is emptied when it grows past this


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _ask_http(base_url: str, model_name: str, prompts: Sequence[str], max_new_tokens: int, timeout: float,
              api_key: str | None) -> list[str]:
    out = []
    for p in prompts:
        body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": p}],
                           "max_tokens": max_new_tokens, "temperature": 0.0}).encode()
        req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read().decode())
        out.append(reply["choices"][0]["message"]["content"] or "")
    return out


_LOCAL: dict[str, tuple[Any, Any]] = {}


def _ask_local(model: str, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    import torch

    from tether.rewards import live

    if model == "policy":
        m, tok = live.get_policy()
    else:
        if model not in _LOCAL:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            _LOCAL[model] = (AutoModelForCausalLM.from_pretrained(model).eval(), AutoTokenizer.from_pretrained(model))
        m, tok = _LOCAL[model]
    replies = []
    with torch.no_grad():
        for p in prompts:  # one at a time: no padding question for a judge's short prompts
            ids = torch.tensor([tok.encode(p, add_special_tokens=True)], device=next(m.parameters()).device)
            gen = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
            replies.append(tok.decode(gen[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    return replies


def judge(texts: Sequence[str], tasks: Sequence[Mapping[str, Any]], model: str | None = None,
          base_url: str | None = None, model_name: str = "judge", rubric: str = "Is the response correct?",
          template: str = DEFAULT_TEMPLATE, scale: float = 10.0, max_new_tokens: int = 32, timeout_s: float = 30.0,
          api_key: str | None = None, cache: bool = True) -> list[float | None]:
    """Reward component: a judge's parsed score per completion (None when unparseable -> INVALID)."""
    if (model is None) == (base_url is None):
        raise ValueError("judge: give exactly one of kwargs.model (a local model directory or 'policy') "
                         "and kwargs.base_url (an OpenAI-compatible endpoint)")
    prompts = [template.format(prompt=t.get("prompt", ""), response=x, rubric=t.get("rubric", rubric),
                               answer=t.get("answer", "")) for x, t in zip(texts, tasks)]
    who = base_url or model
    keys = [_key(who, model_name, p) for p in prompts]
    todo = [i for i, k in enumerate(keys) if not (cache and k in _CACHE) or model == "policy"]
    if todo:
        asked = [prompts[i] for i in todo]
        replies = (_ask_http(base_url, model_name, asked, max_new_tokens, timeout_s, api_key) if base_url
                   else _ask_local(model, asked, max_new_tokens))
        if len(_CACHE) > CACHE_LIMIT:
            _CACHE.clear()
        for i, reply in zip(todo, replies):
            _CACHE[keys[i]] = parse_judge_score(reply, scale)
    return [_CACHE[k] for k in keys]


def _check_judge_kwargs(kwargs: Mapping[str, Any]) -> None:
    """One judge (a causal LM directory, `policy`, or an http(s) endpoint), a template with known fields."""
    model, base_url = kwargs.get("model"), kwargs.get("base_url")
    if (model is None) == (base_url is None):
        raise ValueError("kwargs: give exactly one of kwargs.model (a local model directory or 'policy') and "
                         "kwargs.base_url (an OpenAI-compatible endpoint)")
    if base_url is not None and not str(base_url).startswith(("http://", "https://")):
        raise ValueError(f"kwargs.base_url={base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    if model is not None and model != "policy":
        from tether.policy.checks import CAUSAL_LM, check_model_kind

        check_model_kind(model, CAUSAL_LM, "kwargs.model")
    try:
        str(kwargs.get("template", DEFAULT_TEMPLATE)).format(prompt="", response="", rubric="", answer="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"kwargs.template: {type(err).__name__} {err} — the template may use only {{prompt}}, "
                         "{response}, {rubric} and {answer} (double other braces: {{ }})") from None
    if not isinstance(kwargs.get("scale", 10.0), (int, float)) or kwargs.get("scale", 10.0) <= 0:
        raise ValueError(f"kwargs.scale={kwargs.get('scale')!r}: a positive number (the score a perfect reply gets)")


judge.check_kwargs = _check_judge_kwargs  # type: ignore[attr-defined]
judge.batched = True  # type: ignore[attr-defined]
judge.learned = True  # type: ignore[attr-defined]  # a suspect for the health layer (detectors_learned)
REWARD_FUNCTIONS.register("judge")(judge)
