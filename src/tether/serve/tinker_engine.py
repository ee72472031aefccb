"""What the Tinker-compatible service computes, on tether's own pieces (`tether.serve.tinker`).

- forward / forward_backward: the scorer of the update (`tether.policy.scoring`: the backbone once,
  the fp32 LM head in chunks) gives each datum's log-probs of its `target_tokens`; a loss of
  `tether.serve.tinker_losses` (tether's policy-loss registry) turns them into Tinker's summed loss,
  whose gradient accumulates on the model until optim_step. Datums are micro-batched by a token
  budget; the loss is a sum, so the split never changes the gradient.
- optim_step: the training model's AdamW with the request's AdamParams (learning rate, betas, eps,
  decoupled weight decay, global-norm clipping when grad_clip_norm > 0), stepped by the update's own
  guarded step (`tether.train.step.do_guarded_step`: a non-finite gradient skips the step, a step
  that leaves a non-finite weight is undone).
- sample: tether's sampler (`tether.policy.sampling.run_generate`: its own KV-cache loop, the
  log-prob of every sampled token under the distribution it was drawn from). Requests with equal
  settings on one sampler run as one batch; `num_samples` repeats the prompt. Stop token ids replace
  the model's own stop ids (`[]`: none at all); stop strings end a sequence at the token that
  completes the first of them (tokens up to it are returned, the model's stop ids still apply).
  Temperature 0 is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from tether.policy.config import SamplingConfig
from tether.policy.base import HFPolicy
from tether.policy.sampling import run_generate
from tether.policy.scoring import compute_head_logprobs, compute_hidden, compute_logprobs
from tether.serve.tinker_losses import TINKER_LOSSES, LossBatch, check_loss_call
from tether.serve.tinker_models import ModelStore, TinkerUserError
from tether.serve.tinker_wire import (ForwardBackwardCall, SampledSequence, encode_forward_backward_output,
                                      encode_sample_response)
from tether.train.batching import split_by_token_budget
from tether.train.step import do_guarded_step
from tether.types import StopReason


@dataclass(frozen=True)
class SampleJob:
    sampler_id: str
    prompt: tuple[int, ...]
    num_samples: int
    params: Mapping[str, Any]  # the SDK's SamplingParams as JSON
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None

    @property
    def key(self) -> tuple:
        """Jobs with equal keys run in one batch."""
        p = self.params
        stop = p.get("stop")
        return (self.sampler_id, p.get("temperature", 1.0), p.get("top_p", 1.0), p.get("top_k", -1),
                p.get("max_tokens"), json_key(stop), p.get("seed"))


def json_key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _pad(rows: Sequence[Sequence[float]], width: int, dtype, device, value: float = 0) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(np.asarray(r), dtype=dtype)
    return out.to(device)


def compute_target_logprobs(policy: HFPolicy, tokens: Sequence[Sequence[int]],
                            targets: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets[i][t] | tokens[i][:t+1]) [B, T], valid [B, T] bool): the update's scorer on
    right-padded rows (gradients flow when enabled)."""
    width = max(len(t) for t in tokens)
    ids = _pad(tokens, width, torch.long, policy.device, policy.pad_id)
    valid = _pad([[1] * len(t) for t in tokens], width, torch.bool, policy.device)
    hidden = compute_hidden(policy, ids, valid)
    logp, _ = compute_head_logprobs(policy.model, hidden, _pad(targets, width, torch.long, policy.device))
    return logp, valid


