"""Worker processes of `vs_trl.py`: one framework, one run, in a fresh interpreter.

    python benchmarks/bench_workers.py SPEC.json      # writes SPEC["result"]

Each run is its own process so that peak RSS belongs to one framework and imports, allocator
state and thread pools start equal. Both sides get the same model directory, the same problems
(tether's `reverse` task, drawn by tether's own `setup_problems`), the same reward function, the
same prompts x generations, the same sampling (temperature only: no top-k, top-p, min-p or
repetition penalty on either side; TRL's resolved generation config is recorded in the result)
and one optimizer step per generated batch.

Per step the result holds: step_s, gen_s (the sampling call alone), gen_tokens (completion
tokens), train_tokens (prompt + completion tokens, no padding), positions (token positions the
training forward+backward actually ran, padding included: tether's `train/positions`, TRL's
padded batch), gen_steps (decode steps: the longest completion), attn_sq (sum of squared
sequence lengths, for attention FLOPs), prompt_width (the longest prompt: the cache length at
the first decode step), reward.
With `account`, the worker then measures this machine's limits under the same load: the matmul
peak (fp32 and bf16), the decode-step floor (the weight matmuls of one decode step) and the
attention over the KV cache (measure_attention_floor).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

# the task both sides train on: the single-turn demo (reverse words), the benchmark's fixed setting
REVERSE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "reverse.yaml"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def reward_fn(text: str, task: dict, **_: object) -> float:
    """Dense reversal reward: fraction of answer characters in place, minus extra length (in [-1, 1])."""
    answer = task["answer"]
    text = text.strip()
    hits = sum(a == b for a, b in zip(text, answer))
    return hits / max(len(answer), 1) - min(1.0, max(0, len(text) - len(answer)) / 64)


def exact_match(text: str, answer: str) -> float:
    from tether.rewards.verifiers import exact_match_reward

    return float(exact_match_reward(text, {"answer": answer}))


def peak_rss_mb() -> dict[str, float]:
    """Peak RSS of this process (kernel high-water mark) + unique memory of live child processes."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    children = 0.0
    try:
        import psutil

        for c in psutil.Process().children(recursive=True):
            try:
                children += c.memory_full_info().uss / 2**20
            except (psutil.Error, OSError):
                pass
    except ImportError:  # pragma: no cover
        pass
    return {"self_mb": own, "children_uss_mb": children, "total_mb": own + children}


def load_cfg(spec: dict):
    from tether.config import load_config

    return load_config(REVERSE_CONFIG, tether_overrides(spec))


def tether_overrides(spec: dict) -> list[str]:
    s = spec
    o = [
        f"model.path={s['model_dir']}", "data.task=reverse", f"data.train_size={s['train_size']}",
        f"rollout.n={s['n']}", f"rollout.problems_per_step={s['prompts']}",
        f"rollout.sampling.max_new_tokens={s['max_new']}", f"rollout.sampling.temperature={s['temperature']}",
        "rollout.sampling.top_k=0", "rollout.sampling.top_p=1.0",
        f"train.lr={s['lr']}", "train.grad_clip=1.0", f"run.seed={s['seed']}", f"run.threads={s['threads']}",
        "algo.kl.coef=0.0", "algo.agg.mode=token_mean", f"algo.policy_loss.clip_low={s['clip_low']}",
        f"algo.policy_loss.clip_high={s['clip_high']}", "logging.progress=false", "logging.tensorboard=false",
        "health.mode=off", f"model.autocast_bf16={str(s['precision'] == 'bf16').lower()}",
    ]
    if s["reward"] == "dense":
        o.append('reward.components=[{name: "bench_workers:reward_fn"}]')
    return o + list(s.get("tether_overrides", []))


def _step_record(step_s, gen_s, prompts, completions, reward) -> dict:
    lens = [len(p) + len(c) for p, c in zip(prompts, completions)]
    return {"step_s": step_s, "gen_s": gen_s, "gen_tokens": float(sum(len(c) for c in completions)),
            "train_tokens": float(sum(lens)), "gen_steps": float(max((len(c) for c in completions), default=0)),
            "attn_sq": float(sum(n * n for n in lens)), "prompt_width": float(max((len(p) for p in prompts), default=0)),
            "reward": reward}


# ----------------------------------------------------------------------------- tether


