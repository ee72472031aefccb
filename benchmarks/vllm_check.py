"""GPU validation of the vLLM rollout backend (tether.policy.vllm) — one prepared script.

    python benchmarks/vllm_check.py --out $OUT/vllm_check.json     # needs a CUDA GPU and `pip install tether[vllm]`

What it checks, each step reported (ok / failed with the error) in the JSON, in order:
1. engine   a small Qwen2-style model built locally (no hub) starts in vLLM from tether's model
            bundle (load_format=dummy + in-place load) with the sampling guards of policy/vllm.py;
2. sampler  `check_engine_logprobs`: the engine's sample log-probs equal log_softmax(filter(logits/T))
            recomputed from the full raw distribution, for several (T, top_k, top_p);
3. gap      rollout/trainer log-prob gap: vLLM samples scored by the trainer (HF, same weights);
4. sync     change the trainer's weights, load them in place: checksum ack, the probe log-probs
            follow the new weights (gap after << gap before);
5. rl       three steps of `tether train-async` with dist.backend=vllm on one GPU shared by the
            trainer (driver) and one rollout worker; staleness 1, TIS.
Written without a GPU (none was lent to the session that wrote it): expect to fix API drift on
the first run; the JSON says where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_qwen_like(out: Path):
    """A 2-layer Qwen2 (GQA) with a locally trained byte-level BPE, saved with save_pretrained."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from tether.policy.tiny import EOS, IM_END, build_tokenizer
    from tether.tasks import demonstration, make_problems

    problems = make_problems("reverse", 400, 0)
    tok = build_tokenizer([p["prompt"] + demonstration("reverse", p) for p in problems], 512)
    eos = [tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(IM_END)]
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(do_sample=True, top_k=50, top_p=0.8, temperature=0.7,  # a trap:
                                               eos_token_id=eos, pad_token_id=tok.pad_token_id)  # must NOT apply
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return [tok(p["prompt"])["input_ids"] for p in problems[:32]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="vllm_check.json")
    ap.add_argument("--skip-rl", action="store_true")
    args = ap.parse_args()
    report: dict = {"steps": {}}

    def step(name, fn):
        t0 = time.perf_counter()
        try:
            report["steps"][name] = {"ok": True, **(fn() or {})}
        except Exception as err:  # keep going where later steps do not depend on this one
            report["steps"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}",
                                     "traceback": traceback.format_exc(limit=8)}
        report["steps"][name]["seconds"] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
        print(name, json.dumps(report["steps"][name], default=str)[:600], flush=True)
        return report["steps"][name]["ok"]

    import torch

    from tether.config import SamplingConfig, load_config
    from tether.policy.weights import compute_checksum, make_model_bundle, to_numpy_state
    from tether.policy.hf import compute_logprobs, load_policy

    work = Path(tempfile.mkdtemp(prefix="tether-vllm-check-"))
    prompts = build_qwen_like(work / "model")
    trainer = load_policy(work / "model", device="cuda")
    state: dict = {}

    def engine():
        from tether.policy.vllm import build_vllm_policy

        vcfg = load_config(None).dist.vllm.model_copy(update={"gpu_memory_utilization": 0.3, "dtype": "float32"})
        state["vllm"] = build_vllm_policy(make_model_bundle(trainer), vcfg, seed=0)
        return {"stop_ids": list(state["vllm"].stop_ids), "max_positions": state["vllm"].max_positions}

    def sampler():
        from tether.policy.vllm import check_engine_logprobs

        gaps = {}
        for t, k, p in ((1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 20, 1.0), (0.8, 0, 0.9)):
            gaps[f"T={t},top_k={k},top_p={p}"] = check_engine_logprobs(
                state["vllm"], prompts[0], SamplingConfig(temperature=t, top_k=k, top_p=p, max_new_tokens=16), tol=0.02)
        return {"max_gap": gaps}

    def gap():
        s = SamplingConfig(temperature=1.0, max_new_tokens=16)
        samples = state["vllm"].generate(prompts, s, torch.Generator().manual_seed(1))
        diffs = []
        for smp in samples:
            ids = torch.tensor([list(smp.prompt_ids) + list(smp.token_ids)])
            with torch.no_grad():
                lp = compute_logprobs(trainer, ids, torch.ones_like(ids), 1.0)[0][0, -len(smp.token_ids):].cpu()
            diffs.append((lp - torch.tensor(smp.logprobs)).abs())
        d = torch.cat(diffs)
        return {"mean_abs_logp_gap": float(d.mean()), "max_abs_logp_gap": float(d.max()), "tokens": int(d.numel())}

    def sync():
        probe = [t for p in prompts[:2] for t in p]
        ids = torch.tensor([probe])

        def ref():
            with torch.no_grad():
                return compute_logprobs(trainer, ids, torch.ones_like(ids), 1.0)[0][0, 1:].cpu()

        with torch.no_grad():
            for prm in trainer.model.parameters():
                prm.add_(0.02 * torch.randn_like(prm))
        before = (torch.tensor(state["vllm"].score(probe)) - ref()).abs().max()
        arrays = to_numpy_state(trainer.model.state_dict())
        got = state["vllm"].load_weights(arrays)
        after = (torch.tensor(state["vllm"].score(probe)) - ref()).abs().max()
        if got != compute_checksum(arrays) or not after < 0.1 * before:
            raise RuntimeError(f"checksum {got} vs {compute_checksum(arrays)}, probe gap before {before:.3g} after {after:.3g}")
        return {"probe_gap_before": float(before), "probe_gap_after": float(after), "checksum": got}

    def rl():
        del state["vllm"]  # free its GPU memory for the run's own worker
        torch.cuda.empty_cache()
        from tether.recipes.rl_async import run_rl_async

        cfg = load_config(None, [
            f"model.path={work / 'model'}", "model.device=cuda", "data.task=reverse", "data.train_size=256",
            "data.eval_size=8", "train.steps=3", "rollout.problems_per_step=8", "rollout.n=8",
            "rollout.sampling.max_new_tokens=16", "eval.sampling.max_new_tokens=16", "eval.samples=2",
            "reward.isolation=inline", "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0",
            "dist.backend=vllm", "dist.rollout_workers=1", "dist.placement.rollout.gpus=0.5",
            "dist.placement.rollout.cpus=1", "dist.max_staleness=1", "dist.correction=tis",
            "dist.vllm.gpu_memory_utilization=0.3", "dist.sync.probe_tol=0.05"])
        summary = run_rl_async(cfg, work / "run")
        rows = [json.loads(r) for r in open(work / "run" / "metrics.jsonl")]
        keys = ("logp_gap_mean", "logp_gap_max", "rollout_kl_k3", "sync/probe_gap", "staleness/mean", "reward/mean")
        return {"summary": {k: v for k, v in summary.items() if not isinstance(v, dict)},
                "per_step": [{k: r.get(k) for k in keys if k in r} for r in rows if "pg_loss" in r]}

    report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    if step("engine", engine):
        step("sampler", sampler)
        step("gap", gap)
        step("sync", sync)
    if not args.skip_rl:
        step("rl", rl)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
