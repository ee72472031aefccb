"""Build the own-model, own-data example of docs/byo.md: a tiny Qwen2-format model and a verl-layout
parquet file of a task that model can learn, all locally (no hub).

    python tools/byo_example.py runs/byo-example        # -> runs/byo-example/tiny-qwen2, .../reverse.parquet
    tether pipeline configs/byo.yaml model.path=runs/byo-example/tiny-qwen2 \\
        data.path=runs/byo-example/reverse.parquet 'reward.components=[{name: exact_match}]'

The task is tether's `reverse` (reverse a word of 3-7 letters: "reverse abcd:" -> "dcba"), written in
verl's parquet layout: `prompt` is a list of chat messages, the gold answer is
`reward_model.ground_truth`, plus `data_source`, `ability` and `extra_info`. The model is built with
`tether.policy.families.build_family_model("qwen2", ...)`, as docs/byo.md describes: Qwen2's classes
and ChatML template, a byte-level BPE trained on the rows. Its vocabulary (280) leaves room for few
merges beyond the 256 bytes, so a letter is one token and reversing is a per-token task; 128 hidden
units and 4 layers (0.63M parameters) learn it on a CPU in minutes. The answers are words, not math:
configs/byo.yaml's math_verify reward cannot read them (tether doctor says so: `answers_unparsed`),
hence exact_match in the command above.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROWS, SEED = 2000, 1234


def verl_row(problem: dict, split: str) -> dict:
    """One problem in verl's parquet layout."""
    return {"data_source": "tether/reverse", "prompt": [{"role": "user", "content": problem["prompt"]}],
            "ability": "text", "reward_model": {"style": "rule", "ground_truth": problem["answer"]},
            "extra_info": {"index": problem["id"], "split": split}}


def build_example(out: str | Path, rows: int = ROWS, seed: int = SEED) -> tuple[Path, Path]:
    """(model directory, parquet file) under `out`."""
    import datasets

    from tether.policy.families import build_family_model, family_shape
    from tether.tasks import make_problems

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    problems = make_problems("reverse", rows, seed)
    parquet = out / "reverse.parquet"
    datasets.Dataset.from_list([verl_row(p, "train") for p in problems]).to_parquet(str(parquet))
    model = build_family_model("qwen2", out / "tiny-qwen2", corpus=[p["prompt"] + p["answer"] for p in problems],
                               shape=family_shape(vocab_size=280, hidden_size=128, num_layers=4, num_heads=4,
                                                  intermediate_size=256), num_kv_heads=2, seed=seed)
    return model, parquet


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output directory")
    ap.add_argument("--rows", type=int, default=ROWS)
    args = ap.parse_args(argv)
    model, parquet = build_example(args.out, args.rows)
    print(f"model: {model}\ndata:  {parquet}")


if __name__ == "__main__":
    main()
