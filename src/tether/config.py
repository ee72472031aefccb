"""Typed configuration: YAML + `a.b=c` overrides, validated by pydantic (`extra="forbid"`).

Every section is a pydantic model. Unknown keys are rejected with the nearest valid key
suggested; combinations that would silently do nothing are rejected with the fix named
(pitfalls.md item 21). The resolved config is written into the run directory.

    cfg = load_config("configs/demo.yaml", ["algo.kl.coef=0.01", "train.steps=50"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import PositiveInt, BaseModel, ConfigDict, Field, ValidationError, model_validator

from tether.config_fit import do_fit_auto
from tether.config_text import ConfigError, apply_overrides, format_validation_error, parse_override


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # inf/nan refused everywhere


# ----------------------------------------------------------------------------- model / data


class TinyModelConfig(_Base):
    """A small Llama-style model built locally (no hub); the tokenizer is trained on the task."""

    hidden_size: int = Field(256, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    intermediate_size: int = Field(688, gt=0)
    vocab_size: int = Field(256, ge=32, description="target BPE vocabulary size")
    max_position_embeddings: int = Field(512, gt=0)


class LoraConfig(_Base):
    """LoRA adapters via peft (tether.policy.lora): only the adapters train; the KL reference is the base."""

    r: int = Field(8, gt=0, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="scale alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names to adapt, or 'all-linear'")


class ModelConfig(_Base):
    path: str | None = Field(None, description="local Hugging Face causal-LM directory")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16"] = "float32"
    autocast_bf16: bool | Literal["auto"] = Field(
        "auto", description="bf16 autocast for forward passes; auto: on only where the CPU/GPU does bf16 natively "
                            "(AVX-512-BF16/AMX, Arm BF16, CUDA bf16), fp32 elsewhere (tether.hardware)")
    cpu_linear: Literal["auto", "onednn", "torch"] = Field(
        "auto", description="CPU linear-layer kernels (tether.policy.cpu_gemm): onednn (oneDNN's inner product for "
                            "fp32 training matmuls; decode weights packed once), torch (PyTorch's own dispatch); auto: "
                            "the environment variable TETHER_CPU_GEMM if set, else onednn on x86-64, torch elsewhere. "
                            "A process-wide setting, applied when a run starts")
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward (transformers' activation "
                           "checkpointing): less memory, ~1 more forward of compute; turns prefix sharing and the "
                           "lean training forward off")
    lora: LoraConfig | None = Field(None, description="LoRA adapters (peft): only they train; the KL reference is the "
                                                      "base with adapters off; checkpoints hold the adapter (docs/lora.md)")
    device: str = "cpu"


class DataConfig(_Base):
    task: str = Field("arith", description="built-in task name, 'jsonl' to read `path`, or 'hf' to load `path` "
                                           "with `datasets` (tether.tasks.hf)")
    path: str | None = Field(None, description="jsonl: one {prompt, answer, ...} per line; hf: a parquet/JSONL/arrow/"
                                               "CSV file, a save_to_disk directory or a Hub dataset name")
    eval_path: str | None = Field(None, description="held-out problems; default: data.eval_size rows held out of path")
    prompt_key: str = Field("prompt", description="hf: the prompt column (a string or a list of chat messages); "
                                                  "dotted paths reach into nested columns")
    answer_key: str = Field("answer", description="hf: the gold-answer column (falls back to verl's "
                                                  "reward_model.ground_truth)")
    split: str = Field("train", description="hf: the split of a dataset directory or Hub dataset")
    eval_split: str | None = Field(None, description="hf: a held-out split of the same source (instead of eval_path)")
    streaming: bool = Field(False, description="hf: read rows lazily, the first train_size (+ eval_size) only")
    train_size: int = Field(2000, gt=0)
    eval_size: int = Field(200, gt=0)
    task_kwargs: dict[str, Any] = Field(default_factory=dict)
    chat: bool = Field(False, description="render prompts with the tokenizer's chat template")
    on_overlong: Literal["skip", "error"] = Field(
        "skip", description="a prompt longer than rollout.max_prompt_tokens (or the model's context minus "
                            "max_new_tokens): skip it with a counted warning, or refuse to start")
    seed: int = 1234


# ----------------------------------------------------------------------------- rollout


class SamplingConfig(_Base):
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    min_p: float = Field(0.0, ge=0, lt=1, description="keep tokens with p >= min_p * p_max (0 disables)")
    max_new_tokens: int = Field(32, gt=0)
    keep_mask: bool = Field(True, description="with top_k/top_p/min_p on: record the truncation per token and score "
                                              "the update under the same truncated distribution (false: the full one)")


class RolloutConfig(_Base):
    n: int = Field(8, ge=1, description="rollouts per problem (group size)")
    problems_per_step: int = Field(16, ge=1, description="B_p: problems per RL step")
    sampling: SamplingConfig = SamplingConfig()
    max_prompt_tokens: int = Field(256, gt=0)
    batch_size: int = Field(256, gt=0, description="sequences generated together")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the lean decode step (tether.policy.decode; Llama-family models): the "
                            "element-wise work of every layer fused, one graph for every step; the first generation "
                            "pays the compilation (25-28 s on a 2-core CPU in a fresh inductor cache, less from a warm "
                            "one). auto: in RL runs long enough to pay it back (tether.hardware.choose_compile)")
    on_drift: Literal["count", "fail"] = Field("count", description="multi-turn: a context that does not extend "
                                                                    "the previous one is counted or fails")


# ----------------------------------------------------------------------------- algorithm


class AdvantageConfig(_Base):
    name: str = Field("grpo", description="grpo|dr_grpo|rloo|reinforce_pp|reinforce_pp_baseline|remax|gae|gigpo|step_grpo")
    eps: float = Field(1e-6, gt=0, description="added to the std in normalisations")
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    step_gamma: float = Field(0.95, ge=0, le=1, description="turn-level discount (gigpo, step_grpo)")
    step_weight: float = Field(1.0, ge=0, description="GiGPO omega: weight of the step-level advantage")
    step_std_norm: bool = Field(False, description="GiGPO: divide by the group std (default mean_norm, as the paper's code)")
    task_norm: Literal["none", "task", "env"] = Field(
        "none", description="multi-task: whiten per task type (AgentRL) or baseline per environment (ERPO)"
    )


class PolicyLossConfig(_Base):
    name: str = Field("ppo_clip", description="ppo_clip|gspo|cispo")
    clip_low: float = Field(0.2, ge=0, description="epsilon_low: ratio floor is 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="epsilon_high: ratio cap is 1 + clip_high (DAPO: 0.28)")
    dual_clip_c: float | None = Field(None, gt=1, description="dual-clip constant c > 1 (off by default)")
    log_ratio_clamp: float = Field(20.0, gt=0, description="|log ratio| clamp before exp")


class AggConfig(_Base):
    mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"] = (
        "token_mean"
    )
    max_len: int | None = Field(None, gt=0, description="constant_norm L; default max_new_tokens")


class KLConfig(_Base):
    coef: float = Field(0.0, ge=0, description="beta; 0 disables KL and the reference model")
    estimator: str = Field("k3", description="k1|k2|k3|k3_iw (importance-weighted, unbiased)")
    placement: Literal["loss", "reward"] = "loss"
    reference: Literal["initial", "none"] = Field(
        "initial", description="reference policy: a frozen copy of the starting weights, or none"
    )
    reset_every: int | None = Field(None, gt=0, description="ProRL: reset reference every N steps")
    adaptive_target: float | None = Field(None, gt=0, description="adaptive KL controller target")
    adaptive_horizon: int = Field(10000, gt=0)
    clamp: float = Field(20.0, gt=0, description="|log ratio| clamp before exp")


class ISCorrectionConfig(_Base):
    """Rollout/trainer mismatch correction (TIS/MIS) and off-policy sequence masking."""

    mode: Literal["none", "truncate", "mask"] = "truncate"
    level: Literal["token", "sequence"] = "token"
    threshold_high: float = Field(2.0, gt=1)
    threshold_low: float | None = Field(None, gt=0, lt=1, description="mask mode: lower bound")
    off_policy_mask_delta: float | None = Field(None, gt=0, description="DeepSeek-V3.2 delta")


class DynamicSamplingConfig(_Base):
    enable: bool = False
    max_gen_batches: int = Field(4, ge=1, description="extra generation rounds to refill")
    tol: float = Field(1e-6, ge=0, description="a group is zero-variance if max-min <= tol")


class ShapingConfig(_Base):
    overlong_cache_len: int | None = Field(None, gt=0, description="DAPO soft overlong buffer")
    overlong_factor: float = Field(1.0, ge=0)
    length_penalty_coef: float = Field(0.0, ge=0, description="Kimi k1.5 length reward weight")


class ValueConfig(_Base):
    clip: float = Field(0.5, gt=0, description="value clip range epsilon_v")
    coef: float = Field(0.5, ge=0, description="value-loss weight")
    lr: float = Field(1e-4, gt=0)


class AlgoConfig(_Base):
    advantage: AdvantageConfig = AdvantageConfig()
    policy_loss: PolicyLossConfig = PolicyLossConfig()
    agg: AggConfig = AggConfig()
    kl: KLConfig = KLConfig()
    correction: ISCorrectionConfig = ISCorrectionConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    shaping: ShapingConfig = ShapingConfig()
    value: ValueConfig = ValueConfig()
    compact_filter: dict[str, Literal["mask", "keep", "zero"]] = Field(
        default_factory=dict,
        description="per stop reason (length, max_turns, timeout, ...): mask | keep | zero",
    )
    entropy_coef: float = Field(0.0, description="entropy bonus weight (loss -= coef * H)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch (PPO epochs, mu); IsoCompute M is train.steps")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass")


# ----------------------------------------------------------------------------- train / eval / io


class TrainConfig(_Base):
    steps: int = Field(100, ge=0)
    lr: float = Field(1e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(8192, gt=0, description="token budget per micro-batch")
    max_bad_steps: int = Field(3, ge=1, description="halt after this many non-finite steps in a row")
    pack_sequences: bool = Field(True, description="pack sequences into rows for scoring/training (same result, no padding compute)")
    share_prefix: Literal["auto", "on", "off"] = Field(
        "auto", description="compute a group's shared prefix once (MiniMax Forge); auto: when that runs fewer token positions")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the shared-prefix training forward (tether.policy.lean_train; Llama-family "
                            "models on a CPU); the first step pays the compilation (3.2M model, 2 cores: 11-20 s, 37-39 s "
                            "with an empty inductor cache). auto: in RL runs long enough to pay it back (hardware.choose_compile)")
    skip_zero_advantage: bool = Field(
        True, description="sequences whose every advantage is exactly 0 (a GRPO group with equal rewards) run forward "
                          "only, without gradients, when the loss has no other term: the same gradient and metrics")


class SFTConfig(_Base):
    steps: int = Field(300, ge=0)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    train_size: int | None = Field(None, gt=0, description="demonstrations to generate")
    demo_noise: float = Field(
        0.0, ge=0, lt=1,
        description="probability that a built-in demonstration's answer is corrupted (a weak teacher)",
    )


class RMConfig(_Base):
    """`tether rm`: a Bradley-Terry reward model trained from preference pairs (tether.recipes.rm)."""

    pairs: str | None = Field(None, description="JSONL of {prompt, chosen, rejected}; None: pairs from verifier "
                                                "outcomes of `samples` rollouts per training problem of model.path")
    eval_pairs: str | None = Field(None, description="held-out pairs (default: eval_fraction of the pairs)")
    eval_fraction: float = Field(0.1, gt=0, lt=1)
    samples: int = Field(8, ge=2, description="rollouts per problem when pairs come from verifier outcomes")
    problems: int = Field(256, gt=0, description="training problems sampled for verifier pairs")
    steps: int = Field(200, ge=1)
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(16, gt=0)
    max_length: int = Field(256, gt=0)
    eval_every: int = Field(50, ge=0)
    save_at: list[PositiveInt] = Field(
        default_factory=list, description="also save the model and its held-out pair accuracy at these steps "
        "(step-N/final_model, step-N/summary.json): the learning rate is constant, so each is the model of an "
        "N-step run, from one longer run")


class RewardComponentConfig(_Base):
    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = Field(default_factory=dict)
    max_steps: int | None = Field(
        None, gt=0, description="pay this component for at most N RL steps (a learned reward gets hacked: "
        "DeepSeek-R1 caps its RM-based RL at a few hundred steps); then at_max_steps (tether.rewards.cap)"
    )
    at_max_steps: Literal["stop", "drop"] = Field(
        "stop", description="stop: end the run at the cap; drop: weight 0 from then on, the other components train on"
    )


class RewardConfig(_Base):
    components: list[RewardComponentConfig] = Field(
        default_factory=lambda: [RewardComponentConfig(name="exact_match")]
    )
    correctness: str | None = Field(
        None, description="component whose value > 0 means verified-correct (default: first)"
    )
    timeout_s: float = Field(5.0, gt=0)
    isolation: Literal["process", "thread", "inline"] = "process"
    on_error: Literal["mask", "zero"] = "mask"
    max_error_rate: float = Field(0.5, gt=0, le=1, description="stop if a step's error rate exceeds it")


class EvalConfig(_Base):
    every: int = Field(0, ge=0, description="evaluate every N steps (0: only at start and end)")
    problems: int | None = Field(None, gt=0, description="held-out problems (default: all)")
    samples: int = Field(4, ge=1, description="samples per problem for pass@1 / pass@k")
    sampling: SamplingConfig = SamplingConfig(temperature=1.0)
    best_of: str = Field(
        "logprob", description="best@k selector: logprob (model confidence) | reward (the run's reward) | "
        "verifier (correctness: = pass@k) | a reward function name or package.module:function (e.g. a reward model)",
    )


class CheckpointConfig(_Base):
    every: int = Field(50, ge=0, description="0 disables periodic checkpoints")
    keep: int = Field(2, ge=1)


class LoggingConfig(_Base):
    tensorboard: bool = True
    wandb: bool = False
    mlflow: bool = False
    project: str = "tether"
    samples_per_step: int = Field(8, ge=0, description="completions stored per step")
    progress: bool = True


from tether.health.config import HealthConfig  # noqa: E402  (defined next to the health layer)
from tether.dist.config import DistConfig, find_dist_problems  # noqa: E402  (next to tether.dist)
from tether.recipes.stage_config import (  # noqa: E402  (next to the stage recipes)
    DistillConfig, DPOConfig, MergeConfig, PipelineConfig, RSSFTConfig,
)


class RunConfig(_Base):
    name: str = "run"
    seed: int = 0
    deterministic: bool | None = Field(
        None, description="torch deterministic algorithms; None: on for CPU-only runs (no measured cost there: "
                          "two-thread CPU runs otherwise drift apart in the last bits within a few steps), off with CUDA")
    threads: PositiveInt | Literal["auto"] | None = Field(None, description="torch threads; auto: cores the load leaves free")
    retain_memory: bool | None = Field(
        None, description="glibc malloc keeps freed memory for the next step instead of unmapping it (tether.runtime; "
                          "fewer page faults); None: on for CPU-only runs")


class ContextConfig(_Base):
    """How the transition history becomes the next model context (Agent-R1 context rules)."""

    builder: Literal["append", "sliding_window", "summary"] = "append"
    window: int = Field(2, ge=1, description="sliding_window / summary: the last k turns kept verbatim")
    summarizer: str = Field(
        "tether.envs.context:summarize_tool_results",
        description="summary: 'policy' (the model writes it, not trained on) or 'package.module:function'",
    )
    summary_max_tokens: int = Field(48, gt=0, description="summarizer=policy: tokens per summary")


class EnvConfig(_Base):
    """Multi-turn environments (data.task names one; data.task=env_mix mixes several)."""

    max_turns: int = Field(6, ge=1)
    max_context_tokens: int | None = Field(None, gt=0, description="default: model positions - max_new_tokens")
    step_timeout_s: float = Field(30.0, gt=0, description="one env.reset/step call; past it: stop reason timeout")
    episode_timeout_s: float = Field(600.0, gt=0)
    max_parse_errors: int = Field(2, ge=1, description="consecutive malformed tool calls that end an episode")
    max_error_rate: float = Field(0.5, gt=0, le=1, description="stop the run if more episodes end in env_error")
    credit: Literal["broadcast", "step"] = Field("broadcast", description="broadcast: the return is the trajectory "
                                                 "score; step: env rewards stay on their turns")
    reuse_kv: bool = Field(True, description="carry keys/values from one turn's sampling to the next turn's prefill "
                                             "(transformers sampler; tether.policy.kv_reuse)")
    context: ContextConfig = ContextConfig()


class SandboxConfig(_Base):
    """Where model-written code runs (tether/envs/sandbox.py; docs/agentic.md, "The code sandbox")."""

    backend: Literal["bwrap", "unshare", "rlimits"] | None = Field(
        None, description="default: $TETHER_SANDBOX_BACKEND, else bwrap (bubblewrap), required unless you opt in to "
        "a weaker backend, which warns naming what it does not protect: unshare (no filesystem isolation) or "
        "rlimits (limits and a uid only)"
    )


class HarnessConfig(_Base):
    """A black-box agent program trained through the OpenAI-compatible endpoint (tether.rollout.harness, agent_io)."""
    command: list[str] | None = Field(None, description="the agent program + arguments (`python`: tether's interpreter)")
    persistent: bool = Field(False, description="`concurrency` processes serve many episodes each (JSON lines in/out)")
    timeout_s: float = Field(300.0, gt=0, description="wall clock of one agent run")
    concurrency: int = Field(8, ge=1, description="agent programs running at once (their calls are batched)")
    host: str = Field("127.0.0.1", description="the endpoint's address; any non-loopback address needs `token`")
    token: str | None = Field(None, description="bearer token every request must carry (required off loopback)")


class TetherConfig(_Base):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    rm: RMConfig = RMConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    health: HealthConfig = HealthConfig()
    env: EnvConfig = EnvConfig()
    dist: DistConfig = DistConfig()
    sandbox: SandboxConfig = SandboxConfig()
    harness: HarnessConfig = HarnessConfig()
    rs_sft: RSSFTConfig = RSSFTConfig()
    dpo: DPOConfig = DPOConfig()
    distill: DistillConfig = DistillConfig()
    merge: MergeConfig = MergeConfig()
    pipeline: PipelineConfig = PipelineConfig()

    @model_validator(mode="after")
    def _no_silent_noops(self) -> "TetherConfig":
        for problem in find_noop_combinations(self):
            raise ValueError(problem)
        return self


def find_noop_combinations(cfg: TetherConfig) -> list[str]:
    """Flag settings that would silently do nothing or cannot work (pitfalls.md #21)."""
    out: list[str] = []
    kl, algo = cfg.algo.kl, cfg.algo
    if kl.coef > 0 and kl.reference == "none":
        out.append("algo.kl.coef > 0 needs a reference policy: set algo.kl.reference=initial or algo.kl.coef=0")
    if kl.coef == 0 and kl.reset_every is not None:
        out.append("algo.kl.reset_every does nothing with algo.kl.coef=0: set a coefficient or drop reset_every")
    if cfg.model.lora is not None and kl.reset_every is not None:
        out.append("algo.kl.reset_every cannot work with model.lora (the LoRA reference is the base with adapters off, "
                   "and a reset would merge the adapter): drop algo.kl.reset_every or model.lora")
    if kl.coef == 0 and kl.adaptive_target is not None:
        out.append("algo.kl.adaptive_target needs an initial algo.kl.coef > 0")
    from tether.validate import find_fact_problems, find_unknown_names  # asks the registries (rule 12)

    unknown = find_unknown_names(cfg)
    out.extend(unknown or find_fact_problems(cfg))
    if algo.dynamic_sampling.enable and cfg.rollout.n < 2:
        out.append("algo.dynamic_sampling needs rollout.n >= 2 to see reward variance")
    if algo.correction.mode == "mask" and algo.correction.threshold_low is None:
        out.append("algo.correction.mode=mask needs algo.correction.threshold_low (e.g. 0.5)")
    if algo.correction.mode != "mask" and algo.correction.threshold_low is not None:
        out.append("algo.correction.threshold_low only applies to mode=mask")
    if cfg.reward.correctness is not None:
        names = [c.name for c in cfg.reward.components]
        if cfg.reward.correctness not in names:
            out.append(f"reward.correctness={cfg.reward.correctness!r} is not one of reward.components {names}")
    if cfg.data.task == "jsonl" and not cfg.data.path:
        out.append("data.task=jsonl needs data.path=<file.jsonl>")
    if cfg.data.task == "hf" and not cfg.data.path:
        out.append("data.task=hf needs data.path=<file.parquet | dataset directory | hub name>")
    if cfg.harness.token is None and cfg.harness.host not in ("127.0.0.1", "localhost", "::1"):
        out.append(f"harness.host={cfg.harness.host!r} is not loopback: set harness.token (requests must carry it)")
    out.extend(find_dist_problems(cfg))
    return out


# ----------------------------------------------------------------------------- loading


def build_config(data: dict[str, Any], source: str = "<dict>") -> TetherConfig:
    try:
        return TetherConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, TetherConfig)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TetherConfig:
    """Read YAML (or start from defaults when `path` is None), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"{p} is a directory; expected a YAML config file (e.g. configs/demo.yaml)")
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            line = p.read_bytes()[: err.start].count(b"\n") + 1
            raise ConfigError(f"{p}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x}): save the file as UTF-8") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {' '.join(str(err).split())}") from None
        if loaded is None:
            raise ConfigError(f"{p}: the config file is empty; write at least one section (e.g. 'train: {{steps: 100}}'; "
                              "configs/demo.yaml is a complete example)")
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
        source = str(p)
        data.setdefault("run", {}).setdefault("name", p.stem)
    data = apply_overrides(data, overrides or [])
    return build_config(do_fit_auto(data, source), source)  # `auto` values follow the model and data (config_fit)


def dump_config(cfg: TetherConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