class TinkerEngine:
    """The operations of one service (module docstring); called on the service's worker thread."""

    def __init__(self, store: ModelStore, seed: int = 0, micro_batch_tokens: int = 8192, max_bad_steps: int = 3) -> None:
        self.store, self.seed = store, seed
        self.micro_batch_tokens, self.max_bad_steps = micro_batch_tokens, max_bad_steps
        self._generators: dict[str, torch.Generator] = {}

    # ------------------------------------------------------------------ training

    def forward_backward(self, call: ForwardBackwardCall) -> bytes:
        tm = self.store.trained(call.model_id)
        if not call.data:
            raise TinkerUserError("forward_backward: no data")
        problem = check_loss_call(call.loss_fn, [d.inputs for d in call.data], call.config)
        if problem:
            raise TinkerUserError(problem)
        targets = [self._targets(i, d.tokens, d.inputs, tm.policy) for i, d in enumerate(call.data)]
        policy = self.store.activate(tm)
        outputs: list[dict[str, np.ndarray]] = [{} for _ in call.data]
        metrics: dict[str, float] = {}
        weights: dict[str, float] = {}
        lengths = [len(d.tokens) for d in call.data]
        for idx in split_by_token_budget(lengths, self.micro_batch_tokens):
            with torch.set_grad_enabled(not call.forward_only):
                logp, valid = compute_target_logprobs(policy, [call.data[i].tokens for i in idx], [targets[i] for i in idx])
                width = logp.shape[1]
                names = [k for k in call.data[idx[0]].inputs if k != "target_tokens"]
                inputs = {k: _pad([call.data[i].inputs[k] for i in idx], width, torch.float32, policy.device) for k in names}
                loss_BT, m = TINKER_LOSSES[call.loss_fn](LossBatch(logp, valid, inputs, call.config))
                if not call.forward_only:
                    loss_BT.sum().backward()
            for j, i in enumerate(idx):
                n = lengths[i]
                outputs[i] = {"logprobs": logp[j, :n].detach().float().cpu().numpy(),
                              "elementwise_loss": loss_BT[j, :n].detach().float().cpu().numpy()}
            _merge_metrics(metrics, weights, m, float(valid.sum()))
        return encode_forward_backward_output(outputs, metrics)

    @staticmethod
    def _targets(i: int, tokens: Sequence[int], inputs: Mapping[str, np.ndarray], policy: HFPolicy) -> list[int]:
        t = inputs["target_tokens"]
        vocab = policy.model.get_output_embeddings().weight.shape[0]
        if t.ndim != 1 or len(t) != len(tokens):
            raise TinkerUserError(f"datum {i}: target_tokens has shape {list(t.shape)}; expected [{len(tokens)}] "
                                  "(one target per input token; top-k targets are not served)")
        for k, v in inputs.items():
            if k != "target_tokens" and v.shape != t.shape:
                raise TinkerUserError(f"datum {i}: loss_fn_inputs[{k!r}] has shape {list(v.shape)}, target_tokens {list(t.shape)}")
        if len(t) and (t.min() < 0 or t.max() >= vocab):
            raise TinkerUserError(f"datum {i}: target_tokens outside the vocabulary [0, {vocab})")
        if any(x < 0 or x >= vocab for x in tokens):
            raise TinkerUserError(f"datum {i}: model_input tokens outside the vocabulary [0, {vocab})")
        return [int(x) for x in t]

    def optim_step(self, model_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
        tm = self.store.trained(model_id)
        if params.get("type", "adamw") != "adamw":
            raise TinkerUserError(f"optimizer {params.get('type')!r} is not served (AdamW only)")
        lr = float(params.get("learning_rate", 1e-4))
        for g in tm.optimizer.param_groups:
            g.update(lr=lr, betas=(float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95))),
                     eps=float(params.get("eps", 1e-12)), weight_decay=float(params.get("weight_decay", 0.0)))
        clip = float(params.get("grad_clip_norm", 0.0))
        weights = tm.optimizer.param_groups[0]["params"]
        norm = do_guarded_step(tm.optimizer, None, weights, clip if clip > 0 else None, self.max_bad_steps, tm.state)
        tm.optimizer.zero_grad(set_to_none=True)
        tm.steps += 1
        return {"metrics": {"grad_norm": norm, "learning_rate": lr, "nonfinite_steps": float(tm.state.nonfinite_steps)}}

    # ------------------------------------------------------------------ sampling

    def sample_many(self, jobs: Sequence[SampleJob]) -> list[bytes | Exception]:
        """Every job's SampleResponse (or its error), equal settings batched together."""
        out: list[bytes | Exception | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault(job.key, []).append(i)
        for idx in groups.values():
            try:
                for i, result in zip(idx, self._sample_group([jobs[i] for i in idx])):
                    out[i] = result
            except Exception as err:  # reported to each job of the group; the service lives on
                for i in idx:
                    out[i] = err
        return out  # type: ignore[return-value]

    def _sample_group(self, jobs: Sequence[SampleJob]) -> list[bytes]:
        sampler = self.store.sampler(jobs[0].sampler_id)
        p = jobs[0].params
        temperature = float(p.get("temperature", 1.0))
        top_k = int(p.get("top_k", -1))
        max_tokens = p.get("max_tokens")
        sampling = SamplingConfig(temperature=temperature if temperature > 0 else 1.0, top_p=float(p.get("top_p", 1.0)),
                                  top_k=max(top_k, 0), keep_mask=False,
                                  max_new_tokens=int(max_tokens) if max_tokens else sampler.policy.max_positions)
        stop_ids, stop_strings = _stops(sampler.policy, p.get("stop"))
        policy = replace(sampler.policy, stop_ids=stop_ids)
        prompts = [list(j.prompt) for j in jobs for _ in range(j.num_samples)]
        for j in jobs:
            if not j.prompt or j.num_samples < 1:
                raise TinkerUserError("sample: the prompt must have at least one token and num_samples must be >= 1")
        with torch.no_grad(), self.store.sampling_policy(sampler):
            samples = run_generate(policy, prompts, sampling, self._generator(policy, p.get("seed")),
                                   greedy=temperature <= 0)
            results, k = [], 0
            for j in jobs:
                seqs = [_cut(s, stop_strings, policy.tokenizer) for s in samples[k:k + j.num_samples]]
                k += j.num_samples
                lp = self._prompt_logprobs(policy, j) if j.prompt_logprobs else None
                results.append(encode_sample_response(seqs, lp))
        return results

    def _generator(self, policy: HFPolicy, seed: Any) -> torch.Generator:
        dev = str(policy.device)
        if seed is not None:
            return torch.Generator(device=dev).manual_seed(int(seed))
        if dev not in self._generators:
            self._generators[dev] = torch.Generator(device=dev).manual_seed(self.seed)
        return self._generators[dev]

    @staticmethod
    def _prompt_logprobs(policy: HFPolicy, job: SampleJob) -> list[float]:
        ids = torch.tensor([job.prompt], dtype=torch.long)
        lp, _ = compute_logprobs(policy, ids, torch.ones_like(ids, dtype=torch.bool))
        out = [float("nan")] + lp[0, 1:].float().cpu().tolist()
        if job.prompt_logprobs_last_n:
            cut = len(out) - int(job.prompt_logprobs_last_n)
            out = [float("nan")] * cut + out[cut:]
        return out


def _merge_metrics(acc: dict[str, float], weights: dict[str, float], m: Mapping[str, float], tokens: float) -> None:
    """Micro-batch metrics into the call's: sums add, maxima take the max, means weight by tokens."""
    for k, v in m.items():
        if k.endswith(":sum"):
            acc[k] = acc.get(k, 0.0) + v
        elif k.endswith(":max"):
            acc[k] = max(acc.get(k, float("-inf")), v)
        else:
            w = weights.get(k, 0.0)
            acc[k] = (acc.get(k, 0.0) * w + v * tokens) / max(w + tokens, 1e-12)
            weights[k] = w + tokens


def _stops(policy: HFPolicy, stop: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(stop token ids, stop strings) of a SamplingParams.stop."""
    if stop is None:
        return policy.stop_ids, ()
    if isinstance(stop, str):
        return policy.stop_ids, (stop,)
    if not stop:  # [] turns every stop off, EOS included: an id no sample can have ends nothing
        return (int(policy.model.get_output_embeddings().weight.shape[0]),), ()
    if all(isinstance(s, int) for s in stop):
        return tuple(int(s) for s in stop), ()
    if all(isinstance(s, str) for s in stop):
        return policy.stop_ids, tuple(stop)
    raise TinkerUserError(f"sampling_params.stop={stop!r}: a string, a list of strings or a list of token ids")


def _cut(sample: Any, stop_strings: Sequence[str], tokenizer: Any) -> SampledSequence:
    """The sample as returned: cut after the token that completes the first stop string."""
    tokens, logprobs = list(sample.token_ids), list(sample.logprobs)
    stopped = sample.finish is StopReason.EOS

    def has_stop(k: int) -> bool:
        text = tokenizer.decode(tokens[:k])
        return any(s in text for s in stop_strings)

    if stop_strings and tokens and has_stop(len(tokens)):
        lo, hi = 1, len(tokens)  # the shortest prefix whose text holds a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if has_stop(mid) else (mid + 1, hi)
        tokens, logprobs, stopped = tokens[:lo], logprobs[:lo], True
    return SampledSequence(tuple(tokens), tuple(logprobs), stopped)
