"""The `dist:` section of the config (kept here, next to the code that reads it).

    dist:
      rollout_workers: 2            # Ray actors that generate (policy + environments + rewards)
      max_staleness: 1              # policy versions a sample may lag the trainer (0: synchronous)
      correction: tis               # REQUIRED once samples can be stale: tis | mis | opm | none
      placement: {strategy: PACK, rollout: {cpus: 1, gpus: 0}}
      partial: {token_budget: 256}  # multi-turn: park episodes over budget, continue with newer weights
      cross_policy: {pool_size: 2, rule: geometric}

Only `recipes/rl_async.py` (`tether train-async`) reads this section. Every default keeps the run
equivalent to the synchronous recipe: staleness 0, no partial rollouts, no cross-policy pool.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tether.section import Section



class ResourceConfig(Section):
    """Ray resources of one actor (one bundle of the placement group)."""

    cpus: float = Field(1.0, ge=0, description="logical CPUs")
    gpus: float = Field(0.0, ge=0, description="GPUs (fractions share a device)")


class PlacementConfig(Section):
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy over all rollout-worker and trainer bundles")
    rollout: ResourceConfig = ResourceConfig()
    trainer: ResourceConfig = Field(default_factory=lambda: ResourceConfig(cpus=1.0),
                                    description="per trainer rank beyond rank 0 (rank 0 is the driver process)")
    timeout_s: float = Field(60.0, gt=0, description="placement group not ready within this: fail with the reason")


class PartialRolloutConfig(Section):
    """Turn-level partial rollouts (Kimi-Researcher): a group whose episodes generated more than
    `token_budget` tokens in one rollout step is parked at its next turn and continued in a later
    step with the newer weights; every turn records the policy version that produced it."""

    token_budget: int | None = Field(None, gt=0, description="generated tokens per group per rollout step (None: off)")
    max_parks: int = Field(1, ge=1, description="a group parked this many times runs to completion when resumed")


class CrossPolicyConfig(Section):
    """Cross-policy sampling (AgentRL): each rollout step's acting policy is drawn from the
    current weights and a pool of recent ones; the rollout log-probs come from the policy that acted."""

    pool_size: int = Field(0, ge=0, description="past policy versions each worker keeps (0: off)")
    every: int = Field(1, ge=1, description="keep versions that are multiples of this")
    rule: Literal["uniform", "geometric"] = Field(
        "geometric", description="uniform over current+pool, or weight decay**age (age 0 = current)")
    decay: float = Field(0.5, gt=0, le=1, description="geometric: weight ratio between consecutive ages")


class SyncConfig(Section):
    """Weight sync: numpy through the object store, a checksum handshake and a probe."""

    probe_tol: float = Field(1e-3, gt=0, description="max |logp rollout - logp trainer| on the probe (nats)")
    on_probe_fail: Literal["fail", "warn"] = "fail"
    probe_problems: int = Field(2, ge=1, description="training prompts concatenated into the probe sequence")


class VLLMConfig(Section):
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    enforce_eager: bool = True
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: int | None = Field(None, gt=0, description="default: the model's positions")


class FaultConfig(Section):
    """Resilience testing: kill a rollout worker while a step's orders are in flight."""

    kill_worker_at_step: int | None = Field(None, ge=1, description="RL step (1-based) at which worker 0 is killed")


