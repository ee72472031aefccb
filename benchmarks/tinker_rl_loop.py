"""A Tinker RL loop: tinker-cookbook 0.5.8's rl_loop recipe, ported to run without the cookbook.

The original is `tinker_cookbook.recipes.rl_loop` (tinker-cookbook 0.5.8 on PyPI).

It talks to whatever Tinker service TINKER_BASE_URL (or --base-url) names, through the `tinker` SDK
only; it imports nothing from tether. The loop is the cookbook's, step for step: per batch,
`save_weights_and_get_sampling_client()`, one `sample(prompt, num_samples=group_size)` per problem
(all submitted before any is awaited), reward = exact match, advantage = reward - group mean, groups
whose advantages are all 0 skipped, one datum per sample (input = prompt + sampled tokens less the
last, targets = [0] * (prompt - 1) + sampled tokens, logprobs and advantages padded with 0 over the
prompt), `forward_backward(datums, "importance_sampling")` and `optim_step(AdamParams(lr, beta1=0.9,
beta2=0.95, eps=1e-8))` submitted together, then the final `save_state` + `save_weights_for_sampler`.

What differs from the cookbook file, and why (the cookbook cannot be installed here: 0.6.1 needs a
tml-renderers release the package index does not serve, 0.5.8 pins transformers <= 5.5.4):
- the dataset is a local JSONL file of {"prompt", "answer"} rows instead of GSM8K from the Hub;
- the prompt is the row's text tokenized by the model's own tokenizer (`get_tokenizer()` from the
  training client), where the cookbook renders a chat with its renderer; the sampler stops on the
  model's own stop tokens (`stop=None`), where the cookbook passes the renderer's stop sequences;
- the reward is exact match of the completion (without its stop token) against the answer, where
  the cookbook grades a \\boxed{} math answer;
- `.result()` on the clients the ServiceClient and TrainingClient return (SDK 0.38 deprecates using
  those futures as clients, which the cookbook file still does);
- metrics go to <log_path>/metrics.jsonl and the final checkpoint paths to <log_path>/checkpoints.jsonl
  (the cookbook's ml_log and checkpoint_utils write the same things).

    TINKER_BASE_URL=http://127.0.0.1:8900 TINKER_API_KEY=tml-local \\
        python benchmarks/tinker_rl_loop.py --model-name reverse-sft --train-path train.jsonl --log-path runs/rl-loop
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import tinker
from tinker import types

logger = logging.getLogger(__name__)


@dataclass
class Config:
    base_url: str | None = None
    log_path: str = "runs/rl-loop"
    model_name: str = "reverse-sft"
    train_path: str = "train.jsonl"
    batch_size: int = 16
    group_size: int = 8
    learning_rate: float = 1e-3
    lora_rank: int = 32
    max_tokens: int = 10
    max_steps: int | None = None


def get_reward(response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


def decode_response(tokenizer, tokens: list[int], stop_reason: str) -> str:
    """The completion text without its stop token (the cookbook's renderer.parse_response)."""
    if stop_reason == "stop" and tokens:
        tokens = tokens[:-1]
    return tokenizer.decode(tokens)


def build_datums(prompt: types.ModelInput, tokens_G, logprobs_G, advantages_G) -> list[types.Datum]:
    """One datum per sample, exactly as the cookbook's rl_loop.py builds them."""
    datums = []
    for sampled_tokens, logprobs, advantage in zip(tokens_G, logprobs_G, advantages_G):
        ob_len = prompt.length - 1
        model_input = prompt.append(types.EncodedTextChunk(tokens=sampled_tokens[:-1]))
        target_tokens = [0] * ob_len + sampled_tokens
        padded_logprobs = [0.0] * ob_len + logprobs
        padded_advantages = [0.0] * ob_len + [advantage] * (model_input.length - ob_len)
        assert model_input.length == len(target_tokens) == len(padded_logprobs) == len(padded_advantages)
        datums.append(types.Datum(model_input=model_input, loss_fn_inputs={
            "target_tokens": target_tokens, "logprobs": padded_logprobs, "advantages": padded_advantages}))
    return datums


def main(config: Config) -> dict:
    log_dir = Path(config.log_path)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(config.train_path).read_text().splitlines() if line.strip()]
    n_train_batches = len(rows) // config.batch_size
    service_client = tinker.ServiceClient(base_url=config.base_url)
    training_client = service_client.create_lora_training_client(base_model=config.model_name,
                                                                  rank=config.lora_rank).result()
    tokenizer = training_client.get_tokenizer()
    sampling_params = types.SamplingParams(max_tokens=config.max_tokens, stop=None)
    adam_params = types.AdamParams(learning_rate=config.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)
    total_steps = n_train_batches if config.max_steps is None else min(n_train_batches, config.max_steps)
    logger.info("Training for %d batches", total_steps)
    with open(log_dir / "metrics.jsonl", "w") as metrics_file:
        for batch_idx in range(total_steps):
            t_start = time.time()
            metrics: dict[str, float] = {"progress/batch": batch_idx, "optim/lr": config.learning_rate}
            batch_rows = rows[batch_idx * config.batch_size:(batch_idx + 1) * config.batch_size]
            sampling_client = training_client.save_weights_and_get_sampling_client().result()
            futures_P: list[Future] = []
            prompts_P: list[types.ModelInput] = []
            for row in batch_rows:
                model_input = types.ModelInput.from_ints(tokenizer.encode(row["prompt"]))
                futures_P.append(sampling_client.sample(prompt=model_input, num_samples=config.group_size,
                                                        sampling_params=sampling_params))
                prompts_P.append(model_input)
            datums_D: list[types.Datum] = []
            rewards_P: list[float] = []
            for future, prompt, row in zip(futures_P, prompts_P, batch_rows):
                result = future.result()
                tokens_G = [list(s.tokens) for s in result.sequences]
                logprobs_G = [list(s.logprobs) for s in result.sequences]
                rewards_G = [get_reward(decode_response(tokenizer, list(s.tokens), s.stop_reason), row["answer"])
                             for s in result.sequences]
                mean_reward = sum(rewards_G) / len(rewards_G)
                advantages_G = [r - mean_reward for r in rewards_G]
                rewards_P.append(mean_reward)
                if all(a == 0.0 for a in advantages_G):
                    continue  # skip a question whose rewards are all equal
                datums_D.extend(build_datums(prompt, tokens_G, logprobs_G, advantages_G))
            if datums_D:
                fwd_bwd_future = training_client.forward_backward(datums_D, loss_fn="importance_sampling")
                optim_step_future = training_client.optim_step(adam_params)
                fwd_bwd_future.result()
                optim_result = optim_step_future.result()
                metrics.update(optim_result.metrics or {})
            else:
                logger.warning("Batch %d: all advantages zero, skipping training step", batch_idx)
            metrics["time/total"] = time.time() - t_start
            metrics["reward/total"] = sum(rewards_P) / len(rewards_P)
            metrics["datums"] = len(datums_D)
            metrics_file.write(json.dumps(metrics) + "\n")
            metrics_file.flush()
            logger.info("batch %d reward %.3f datums %d %.1fs", batch_idx, metrics["reward/total"], len(datums_D),
                        metrics["time/total"])
    state_path = training_client.save_state("final").result().path
    sampler_path = training_client.save_weights_for_sampler("final").result().path
    final = {"name": "final", "batch": total_steps, "state_path": state_path, "sampler_path": sampler_path}
    with open(log_dir / "checkpoints.jsonl", "a") as f:
        f.write(json.dumps(final) + "\n")
    service_client.close("success").result()
    logger.info("Training completed")
    return final


def parse_args(argv=None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Config()).items():
        kind = type(default) if default is not None else (int if name == "max_steps" else str)
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=default)
    return Config(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[rl-loop %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    main(parse_args())
