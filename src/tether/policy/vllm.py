"""The vLLM rollout engine (GPU only): sampling with log-probs, in-place weight updates, probe scoring.

Imported lazily — only a rollout worker with `dist.backend=vllm` imports this module's engine
code, and `vllm` itself is imported inside the functions that need it, so nothing on the CPU
path ever touches it (vLLM's wheels are CUDA builds).

The sampler must sample from exactly the distribution the trainer scores (docs/design.md, correctness rule 3,
Golubev et al.: sampling filters silently enabled in the engine broke the importance ratios):
- `generation_config="vllm"`: the model's generation_config.json (top_k=50, top_p=0.8, ...)
  never becomes a default;
- every sampling field is set explicitly (`compute_sampling_kwargs`): temperature, top_p, top_k,
  min_p from the config, no penalties, no bias, no min_tokens; `check_sampling_params` reads
  the constructed SamplingParams back and refuses any field that differs;
- `logprobs_mode="processed_logprobs"`: returned log-probs are those of the processed
  distribution (logits / T, filtered) — tinker-feedback#148; `check_engine_logprobs` proves it
  at start-up by recomputing them from the full raw distribution (prompt_logprobs=-1);
- no prefix caching: a cached KV block from the previous weights would survive a sync;
- the engine does not report its sampling mask (which tokens top-k / top-p / min-p kept), so the
  config refuses those filters with this backend unless `rollout.sampling.keep_mask=false`
  (`tether.dist.config.find_dist_problems`); the HF sampler records it (`Sample.kept`).

Weights are loaded in place through a worker extension (`TetherWorkerExtension`) with
`model.load_weights` (vLLM's name mapping and fusing of q/k/v and gate/up), from the same numpy
arrays the HF workers receive. The engine reports the checksum of what it received; the probe
(prompt log-probs under the new weights vs the trainer's) shows that the load took effect.

NOT VALIDATED on a GPU in the session that wrote it (none was lent): see docs/distributed.md and
benchmarks/vllm_check.py, the prepared validation script.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from tether.types import Sample, StopReason

# Fields of vLLM's SamplingParams that must hold these neutral values (anything else changes the
# sampled distribution away from the trainer's logits / T).
NEUTRAL = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
           "min_tokens": 0, "logit_bias": None, "allowed_token_ids": None, "bad_words": None, "ignore_eos": False,
           "n": 1}


def compute_sampling_kwargs(sampling: Any, stop_ids: Sequence[int], max_tokens: int, seed: int | None,
                            greedy: bool = False) -> dict[str, Any]:
    """SamplingParams keyword arguments that reproduce tether's sampler (policy/sampling.py) exactly."""
    return {
        **NEUTRAL,
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        "top_k": 0 if greedy else int(sampling.top_k),  # 0 (or -1) disables top-k in vLLM
        "min_p": 0.0 if greedy else float(getattr(sampling, "min_p", 0.0)),
        "max_tokens": int(max_tokens),
        "seed": seed,
        "logprobs": 0,  # the sampled token's log-prob only
        "stop_token_ids": list(stop_ids),
        "detokenize": False,  # token ids are the only truth (docs/design.md, correctness rule 1)
        "skip_special_tokens": False,
    }


def check_sampling_params(params: Any, expected: Mapping[str, Any]) -> None:
    """Raise if the constructed SamplingParams differ from `expected` in any sampling field."""
    bad = []
    for k, want in expected.items():
        got = getattr(params, k, None)
        if k == "top_k" and want in (0, -1):
            ok = got in (0, -1, None)
        elif k == "stop_token_ids":
            ok = sorted(got or []) == sorted(want)
        elif isinstance(want, float):
            ok = got is not None and math.isclose(float(got), want, rel_tol=0, abs_tol=1e-9)
        else:
            ok = got == want or (want is None and not got)
        if not ok:
            bad.append(f"{k}={got!r} (tether needs {want!r})")
    if bad:
        raise RuntimeError("vLLM SamplingParams differ from the trainer's sampling settings: " + ", ".join(bad)
                           + " — the importance ratios would be wrong (docs/design.md, correctness rule 3)")