class DistConfig(Section):
    ray_address: str | None = Field(
        None, description="None: start a local Ray instance; 'auto' or 'ray://host:10001': join a cluster (ray start)")
    num_cpus: int | None = Field(None, gt=0, description="local instance only: logical CPUs (default: this machine's)")
    rollout_workers: int = Field(2, ge=1)
    trainer_workers: int = Field(1, ge=1, description="data-parallel trainer ranks; rank 0 is the driver")
    trainer_sharding: Literal["replicate", "fsdp2"] = Field(
        "replicate", description="trainer ranks hold whole replicas, or FSDP2 shards of the weights, gradients and "
                                 "AdamW state (tether.dist.fsdp; rank 0 keeps one plain copy to evaluate and publish)")
    backend: Literal["hf", "vllm"] = Field("hf", description="rollout engine: transformers (CPU/GPU) or vLLM (GPU)")
    worker_imports: list[str] = Field(default_factory=list, description="modules each rollout worker imports first "
                                      "(they register custom environments, tasks, rewards in the worker process)")
    placement: PlacementConfig = PlacementConfig()
    max_staleness: int = Field(0, ge=0, description="admission control: a batch for trainer version c is only "
                                                     "generated by weights of version >= c - max_staleness")
    correction: Literal["tis", "mis", "opm", "none"] | None = Field(
        None, description="off-policy correction; required when samples can be stale (see find_dist_problems)")
    inflight: bool = Field(False, description="weights published while a worker generates reach its running "
                                               "sequences between decode steps (tether.policy.inflight; hf backend)")
    partial: PartialRolloutConfig = PartialRolloutConfig()
    cross_policy: CrossPolicyConfig = CrossPolicyConfig()
    sync: SyncConfig = SyncConfig()
    vllm: VLLMConfig = VLLMConfig()
    order_timeout_s: float = Field(900.0, gt=0, description="a rollout order silent this long: its worker is "
                                                             "killed and the order retried")
    max_retries: int = Field(2, ge=0, description="retries of one order before its samples are dropped (counted)")
    restart_workers: bool = Field(True, description="replace a dead rollout worker with a fresh actor")
    fault: FaultConfig = FaultConfig()


# which algo.correction setting each explicit choice needs (the update applies algo.correction)
_CORRECTIONS = {
    "tis": ("truncated importance sampling", "algo.correction.mode=truncate"),
    "mis": ("masked importance sampling", "algo.correction.mode=mask (with algo.correction.threshold_low)"),
    "opm": ("off-policy sequence masking", "algo.correction.off_policy_mask_delta=<delta>"),
    "none": ("no correction (the bias is accepted)", "algo.correction.mode=none"),
}


def compute_correction_matches(choice: str, mode: str, delta: float | None) -> bool:
    """Whether `algo.correction` (mode, off_policy_mask_delta) implements the `dist.correction` choice."""
    return {"tis": mode == "truncate", "mis": mode == "mask", "opm": delta is not None,
            "none": mode == "none" and delta is None}[choice]


