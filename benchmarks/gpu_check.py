"""`make gpu-check`: one-command GPU validation (issue 20), <= 8 minutes on one GPU, one JSON out.

    python benchmarks/gpu_check.py --out gpu_check.json

Parts, each reported as {"status": "pass" | "fail" | "skipped", ...figures} in the JSON:
  extras  installs the GPU extras (`pip install -e .[vllm,peft]`) when a GPU is present and vLLM is not;
  vllm    benchmarks/vllm_check.py in a subprocess: vLLM with a random-init Qwen2 built locally,
          its log-prob self-test at several (temperature, top-k, top-p), the rollout/trainer
          log-prob gap, an in-place weight update with checksum, three RL steps with vLLM rollouts;
  fsdp2   one tether update through tether.dist.fsdp (FSDP2, `fully_shard`) at world size 1 on NCCL:
          loss finite, weights moved, equal to the same update unsharded (on a CPU the same code
          runs in tests/unit/test_gpu_check.py with gloo);
  lora    three LoRA RL steps from the config (tether train with model.lora) on the GPU; on a CPU
          this part runs on the CPU (it is CPU-safe) so the script checks something everywhere;
  tinker  the Tinker-compatible service (`tether serve-tinker`, docs/tinker.md) on cuda, driven by the
          real tinker SDK: a LoRA and a full-weight training client (forward_backward, optim_step),
          a sampler snapshot and `sample` with log-probs checked against the trainer's forward
          (< 2 minutes; vLLM is not involved). Runs first, before `extras` changes the environment.
Without CUDA the GPU parts are skipped with a message saying so, and the exit code is 0 when every
part that ran passed. Written without a GPU (none was lent to the session that wrote it): the GPU
parts are unvalidated until the first run on a device; the JSON says where a part stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for k, v in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
             ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(k, v)
NO_GPU = "skipped: no CUDA device here (this part needs a GPU; run make gpu-check on a GPU machine)"


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def part_extras() -> dict:
    if not has_cuda():
        return {"status": "skipped", "message": NO_GPU}
    missing = [m for m in ("vllm", "peft") if importlib.util.find_spec(m) is None]
    if missing:  # vLLM pins its own CUDA torch: let pip resolve it on the GPU machine
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[vllm,peft]"], check=True)
    return {"status": "pass", "installed": missing}


def part_vllm(out_dir: Path, budget_s: float) -> dict:
    if not has_cuda():
        return {"status": "skipped", "message": NO_GPU}
    out = out_dir / "vllm_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=budget_s)
    report = json.loads(out.read_text()) if out.is_file() else {}
    steps = report.get("steps", {})
    ok = proc.returncode == 0 and steps and all(s.get("ok") for s in steps.values())
    return {"status": "pass" if ok else "fail", "steps": steps, "returncode": proc.returncode,
            "stderr_tail": proc.stderr[-1500:] if not ok else ""}


def part_fsdp2() -> dict:
    """tether's FSDP2 path at world size 1 on NCCL (see run_fsdp2_step)."""
    if not has_cuda():
        return {"status": "skipped", "message": NO_GPU}
    return run_fsdp2_step("cuda", "nccl")


