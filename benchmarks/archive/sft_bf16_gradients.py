"""How far the demo's SFT gradient is from fp32 under bf16 autocast, per scoring path.

    python benchmarks/archive/sft_bf16_gradients.py [--pretrain 300] [--out benchmarks/results/sft_bf16_gradients.json]

The question it answers: does the shared-prefix SFT path (`train.share_prefix`, the common system
prompt run once; tether.policy.prefix) lose accuracy under bf16 autocast that the padded path does
not? The demo's model (tether/configs/demo.yaml) is first trained `--pretrain` steps in fp32 (a
fresh model's loss is ~6.4, where every path rounds alike; a trained one's is ~0.06, where the
logits are peaked), then one SFT batch of 32 episodes gets its loss and gradient through every
arm: padded or prefix-shared, fp32 or bf16 autocast, transformers' modules or tether's lean
forward. Each arm's gradient is compared with the padded fp32 one: the relative error of the whole
gradient (||g - g_ref|| / ||g_ref||) and the three worst parameters.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: this script is archived one level below it
DEMO = HERE.parent / "src" / "tether" / "configs" / "demo.yaml"  # the embedded default (`tether demo`)


def _gradient(policy, records, cfg, share: str, bf16: bool, lean: str):
    import torch

    from tether.algos import agg_loss, compute_agg_norm
    from tether.train.batching import pad_records, split_by_token_budget
    from tether.policy.prefix import compute_sequence_logprobs

    pol = copy.deepcopy(policy)
    pol.autocast_bf16, pol.lean_train = bf16, lean
    pol.model.zero_grad(set_to_none=True)
    padded = pad_records(records, pol.pad_id)
    norm = compute_agg_norm(padded.loss_mask_BT)
    total = 0.0
    for idx in split_by_token_budget(padded.attention_mask_BT.sum(-1).tolist(), cfg.train.micro_batch_tokens):
        rows = torch.tensor(idx)
        am = padded.attention_mask_BT[rows]
        T = int(am.sum(-1).max())
        logp, _ = compute_sequence_logprobs(pol, padded.input_ids_BT[rows, :T], am[:, :T],
                                            torch.zeros(len(idx), dtype=torch.long), pack=False, share=share)
        loss = agg_loss(-logp, padded.loss_mask_BT[rows, :T], "token_mean", norm)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.detach().clone() for n, p in pol.model.named_parameters() if p.grad is not None}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrain", type=int, default=300, help="fp32 SFT steps before the comparison")
    ap.add_argument("--out", default=str(HERE / "results" / "sft_bf16_gradients.json"))
    args = ap.parse_args(argv)

    import torch

    import tether.recipes.sft as sft
    from tether.config import load_config
    from tether.data import ProblemStream
    from tether.hardware import cpu_info
    from tether.optim import build_optimizer, build_scheduler
    from tether.train.setup import seed_run, setup_policy, setup_problems
    from tether.rollout import compute_tokenizer_corpus
    from tether.rollout import make_rollout
    from tether.train.update import UpdateState

    t0 = time.time()
    cfg = load_config(DEMO, ["model.autocast_bf16=false"])  # fp32 for the pre-training
    seed_run(cfg.run)
    train, _ = setup_problems(cfg.data)
    policy = setup_policy(cfg.model, cfg.run.seed, tempfile.mkdtemp(), lambda: compute_tokenizer_corpus(cfg.data.task, train))
    records = make_rollout(cfg).build_demo_records(policy, train, cfg)
    opt = build_optimizer(policy.model.parameters(), cfg.sft.lr, cfg.sft.weight_decay)
    sched = build_scheduler(opt, cfg.sft.steps, cfg.sft.warmup_steps, "cosine")
    stream = ProblemStream([{"i": i} for i in range(len(records))], cfg.run.seed)
    losses = []
    for step in range(args.pretrain):
        batch = [records[r["i"]] for r in stream.next_batch(cfg.sft.batch_size)]
        losses.append(sft._sft_step(policy, opt, sched, batch, cfg, UpdateState()))
        if step % 50 == 0:
            print(f"  [pretrain] step {step}: loss {losses[-1]:.4f}", flush=True)
    batch = [records[r["i"]] for r in stream.next_batch(cfg.sft.batch_size)]
    ref_loss, ref = _gradient(policy, batch, cfg, "off", False, "off")
    ref_norm = torch.sqrt(sum(g.norm() ** 2 for g in ref.values()))
    arms = []
    for share in ("off", "on"):
        for bf16 in (False, True):
            for lean in ("off", "eager"):
                loss, g = _gradient(policy, batch, cfg, share, bf16, lean)
                err = {n: float((g[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-12)) for n in ref}
                whole = float(torch.sqrt(sum((g[n] - ref[n]).norm() ** 2 for n in ref)) / ref_norm)
                worst = sorted(err.items(), key=lambda kv: -kv[1])[:3]
                arm = {"share_prefix": share, "precision": "bf16" if bf16 else "fp32",
                       "forward": "lean" if lean == "eager" else "transformers", "loss": loss,
                       "grad_rel_error": whole, "worst": [[n, e] for n, e in worst]}
                arms.append(arm)
                print(f"  share={share:3s} {arm['precision']} {arm['forward']:12s} loss {loss:.5f} "
                      f"grad rel. error {whole:.4f}", flush=True)
    out = {"command": "python benchmarks/archive/sft_bf16_gradients.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": {k: v for k, v in cpu_info().items() if k in ("model", "arch", "cores", "flags")},
           "torch": torch.__version__, "pretrain_steps": args.pretrain, "pretrain_final_loss": losses[-1] if losses else None,
           "reference": "padded, fp32, transformers' modules", "reference_loss": ref_loss, "arms": arms,
           "wall_s": time.time() - t0}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
