"""Markdown table of a pipeline sweep's stages: per-seed values, mean +- s.e., paired change vs a reference.

    python benchmarks/stage_table.py benchmarks/results/pipelines/long2short/sweep.json \
        --stages long,rl_long,short,merged,rs_short,dpo_short,rl_short --ref long --tokens

Reads the `extra` metrics `stages.<stage>.heldout.eval/pass@1` (and `.../eval/answer_tokens` with
--tokens) that `tether sweep --command pipeline --extra-metric ...` recorded per run. The statistics
are tether.sweep's (sample s.d., ddof 1; paired differences by seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tether.sweep import compute_arm_stats, compute_difference


def _values(runs: list[dict], stage: str, key: str) -> dict[int, float]:
    out = {}
    for r in runs:
        v = r["extra"].get(f"stages.{stage}.heldout.{key}")
        if v is None:
            v = (next((s for s in r["summary"].get("stages", []) if s["name"] == stage), {}) or {}).get("heldout", {}).get(key)
        if v is not None:
            out[int(r["seed"])] = float(v)
    return out


def stage_table(sweep: dict, stages: list[str], ref: str | None, tokens: bool) -> str:
    runs = sorted(sweep["runs"], key=lambda r: r["seed"])
    seeds = [int(r["seed"]) for r in runs]
    head = ["stage", *[f"seed {s}" for s in seeds], "pass@1 mean ± s.e."]
    if ref:
        head.append(f"vs `{ref}` (paired ± s.e.)")
    if tokens:
        head += ["tokens per answer", f"tokens vs `{ref}`" if ref else "tokens s.e."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ref_acc = _values(runs, ref, "eval/pass@1") if ref else {}
    ref_tok = _values(runs, ref, "eval/answer_tokens") if ref else {}
    for st in stages:
        acc = _values(runs, st, "eval/pass@1")
        a = compute_arm_stats(list(acc.values()))
        row = [f"`{st}`", *[f"{acc[s]:.3f}" if s in acc else "—" for s in seeds], f"{a['mean']:.3f} ± {a['se']:.3f}"]
        if ref:
            d = compute_difference(ref_acc, acc) if st != ref else None
            row.append("(reference)" if d is None else f"{d['diff']:+.3f} ± {d['se']:.3f}" + (" (within noise)" if d["within_noise"] else ""))
        if tokens:
            tok = _values(runs, st, "eval/answer_tokens")
            t = compute_arm_stats(list(tok.values()))
            row.append(f"{t['mean']:.1f} ± {t['se']:.1f}")
            if ref:
                d = compute_difference(ref_tok, tok) if st != ref else None
                row.append("(reference)" if d is None else f"{d['diff']:+.1f} ± {d['se']:.1f}")
            else:
                row.append("")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_json", type=Path)
    ap.add_argument("--stages", required=True, help="comma-separated stage names, in table order")
    ap.add_argument("--ref", default=None, help="stage the others are compared with (paired by seed)")
    ap.add_argument("--tokens", action="store_true", help="also held-out tokens per answer")
    args = ap.parse_args()
    print(stage_table(json.loads(args.sweep_json.read_text()), args.stages.split(","), args.ref, args.tokens))


if __name__ == "__main__":
    main()