def _fsdp2_batch(vocab: int):
    import torch

    from tether.types import TrainBatch

    g = torch.Generator().manual_seed(1)
    B, T = 8, 16
    ids = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.tensor([16, 12, 16, 9, 14, 16, 11, 13])
    am = (torch.arange(T)[None] < lengths[:, None]).long()
    loss = am.clone().float()
    loss[:, :4] = 0
    adv = torch.randn(B, generator=g)[:, None].expand(B, T) * loss
    return TrainBatch(ids * am, am.bool(), loss, -2.0 * loss, adv.contiguous(), torch.arange(B) // 2, torch.arange(B))


def run_fsdp2_step(device: str, backend: str) -> dict:
    """One tether update (run_update, GRPO loss, 2 mini-batches) through tether.dist.fsdp at world
    size 1 — shard_model, the scorer inside the root unit, ShardedDataParallel — equals the same
    update unsharded. `run_fsdp2_step("cpu", "gloo")` is the CPU test of this part."""
    import copy

    import torch
    import torch.distributed as dist

    from tether.config import TinyModelConfig, load_config
    from tether.dist.fsdp import ShardedDataParallel, iter_full_state, shard_model
    from tether.dist.trainer import find_free_port
    from tether.optim import build_optimizer
    from tether.policy.hf import make_policy
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.train.update import UpdateContext, run_update

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        tok = build_tokenizer(["abc cba", "hello olleh", "1+2=3", "12+30=42"], 128)
        base = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
                                tok, seed=0).to(device)
        before = {k: v.detach().float().cpu().clone() for k, v in base.state_dict().items()}
        cfg = load_config(None, ["algo.mini_batches=2", "train.micro_batch_tokens=64", "train.share_prefix='off'",
                                 "train.lr=1e-3"])
        batch, out = _fsdp2_batch(len(tok)), {}
        for arm in ("plain", "fsdp2"):
            model = copy.deepcopy(base)
            model.train()
            dp = ShardedDataParallel(0, 1, cfg.train.micro_batch_tokens) if arm == "fsdp2" else None
            if dp is not None:
                shard_model(model)
            opt = build_optimizer(list(model.parameters()), cfg.train.lr)
            ctx = UpdateContext(make_policy(model, tok, device=device), opt, cfg.algo, cfg.train,
                                generator=torch.Generator().manual_seed(0), dp=dp)
            m = run_update(ctx, batch)
            out[arm] = ({k: v.float().cpu() for k, v in iter_full_state(model)}, m)
        (plain, mp), (sharded, ms) = out["plain"], out["fsdp2"]
        diff = max(float((sharded[k] - v).abs().max()) for k, v in plain.items())
        moved = max(float((v - before[k]).abs().max()) for k, v in plain.items())
        ok = plain.keys() == sharded.keys() and diff < 1e-5 and moved > 1e-5 and all(
            torch.isfinite(torch.tensor([mp["pg_loss"], ms["pg_loss"], ms["grad_norm"]])))
        return {"status": "pass" if ok else "fail", "device": device, "backend": backend, "pg_loss_plain": mp["pg_loss"],
                "pg_loss_fsdp2": ms["pg_loss"], "grad_norm_plain": mp["grad_norm"], "grad_norm_fsdp2": ms["grad_norm"],
                "max_weight_diff_after_update": diff, "max_weight_change": moved}
    finally:
        dist.destroy_process_group()


def part_lora(work: Path) -> dict:
    """Three LoRA RL steps from the config (GPU when present, else the CPU)."""
    from tether.config import load_config
    from tether.recipes.rl import run_rl

    device = "cuda" if has_cuda() else "cpu"
    cfg = load_config(None, [
        "model.lora={r: 8, alpha: 16}", f"model.device={device}", "data.task=reverse", "data.train_size=64",
        "data.eval_size=8", "train.steps=3", "rollout.problems_per_step=4", "rollout.n=4",
        "rollout.sampling.max_new_tokens=12", "eval.sampling.max_new_tokens=12", "eval.samples=1", "algo.kl.coef=0.01",
        "model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
        "model.tiny.intermediate_size=128", "reward.isolation=inline", "logging.progress=false",
        "logging.tensorboard=false", "checkpoint.every=0"])
    summary = run_rl(cfg, work / "lora_rl")
    rows = [json.loads(r) for r in open(work / "lora_rl" / "metrics.jsonl")]
    steps = [{k: r.get(k) for k in ("pg_loss", "kl_loss", "grad_norm", "time/step")} for r in rows if "pg_loss" in r]
    ckpt = work / "lora_rl" / "checkpoints" / "step_000003"
    ok = (len(steps) == 3 and summary["nonfinite_steps"] == 0 and (ckpt / "adapter_model.safetensors").is_file())
    return {"status": "pass" if ok else "fail", "device": device, "per_step": steps}