def find_dist_problems(cfg: Any) -> list[str]:
    """Combinations of `dist.*` that cannot work or would silently do nothing (docs/design.md, correctness
    rules 15 and 21)."""
    d, out = cfg.dist, []
    stale_reasons = [r for r, on in (
        (f"dist.max_staleness={d.max_staleness}", d.max_staleness > 0),
        ("dist.partial.token_budget", d.partial.token_budget is not None),
        ("dist.cross_policy.pool_size", d.cross_policy.pool_size > 0)) if on]
    if stale_reasons and d.correction is None:
        choices = "; ".join(f"{k} = {v[0]} ({v[1]})" for k, v in _CORRECTIONS.items())
        out.append(f"{', '.join(stale_reasons)} trains on samples from older policies: choose the off-policy "
                   f"correction explicitly with dist.correction: {choices}")
    c = cfg.algo.correction
    if d.correction is not None and not compute_correction_matches(d.correction, c.mode, c.off_policy_mask_delta):
        out.append(f"dist.correction={d.correction} ({_CORRECTIONS[d.correction][0]}) needs {_CORRECTIONS[d.correction][1]}; "
                   f"got algo.correction.mode={c.mode}, off_policy_mask_delta={c.off_policy_mask_delta}")
    if d.partial.token_budget is not None and d.max_staleness < 1:
        out.append("dist.partial.token_budget continues parked episodes with newer weights: set dist.max_staleness >= 1")
    if d.partial.token_budget is not None and cfg.algo.dynamic_sampling.enable:
        out.append("dist.partial.token_budget and algo.dynamic_sampling.enable cannot be combined "
                   "(a partial step's batch size is already variable)")
    if d.backend == "vllm" and d.placement.rollout.gpus <= 0:
        out.append("dist.backend=vllm needs a GPU per rollout worker: set dist.placement.rollout.gpus (e.g. 1)")
    sp = cfg.rollout.sampling
    filters = [f"{k}={v:g}" for k, v, on in (("top_k", sp.top_k, sp.top_k > 0), ("top_p", sp.top_p, sp.top_p < 1.0),
                                              ("min_p", sp.min_p, sp.min_p > 0)) if on]
    if d.backend == "vllm" and filters and sp.keep_mask:
        out.append(f"rollout.sampling.{', '.join(filters)}: the vllm backend does not report its sampling mask, so the "
                   "trainer would score a different distribution than the one sampled; use dist.backend=hf, drop "
                   "the filter, or set rollout.sampling.keep_mask=false to accept the mismatch on purpose")
    if d.backend == "vllm" and d.cross_policy.pool_size > 0:
        out.append("dist.cross_policy needs a second model per worker, which the vllm backend does not keep: "
                   "use dist.backend=hf or dist.cross_policy.pool_size=0")
    if d.trainer_workers > 1:
        for bad, why in ((cfg.health.mode == "auto", "health.mode=auto (a rollback on rank 0 only)"),
                         (cfg.algo.kl.reset_every is not None, "algo.kl.reset_every (a reference reset on rank 0 only)")):
            if bad:
                out.append(f"dist.trainer_workers > 1 keeps replicas in step by all-reducing gradients; {why} "
                           "would make them diverge: use dist.trainer_workers=1 or drop the setting")
    if d.trainer_sharding == "fsdp2":
        out.extend(find_fsdp2_problems(cfg))
    if d.inflight:
        for bad, why in ((d.backend == "vllm", "the vllm backend (no weight feed)"),
                         (d.cross_policy.pool_size > 0, "dist.cross_policy (the acting policy may be a pooled one)"),
                         (d.max_staleness < 1, "dist.max_staleness=0 (no generation overlaps a publish)")):
            if bad:
                out.append(f"dist.inflight cannot work with {why}: drop one of the two")
    if cfg.model.lora is not None:
        for bad, why in ((d.backend == "vllm", "dist.backend=vllm (its LoRA path is not wired)"),
                         (d.cross_policy.pool_size > 0, "dist.cross_policy (the pool keeps full weights)"),
                         (d.trainer_sharding == "fsdp2", "dist.trainer_sharding=fsdp2")):
            if bad:
                out.append(f"model.lora cannot be combined with {why}: drop one of the two")
    if d.ray_address is not None and d.num_cpus is not None:
        out.append("dist.num_cpus sizes a local Ray instance; it does nothing with dist.ray_address (a running cluster)")
    return out


def find_fsdp2_problems(cfg: Any) -> list[str]:
    """What `dist.trainer_sharding=fsdp2` cannot shard (tether.dist.fsdp)."""
    from tether.algos import ADVANTAGES

    out = []
    if cfg.dist.trainer_workers < 2:
        out.append("dist.trainer_sharding=fsdp2 shards over trainer ranks: set dist.trainer_workers >= 2 "
                   "(or dist.trainer_sharding=replicate)")
    per_mini = cfg.rollout.problems_per_step * cfg.rollout.n // max(cfg.algo.mini_batches, 1)
    if cfg.dist.trainer_workers > per_mini:
        out.append(f"dist.trainer_sharding=fsdp2 runs every rank in lockstep on each mini-batch: {per_mini} sequences per "
                   f"mini-batch cannot feed {cfg.dist.trainer_workers} ranks; raise rollout.problems_per_step or "
                   "rollout.n, or lower algo.mini_batches or dist.trainer_workers")
    if ADVANTAGES.facts(cfg.algo.advantage.name).needs_critic:
        out.append(f"dist.trainer_sharding=fsdp2 does not shard the critic of algo.advantage.name="
                   f"{cfg.algo.advantage.name}: use dist.trainer_sharding=replicate or a critic-free estimator (grpo)")
    return out