def tether_state(spec: dict):
    """(config, tether.train.state.RLState) of a benchmark spec: seeded, the policy loaded in train mode."""
    from tether.policy.hf import load_policy
    from tether.settings import RunSettings
    from tether.train.state import build_rl_state
    from tether.train.setup import seed_everything, setup_problems

    cfg = load_cfg(spec)
    seed_everything(cfg.run.seed, False, cfg.run.threads, cfg.run.retain_memory)
    train, _ = setup_problems(cfg.data)
    m = cfg.model
    policy = load_policy(m.path, m.device, m.dtype, m.autocast_bf16)
    policy.model.train()
    return cfg, build_rl_state(RunSettings(cfg), policy, train)


def run_tether(spec: dict) -> dict:
    import torch

    from tether.recipes.rl import run_rl_step

    cfg, st = tether_state(spec)
    policy = st.policy
    if spec.get("slowdown_s"):  # bench_quick.py --slowdown: a deliberately slowed build, to show the guard fail
        _slow_down_update(spec["slowdown_s"])
    steps = []
    for _ in range(spec["warmup"] + spec["steps"]):
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        metrics, groups = run_rl_step(st)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        st.step += 1
        turns = [t.turns[0] for g in groups for t in g.trajectories]
        rec = _step_record(metrics["time/step"], metrics["time/generate"], [t.context_ids for t in turns],
                           [t.action_ids for t in turns], metrics["reward/mean"])
        rec["phases"] = {k: v for k, v in metrics.items() if k.startswith("time/")}
        rec["step_faults"] = float(faults)
        rec["positions"] = metrics["train/positions"]
        steps.append(rec)
    return {"steps": steps, "threads": torch.get_num_threads(), "model": policy.model,
            "compile": {"train": st.compile.train, "rollout": st.compile.rollout, "reason": st.compile.reason}}


def _slow_down_update(seconds: float) -> None:
    """Add `seconds` of sleep to every tether update (this process only; for the guard's demonstration)."""
    import tether.recipes.rl as rl

    update = rl.run_update

    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return update(*args, **kwargs)

    rl.run_update = slowed


# ----------------------------------------------------------------------------- TRL


def _trl_trainer(spec: dict, timings: dict):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tether.train.setup import setup_problems

    class TimedGRPO(GRPOTrainer):
        """GRPOTrainer with its sampling call timed (no behaviour change)."""

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            timings["gen_s"] += time.perf_counter() - t0
            timings["prompts"].extend(prompt_ids)
            timings["completions"].extend(out[0])
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timings["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            rec = _step_record(time.perf_counter() - timings["t0"], timings["gen_s"], timings["prompts"],
                               timings["completions"], timings["rewards"][-1] if timings["rewards"] else float("nan"))
            # TRL runs the backbone on left-padded prompts + right-padded completions: B x (max P + max C)
            rec["positions"] = float(len(timings["prompts"]) * (max(map(len, timings["prompts"]), default=0)
                                                                 + max(map(len, timings["completions"]), default=0)))
            timings["steps"].append(rec)
            timings.update(gen_s=0.0, prompts=[], completions=[])

    def reward(prompts, completions, answer, **kw):
        if spec["reward"] == "dense":
            r = [reward_fn(c, {"answer": a}) for c, a in zip(completions, answer)]
        else:
            r = [exact_match(c, a) for c, a in zip(completions, answer)]
        timings["rewards"].append(sum(r) / len(r))
        return r

    train, _ = setup_problems(load_cfg(spec).data)
    data = Dataset.from_list([{"prompt": p["prompt"], "answer": p["answer"]} for p in train])
    bf16 = spec["precision"] == "bf16"
    args = GRPOConfig(
        output_dir=spec["out_dir"], use_cpu=True, bf16=bf16, seed=spec["seed"], data_seed=spec["seed"],
        per_device_train_batch_size=spec["prompts"] * spec["n"], gradient_accumulation_steps=1,
        num_generations=spec["n"], max_completion_length=spec["max_new"], temperature=spec["temperature"],
        top_k=0, top_p=1.0, min_p=None, repetition_penalty=1.0, learning_rate=spec["lr"], lr_scheduler_type="constant",
        beta=0.0, epsilon=spec["clip_low"], epsilon_high=spec["clip_high"], loss_type="dapo", max_grad_norm=1.0,
        max_steps=spec["warmup"] + spec["steps"], num_iterations=1, logging_steps=10**6, report_to="none",
        save_strategy="no", gradient_checkpointing=False, disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False, scale_rewards="group", mask_truncated_completions=False,
    )
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype="float32", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    return TimedGRPO(model=model, reward_funcs=[reward], args=args, train_dataset=data, processing_class=tok,
                     callbacks=[StepTimer()])