def part_tinker(work: Path, device: str = "cuda") -> dict:
    """The Tinker-compatible service on `device` through the real SDK (skipped without a GPU; the
    tests run the same code with device="cpu")."""
    if not has_cuda():
        return {"status": "skipped", "message": NO_GPU}
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import numpy as np
    import tinker
    from tinker import types

    from tether.config import TinyModelConfig
    from tether.policy.tiny import build_tiny_model, build_tokenizer
    from tether.serve.tinker import TinkerService, TinkerSettings

    tok = build_tokenizer(["reverse abcdef: fedcba", "hello olleh", "the cat sat on the mat"] * 10, 128)
    build_tiny_model(TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256), tok, work / "tiny")
    out: dict = {"device": device}
    with TinkerService({"tiny": work / "tiny"}, work / "tinker-state", TinkerSettings(device=device)) as svc:
        sc = tinker.ServiceClient(base_url=svc.base_url, api_key=svc.api_key)
        ids = tok.encode("reverse abcdef: fedcba")
        data = [types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})]
        for kind, rank, lr in (("lora", 16, 5e-3), ("full", 0, 1e-3)):
            t0 = time.perf_counter()
            tc = sc.create_lora_training_client(base_model="tiny", rank=rank, seed=0).result()
            losses = []
            for _ in range(5):
                fb = tc.forward_backward(data, "cross_entropy")
                tc.optim_step(types.AdamParams(learning_rate=lr)).result()
                losses.append(fb.result().metrics["loss:sum"])
            sampler = tc.save_weights_and_get_sampling_client().result()
            res = sampler.sample(types.ModelInput.from_ints(ids[:4]), 4, types.SamplingParams(max_tokens=8)).result()
            seq = res.sequences[0]
            full = ids[:4] + list(seq.tokens)
            fwd = tc.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                          loss_fn_inputs={"target_tokens": full[1:]})], "cross_entropy").result()
            trainer = fwd.loss_fn_outputs[0]["logprobs"].to_numpy()[3:]
            gap = float(np.abs(np.asarray(seq.logprobs) - trainer).max())
            out[kind] = {"losses": losses, "samples": len(res.sequences), "sample_vs_trainer_logprob_gap": gap,
                         "seconds": round(time.perf_counter() - t0, 2)}
        sc.close("success").result()
    ok = all(out[k]["losses"][-1] < out[k]["losses"][0] and out[k]["samples"] == 4
             and out[k]["sample_vs_trainer_logprob_gap"] < 1e-2 for k in ("lora", "full"))
    return {"status": "pass" if ok else "fail", **out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--only", default="tinker,extras,vllm,fsdp2,lora", help="comma-separated parts to run")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tether-gpu-check-"))
    import torch

    report: dict = {"cuda": torch.cuda.is_available(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "parts": {}}
    if not report["cuda"]:
        print(f"gpu-check: {NO_GPU.removeprefix('skipped: ')}; running the CPU-safe parts only", flush=True)
    t_start = time.perf_counter()
    parts = {"extras": part_extras, "vllm": lambda: part_vllm(work, 300), "fsdp2": part_fsdp2,
             "lora": lambda: part_lora(work), "tinker": lambda: part_tinker(work)}
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            res = parts[name]()
        except Exception as err:  # one failing part must not hide the others' figures
            res = {"status": "fail", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=6)}
        res["seconds"] = round(time.perf_counter() - t0, 2)
        report["parts"][name] = res
        print(f"gpu-check {name}: {res['status']}" + (f" ({res['message']})" if "message" in res else ""), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    report["seconds"] = round(time.perf_counter() - t_start, 2)
    report["passed"] = all(p["status"] != "fail" for p in report["parts"].values())
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"gpu-check: {'PASS' if report['passed'] else 'FAIL'} -> {args.out}", flush=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