def compute_expected_sample_logprob(raw_logprobs_V: torch.Tensor, token: int, sampling: Any) -> float:
    """log p(token) under tether's sampler given the model's raw log-probs at one position:
    log_softmax(filter(raw / T)) — raw log-probs differ from logits by a constant, so this equals
    the sampler's log_softmax(filter(logits / T))."""
    from tether.policy.sampling import _filter_logits  # the sampler's own truncation, so the semantics match

    z = _filter_logits(raw_logprobs_V.float()[None] / sampling.temperature, sampling.top_k, sampling.top_p,
                       getattr(sampling, "min_p", 0.0))
    return float(torch.log_softmax(z, -1)[0, token])


def _logprob_of(entry: Any, token: int) -> float:
    """The log-prob of `token` in one position of a vLLM logprobs structure (dict or flat)."""
    item = entry[token] if token in entry else None
    if item is None:
        raise RuntimeError(f"vLLM returned no log-prob for the sampled token {token}")
    return float(getattr(item, "logprob", item))


def samples_from_outputs(outputs: Sequence[Any], prompts: Sequence[Sequence[int]], stop_ids: Sequence[int],
                         version: int) -> list[Sample]:
    """vLLM RequestOutputs -> tether Samples (token ids with the stop token, per-token log-probs)."""
    stops = set(stop_ids)
    out = []
    for prompt, ro in zip(prompts, outputs):
        c = ro.outputs[0]
        ids = list(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-probs for {len(ids)} tokens")
        logps = [_logprob_of(c.logprobs[i], t) for i, t in enumerate(ids)]
        if c.finish_reason == "stop":
            if not ids or ids[-1] not in stops:
                raise RuntimeError(f"vLLM stopped (stop_reason={c.stop_reason!r}) without a stop token at the end; "
                                   "tether trains on the stop token and needs its id and log-prob")
            finish = StopReason.EOS
        elif c.finish_reason == "length":
            finish = StopReason.LENGTH
        else:
            raise RuntimeError(f"vLLM finished a request with {c.finish_reason!r}")
        out.append(Sample(prompt_ids=tuple(prompt), token_ids=tuple(ids), logprobs=tuple(logps), finish=finish,
                          policy_version=version))
    return out


class TetherWorkerExtension:
    """Methods vLLM mixes into its GPU workers (`worker_extension_cls`); run via collective_rpc."""

    def tether_load_weights(self, arrays: Mapping[str, Any]) -> str:
        from tether.policy.weights import compute_checksum, from_numpy_state

        tensors = from_numpy_state(arrays, self.device)
        self.model_runner.model.load_weights(weights=list(tensors.items()))
        torch.cuda.synchronize()
        return compute_checksum(arrays)


@dataclass
class VLLMPolicy:
    """A vLLM engine behind tether's policy interface (run_generate dispatches to `generate`)."""

    llm: Any
    tokenizer: Any
    stop_ids: tuple[int, ...]
    pad_id: int
    max_positions: int
    version: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cuda"))
    autocast_bf16: bool = False

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any, generator: torch.Generator | None = None,
                 batch_size: int = 256, greedy: bool = False) -> list[Sample]:
        """One sample per prompt; per-request seeds come from `generator` (reproducible runs)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        params = []
        for ids, seed in zip(prompts, seeds):
            room = self.max_positions - len(ids)
            if room <= 0:
                raise ValueError(f"prompt of {len(ids)} tokens leaves no room in the model's {self.max_positions} positions")
            kw = compute_sampling_kwargs(sampling, self.stop_ids, min(sampling.max_new_tokens, room), seed, greedy)
            sp = SamplingParams(**kw)
            check_sampling_params(sp, kw)
            params.append(sp)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return samples_from_outputs(outs, prompts, self.stop_ids, self.version)

    def score(self, ids: Sequence[int]) -> list[float]:
        """Raw (T = 1) log-probs of ids[1:] given their prefixes: the weight-sync probe."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        ro = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0]
        return [_logprob_of(ro.prompt_logprobs[i], t) for i, t in enumerate(ids) if i > 0]

    def load_weights(self, arrays: Mapping[str, Any]) -> str:
        """Load in place on every engine worker; returns the checksum the engine computed."""
        sums = set(self.llm.collective_rpc("tether_load_weights", args=(dict(arrays),)))
        if len(sums) != 1:
            raise RuntimeError(f"vLLM workers disagree on the received weights: {sorted(sums)}")
        return sums.pop()