def run_trl(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    timings = {"steps": [], "gen_s": 0.0, "prompts": [], "completions": [], "rewards": [], "t0": 0.0}
    trainer = _trl_trainer(spec, timings)
    gc = trainer.generation_config
    sampling = {k: getattr(gc, k, None) for k in ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")}
    trainer.train()
    return {"steps": timings["steps"], "threads": torch.get_num_threads(), "trl_sampling": sampling, "model": trainer.model}


# ----------------------------------------------------------------------------- this machine's limits


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def measure_matmul_peak(n: int = 1536, reps: int = 7) -> dict[str, float]:
    """GFLOP/s of one n x n x n GEMM, fp32 and bf16 (median of `reps`, threads as configured)."""
    import torch

    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        a @ b
        out[name] = 2 * n**3 / _median_time(lambda: a @ b, reps) / 1e9
    return out


def measure_attention_floor(model, batch: int, bf16: bool, lengths: tuple[int, ...] = (32, 96), reps: int = 15) -> dict:
    """The decode step's attention over its KV cache, alone: per layer q @ K^T and weights @ V as two
    batched matmuls over contiguous [batch, kv heads, L, head dim] buffers in the cache's precision
    (one pair of buffers per layer, so the cache's memory traffic is the real one), timed at
    `lengths` and fitted as seconds = a + b * L. This is work any KV-cache decoder does at every
    token and that the weight-matmul floor leaves out; on a small model with a big batch it is
    mostly memory traffic (the cache outgrows the weights)."""
    import torch

    cfg = model.config
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dt = torch.bfloat16 if bf16 else torch.float32
    q = torch.randn(batch, kvh, heads // kvh, d).to(dt)
    times = []
    for length in lengths:
        kv = [(torch.randn(batch, kvh, length, d).to(dt), torch.randn(batch, kvh, length, d).to(dt))
              for _ in range(cfg.num_hidden_layers)]

        def step():
            for k, v in kv:
                torch.matmul(torch.matmul(q, k.transpose(-1, -2)), v)

        with torch.inference_mode():
            step()
            times.append(_median_time(step, reps))
    b = (times[-1] - times[0]) / (lengths[-1] - lengths[0])
    return {"a": times[0] - b * lengths[0], "b": b, "lengths": list(lengths), "seconds": times}


def measure_decode_floor(model, batch: int, bf16: bool, reps: int = 15) -> float:
    """Seconds of the weight matmuls of one decode step at `batch` (every nn.Linear once, incl. the
    LM head): a decode step with free attention, sampling and bookkeeping."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dt = torch.bfloat16 if bf16 else torch.float32
    ws = [(m.weight.detach().to(dt), torch.randn(batch, m.in_features).to(dt)) for m in linears]

    def step():
        for w, x in ws:
            torch.nn.functional.linear(x, w)

    with torch.inference_mode():
        step()
        return _median_time(step, reps)


def run_sft(spec: dict) -> dict:
    """The reverse demo's SFT cold start (weak teacher), saved to SPEC["out"]/final_model: the RL start of
    the learning curves."""
    from tether.config import load_config
    from tether.recipes.sft import run_sft as tether_sft

    cfg = load_config(REVERSE_CONFIG, [f"sft.steps={spec['sft_steps']}", f"run.threads={spec['threads']}",
                                           "logging.progress=false", "logging.tensorboard=false"])
    policy, summary = tether_sft(cfg, spec["out"])
    return {"steps": [], "summary": summary, "model": policy.model}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    fn = {"tether": run_tether, "trl": run_trl, "sft": run_sft}[spec["framework"]]
    out = fn(spec)
    model = out.pop("model")
    out["peak_rss"] = peak_rss_mb()  # before the measurements below allocate anything
    out["params"] = sum(p.numel() for p in model.parameters())
    cfg = model.config
    out["arch"] = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size}
    if spec.get("account"):
        out["matmul_peak_gflops"] = measure_matmul_peak()
        out["decode_floor_s"] = measure_decode_floor(model, spec["prompts"] * spec["n"], spec["precision"] == "bf16")
        out["attention_floor"] = measure_attention_floor(model, spec["prompts"] * spec["n"], spec["precision"] == "bf16")
    Path(spec["result"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