def check_engine_logprobs(policy: VLLMPolicy, prompt: Sequence[int], sampling: Any, tol: float = 0.05) -> float:
    """Prove that the engine's sample log-probs are log_softmax(filter(logits / T)): sample a few
    tokens, score the same sequence with the full raw distribution, recompute. Returns the max gap."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    s = policy.generate([prompt], sampling, torch.Generator().manual_seed(0))[0]
    full = list(prompt) + list(s.token_ids)
    sp = SamplingParams(max_tokens=1, prompt_logprobs=-1, temperature=1.0, detokenize=False)
    ro = policy.llm.generate([TokensPrompt(prompt_token_ids=full)], sp, use_tqdm=False)[0]
    gap = 0.0
    for j, (tok, lp) in enumerate(zip(s.token_ids, s.logprobs)):
        entry = ro.prompt_logprobs[len(prompt) + j]
        vocab = max(entry) + 1
        raw = torch.full((vocab,), float("-inf"))
        for t, item in entry.items():
            raw[t] = float(getattr(item, "logprob", item))
        gap = max(gap, abs(compute_expected_sample_logprob(raw, tok, sampling) - lp))
    if gap > tol:
        raise RuntimeError(f"vLLM sample log-probs differ from log_softmax(filter(logits / T)) by {gap:.3g} > {tol:g}: "
                           "the engine's logprobs_mode or sampling settings do not match the trainer")
    return gap


def build_vllm_policy(bundle: Mapping[str, Any], vcfg: Any, seed: int = 0) -> VLLMPolicy:
    """A vLLM engine with the bundle's architecture and tokenizer; weights loaded from the bundle."""
    try:
        from vllm import LLM
    except ImportError as err:  # pragma: no cover - GPU machines only
        raise RuntimeError("dist.backend=vllm needs the vllm extra on a CUDA machine: pip install 'tether[vllm]'") from err
    from transformers import AutoConfig, GenerationConfig

    from tether.policy.weights import write_bundle_files
    from tether.policy.hf import find_stop_ids

    d = write_bundle_files(bundle, tempfile.mkdtemp(prefix="tether-vllm-"))
    config = AutoConfig.from_pretrained(d, local_files_only=True)
    positions = int(vcfg.max_model_len or getattr(config, "max_position_embeddings", 4096))
    llm = LLM(model=str(d), tokenizer=str(d), load_format="dummy", dtype=vcfg.dtype, seed=seed,
              gpu_memory_utilization=vcfg.gpu_memory_utilization, enforce_eager=vcfg.enforce_eager,
              max_model_len=positions, generation_config="vllm", logprobs_mode="processed_logprobs",
              enable_prefix_caching=False, max_logprobs=-1,
              worker_extension_cls="tether.policy.vllm.TetherWorkerExtension")
    tokenizer = llm.get_tokenizer()
    try:
        gen = GenerationConfig.from_pretrained(d, local_files_only=True)
    except OSError:
        gen = None
    stop_ids = find_stop_ids(SimpleNamespace(config=config, generation_config=gen), tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    policy = VLLMPolicy(llm, tokenizer, stop_ids, int(pad), positions, version=int(bundle["version"]))
    policy.load_weights(bundle["arrays"])
    return policy


__all__ = ["NEUTRAL", "TetherWorkerExtension", "VLLMPolicy", "build_vllm_policy", "check_engine_logprobs",
           "check_sampling_params", "compute_expected_sample_logprob", "compute_sampling_kwargs", "samples_from_outputs"]
