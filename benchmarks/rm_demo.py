"""A learned reward standing in for a hidden verifier (issue 19): SFT -> reward model -> RL against it.

    python benchmarks/rm_demo.py [--seeds 0] [--out runs/rm-demo] [--arms rm,weak_rm] [--quick]
    python benchmarks/rm_demo.py --arms rm --source runs/rm-demo/seed-0 --tag _winrate \
        --rm-kwargs 'normalize: winrate' --rl algo.advantage.name=dr_grpo --rl algo.kl.coef=0.2   # RL only
    python benchmarks/rm_demo.py --arms rm --rm-steps 3000 --rm-save-at 1500 ...   # also keep the RM at step 1500
    python benchmarks/rm_demo.py --seeds 0,1,2 --arms rm --source runs/rm-demo/seed-0 --rm-snapshot step-1500 ...
        # RL seeds 0-2 against that snapshot (the model a 1500-step RM run ends with)

1. SFT on the reverse task's weak-teacher demonstrations (configs/reverse.yaml); reused when
   `<out>/seed-N/sft/final_model` exists.
2. A Bradley-Terry reward model (`tether rm`) from preference pairs labelled by the verifier — the
   only place the verifier is used for training: the reference answer over each distinct wrong
   sample of the SFT policy (8 samples per problem at temperatures 1.0 and 1.5), and over a few
   rule-made corruptions of the reference (a letter changed, two swapped, one dropped or added,
   the word not reversed, empty, doubled: the off-distribution answers RL would otherwise find
   first). Held-out pair accuracy is measured on other training problems' pairs of the reference
   and the SFT policy's own wrong samples (temperature 1.0): the pairs RL meets first.
3. RL against the reward model alone: `exact_match` stays in the config with weight 0, so the
   policy never sees it; it is the verified correctness that held-out pass@1 and the health layer
   read (`reward.correctness`). A KL anchor to the SFT policy (`algo.kl.coef`).
4. The same RL against a deliberately weak reward model (verifier pairs of 16 problems, 3 steps),
   evaluated every 2 steps: the step of the health layer's first `learned_reward` finding (as
   `tether doctor` replays it from metrics.jsonl) vs the first evaluation 5 points below the start.
Also: `--arms verifier` (the same RL paid by the verifier: the ceiling) and `--arms probe` (the
RM's ranking of the SFT policy's own samples: best-of-n and the KL-regularised optimum).

Appends one entry per invocation to benchmarks/results/rm_demo.json (every figure, the CPU it ran
on, wall and CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import time
from pathlib import Path

from tether.config import load_config

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "configs" / "reverse.yaml"
RL = {"train.steps": 40, "eval.every": 5, "algo.kl.coef": 0.05, "train.lr": 1e-4}
REUSE_RM = False  # --reuse-rm: keep <out>/seed-N/rm (its summary.json) and only rerun RL
SOURCE: Path | None = None  # --source DIR: read sft/ and rm/ from DIR (another run's seed dir), never write there
RM_KWARGS = ""  # --rm-kwargs: more reward_model kwargs, YAML flow style ("normalize: winrate")
TAG = ""  # --tag: suffix of the RL run directories and result keys (rl_rm<tag>)
RM_STEPS, RM_SAVE_AT = 1500, ""  # --rm-steps, --rm-save-at: the RM's training steps and its snapshots (rm.save_at)
RM_LR = 1e-4  # --rm-lr: the RM's learning rate (rm.lr, constant)
RM_SNAPSHOT = ""  # --rm-snapshot step-N: RL against <rm>/step-N (a snapshot of a longer RM run) instead of <rm>
WEAK_RL = {"train.steps": 20, "eval.every": 2, "algo.kl.coef": 0.05, "train.lr": 1e-4}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def corruptions(answer: str, word: str, rng: random.Random, k: int, alphabet: str = "abcdefgh") -> list[str]:
    """Up to k distinct wrong answers made from the reference by rule."""
    def sub():
        i = rng.randrange(len(answer))
        return answer[:i] + rng.choice([c for c in alphabet if c != answer[i]]) + answer[i + 1:]

    def swap():
        i = rng.randrange(len(answer) - 1)
        return answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:]

    makers = [sub, sub, swap, lambda: answer[:-1], lambda: answer[1:], lambda: answer + rng.choice(alphabet),
              lambda: word, lambda: "", lambda: answer + answer, lambda: answer[: rng.randrange(len(answer))]]
    out: list[str] = []
    for make in rng.sample(makers, len(makers)):
        x = make()
        if x != answer and x not in out:
            out.append(x)
        if len(out) == k:
            break
    return out


def build_pairs(cfg, sft_model: Path, problems: list[dict], temps: tuple[float, ...], n: int, corrupt: int,
                seed: int) -> list[dict[str, str]]:
    """Reference over each distinct wrong sample of the policy (per temperature), plus `corrupt`
    rule-made wrong answers per problem."""
    import torch

    from tether.policy.hf import load_policy
    from tether.rollout import make_rollout

    policy = load_policy(str(sft_model), cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    pairs = []
    for temp in temps:
        sampling = cfg.rollout.sampling.model_copy(update={"temperature": temp})
        groups, _ = make_rollout(cfg).run(policy, problems, n, sampling, gen)
        for g in groups:
            ref, seen = g.task["answer"], set()
            for t in g.trajectories:
                text = t.info.get("text", "")
                if t.reward.correct is False and text.strip() != ref and text not in seen:
                    seen.add(text)
                    pairs.append({"prompt": g.task["prompt"], "chosen": ref, "rejected": text})
    for p in problems if corrupt else []:
        word = p["prompt"].split()[-1].rstrip(":")
        pairs += [{"prompt": p["prompt"], "chosen": p["answer"], "rejected": x}
                  for x in corruptions(p["answer"], word, rng, corrupt)]
    return pairs


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rl_overrides(rm_dir: Path | None, sft_model: Path, extra: dict) -> list[str]:
    """RL against the RM (the verifier at weight 0) or, rm_dir None, against the verifier itself (the ceiling)."""
    kw = RM_KWARGS if "normalize" in RM_KWARGS else ", ".join(x for x in ("normalize: none", RM_KWARGS) if x)
    comps = ("reward.components=[{name: exact_match, weight: 0.0}, {name: reward_model, "
             f"kwargs: {{path: '{rm_dir}', {kw}}}}}]") if rm_dir else "reward.components=[{name: exact_match}]"
    return [f"model.path={sft_model}", comps, "reward.correctness=exact_match", "logging.progress=false",
            "health.mode=advise"] + [f"{k}={v}" for k, v in extra.items()]


def _eval_curve(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(int(r["step"]), float(r["eval/pass@1"])) for r in rows if "eval/pass@1" in r]


def doctor_flags(run: Path) -> dict:
    """What `tether doctor RUN` reports: the replayed learned-reward findings and the diagnosis."""
    from tether.config import load_doctor_config
    from tether.health.doctor import _load_rows, replay

    cfg = load_doctor_config(run)
    findings, hyps = replay(_load_rows(run), cfg, run)
    mine = [f.to_json() for f in findings if f.detector == "learned_reward"]
    return {"first_learned_reward_step": mine[0]["step"] if mine else None, "learned_reward_findings": mine[:4],
            "other_detectors": sorted({f.detector for f in findings} - {"learned_reward"}),
            "diagnosis": hyps[0].cause if hyps else None}


def probe_rm(cfg, sft_model: Path, rm_dir: Path, problems: list[dict], n: int, seed: int) -> dict:
    """How much a reward model can lift the policy, read off the policy's own samples: per group of n
    samples (temperature 1.0) of the SFT policy, the verified pass rate, the RM's best-of-n, pass@n,
    and the verified accuracy of the KL-regularised optimum pi_ref * exp(r / beta) restricted to the
    group's samples (the optimum of E[r] - beta KL(pi || pi_ref), Rafailov et al. arXiv 2305.18290 eq. 4)
    for raw and sigmoid scores. Only a diagnostic: the problems are the RM's held-out pair problems."""
    import math

    import torch

    from tether.policy.hf import load_policy
    from tether.rewards.rm import load_reward_model, score_texts
    from tether.rollout import make_rollout

    policy = load_policy(str(sft_model), cfg.model.device, cfg.model.dtype, cfg.model.autocast_bf16)
    groups, _ = make_rollout(cfg).run(policy, problems, n, cfg.rollout.sampling, torch.Generator().manual_seed(seed))
    model, tok = load_reward_model(rm_dir)
    model.eval()
    rows = []
    for g in groups:
        texts = [t.info.get("text", "") for t in g.trajectories]
        rows.append((score_texts(model, tok, [g.task["prompt"]] * len(texts), texts), [bool(t.reward.correct) for t in g.trajectories]))

    def soft(f, beta):
        acc = 0.0
        for s, c in rows:
            r = [f(x) / beta for x in s]
            w = [math.exp(x - max(r)) for x in r]
            acc += sum(wi * ci for wi, ci in zip(w, c)) / sum(w)
        return acc / len(rows)

    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"problems": len(rows), "samples": n, "pass_rate": mean([mean(c) for _, c in rows]),
            "rm_best_of_n": mean([c[max(range(len(s)), key=s.__getitem__)] for s, c in rows]),
            "pass_at_n": mean([any(c) for _, c in rows]), "groups_without_correct": sum(not any(c) for _, c in rows),
            "kl_optimum_raw": {b: soft(lambda x: x, b) for b in (0.05, 0.3, 1.0, 3.0, 10.0)},
            "kl_optimum_sigmoid": {b: soft(sig, b) for b in (0.05, 0.3, 1.0)}}


def first_fall(curve: list[tuple[int, float]], points: float = 0.05) -> int | None:
    base = curve[0][1]
    return next((s for s, a in curve[1:] if a <= base - points), None)


def run_arm(name: str, rm_over: list[str], rl_extra: dict, base: list[str], sft_model: Path, out: Path) -> dict:
    from tether.recipes.rm import run_rm

    t, c = time.perf_counter(), cpu_seconds()
    rm_dir = (SOURCE or out) / name / (RM_SNAPSHOT if name == "rm" else "")
    reused = (REUSE_RM or SOURCE is not None) and (rm_dir / "summary.json").exists()
    if RM_SNAPSHOT and name == "rm" and not reused:
        raise SystemExit(f"--rm-snapshot {RM_SNAPSHOT}: no {rm_dir}/summary.json (with --source or --reuse-rm)")
    rm = json.loads((rm_dir / "summary.json").read_text()) if reused else run_rm(
        load_config(CONFIG, base + [f"model.path={sft_model}"] + rm_over), rm_dir, overwrite=True)
    res = {"rm": {"dir": str(rm_dir), "steps": rm["steps"], "pair_accuracy": rm["final_pair_accuracy"], "baseline_pair_accuracy": rm["baseline_pair_accuracy"],
                  "train_pairs": rm["train_pairs"], "eval_pairs": rm["eval_pairs"], "overrides": rm_over, "reused": reused,
                  "seconds": time.perf_counter() - t, "cpu_seconds": cpu_seconds() - c}}
    t, c = time.perf_counter(), cpu_seconds()
    over = base + _rl_overrides(rm_dir / "final_model", sft_model, rl_extra)
    return {**res, "rl": rl_result(over, out / f"rl_{name}{TAG}", t, c)}


def rl_result(over: list[str], run: Path, t: float, c: float) -> dict:
    from tether.recipes.rl import run_rl

    rl = run_rl(load_config(CONFIG, over), run, overwrite=True)
    curve = _eval_curve(run)
    return {"overrides": over, "run_dir": str(run), "baseline_accuracy": rl["baseline_accuracy"],
            "final_accuracy": rl["final_accuracy"], "best_accuracy": max(a for _, a in curve),
            "lift_points": 100 * (rl["final_accuracy"] - rl["baseline_accuracy"]), "eval_curve": curve, "first_5pt_fall_step": first_fall(curve), **doctor_flags(run),
            "seconds": time.perf_counter() - t, "cpu_seconds": cpu_seconds() - c}


def run_seed(seed: int, out: Path, arms: list[str], quick: bool) -> dict:
    from tether.train.setup import setup_problems
    from tether.recipes.sft import run_sft

    base = [f"run.seed={seed}", "run.threads=1", "logging.progress=false"] + (["sft.steps=60"] if quick else [])
    res: dict = {"seed": seed}
    t, c = time.perf_counter(), cpu_seconds()
    sft_model = (SOURCE or out) / "sft" / "final_model"
    reused = (sft_model / "config.json").exists()
    if SOURCE is not None and not reused:
        raise SystemExit(f"--source {SOURCE}: no sft/final_model there")
    if not reused:
        run_sft(load_config(CONFIG, base), out / "sft")
    res["sft"] = {"seconds": time.perf_counter() - t, "cpu_seconds": cpu_seconds() - c, "reused": reused}
    cfg = load_config(CONFIG, base)
    train, _ = setup_problems(cfg.data)
    if "probe" in arms:  # the RM's ranking of the SFT policy's own samples, on the RM's held-out pair problems
        t, c = time.perf_counter(), cpu_seconds()
        res["probe"] = probe_rm(cfg, sft_model, (SOURCE or out) / "rm" / "final_model", train[800:1000], 8, seed + 5)
        res["probe"].update(seconds=time.perf_counter() - t, cpu_seconds=cpu_seconds() - c)
    if "verifier" in arms:  # the ceiling: the same RL paid by the verifier the RM stands in for
        t, c = time.perf_counter(), cpu_seconds()
        over = base + _rl_overrides(None, sft_model, {**RL, "train.steps": 6} if quick else RL)
        res["verifier"] = {"rl": rl_result(over, out / f"rl_verifier{TAG}", t, c)}
    if "rm" in arms and (REUSE_RM or SOURCE) and ((SOURCE or out) / "rm" / "summary.json").exists():
        res["rm"] = run_arm("rm", [], RL, base, sft_model, out)
    elif "rm" in arms:
        t, c = time.perf_counter(), cpu_seconds()
        n_train, n_eval = (64, 32) if quick else (800, 200)
        pairs = build_pairs(cfg, sft_model, train[:n_train], (1.0, 1.5), 8, 0, seed)
        pairs += build_pairs(cfg, sft_model, train[:2000], (), 0, 4, seed)
        held = build_pairs(cfg, sft_model, train[n_train:n_train + n_eval], (1.0,), 8, 0, seed + 1)
        p, e = write_jsonl(out / "pairs" / "train.jsonl", pairs), write_jsonl(out / "pairs" / "eval.jsonl", held)
        res["pairs"] = {"train": len(pairs), "eval": len(held), "seconds": time.perf_counter() - t,
                        "cpu_seconds": cpu_seconds() - c}
        rm_over = [f"rm.pairs={p}", f"rm.eval_pairs={e}", f"rm.steps={60 if quick else RM_STEPS}", "rm.batch_size=32",
                   f"rm.lr={RM_LR:g}", "rm.eval_every=250"] + ([f"rm.save_at=[{RM_SAVE_AT}]"] if RM_SAVE_AT else [])
        res["rm"] = run_arm("rm", rm_over, {**RL, "train.steps": 6} if quick else RL, base, sft_model, out)
    if "weak_rm" in arms:
        weak = ["rm.steps=3", "rm.problems=16", "rm.lr=5e-4"]
        res["weak_rm"] = run_arm("weak_rm", weak, {**WEAK_RL, "train.steps": 4} if quick else WEAK_RL, base, sft_model, out)
    return res


def append_result(path: Path, payload: dict) -> None:
    """One entry per invocation under `invocations` (an older single-run file becomes the first entry)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    doc = old if "invocations" in old else {"invocations": [old] if old else []}
    doc["invocations"].append(payload)
    path.write_text(json.dumps(doc, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default="runs/rm-demo")
    ap.add_argument("--arms", default="rm,weak_rm")
    ap.add_argument("--quick", action="store_true", help="a smoke run (minutes): tiny steps, numbers meaningless")
    ap.add_argument("--results", default=str(HERE / "results" / "rm_demo.json"))
    ap.add_argument("--reuse-rm", action="store_true", help="reuse <out>/seed-N/rm and only rerun RL against it")
    ap.add_argument("--source", help="a seed directory of an earlier run (e.g. runs/rm-demo/seed-0): its sft/ and rm/ "
                    "are reused read-only; RL runs are written under --out")
    ap.add_argument("--rm-kwargs", default="", help="more reward_model kwargs, YAML flow style: 'normalize: sigmoid'")
    ap.add_argument("--tag", default="", help="suffix of the RL run directories (rl_rm<tag>) and of the result keys")
    ap.add_argument("--rm-steps", type=int, default=1500, help="the RM's training steps (rm.steps)")
    ap.add_argument("--rm-save-at", default="", help="also save the RM at these steps, comma-separated (rm.save_at): "
                    "the RM of a shorter run from the same run")
    ap.add_argument("--rm-lr", type=float, default=1e-4, help="the RM's learning rate (rm.lr, constant)")
    ap.add_argument("--rm-snapshot", default="", help="step-N: RL against the RM's step-N snapshot (--rm-save-at)")
    ap.add_argument("--rl", action="append", default=[], help="an RL override of the rm arm, key=value (repeatable)")
    a = ap.parse_args()
    global REUSE_RM, SOURCE, RM_KWARGS, TAG, RM_STEPS, RM_SAVE_AT, RM_SNAPSHOT, RM_LR
    REUSE_RM, SOURCE, RM_KWARGS, TAG = a.reuse_rm, Path(a.source) if a.source else None, a.rm_kwargs, a.tag
    RM_STEPS, RM_SAVE_AT, RM_SNAPSHOT, RM_LR = a.rm_steps, a.rm_save_at, a.rm_snapshot, a.rm_lr
    RL.update(dict(x.split("=", 1) for x in a.rl))
    from tether.hardware import cpu_info

    t0, c0 = time.perf_counter(), cpu_seconds()
    seeds, arms = [int(s) for s in a.seeds.split(",")], a.arms.split(",")
    runs = [run_seed(s, Path(a.out) / f"seed-{s}", arms, a.quick) for s in seeds]
    flags = (" --quick" if a.quick else "") + (" --reuse-rm" if a.reuse_rm else "") + "".join(f" --rl {x}" for x in a.rl)
    flags += "".join(f" {k} {v!r}" for k, v in (("--source", a.source), ("--rm-kwargs", a.rm_kwargs), ("--tag", a.tag),
                                                ("--rm-save-at", a.rm_save_at), ("--rm-snapshot", a.rm_snapshot)) if v)
    flags += f" --rm-steps {a.rm_steps}" if a.rm_steps != 1500 else ""
    flags += f" --rm-lr {a.rm_lr:g}" if a.rm_lr != 1e-4 else ""
    payload = {"command": f"python benchmarks/rm_demo.py --seeds {a.seeds} --arms {a.arms}{flags}", "rl": RL,
               "quick": a.quick, "cpu": cpu_info(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "wall_seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0, "runs": runs}
    append_result(Path(a.results), payload)
    for r in runs:
        for arm in [x for x in arms if x != "probe"]:
            x, rm = r[arm]["rl"], r[arm].get("rm", {}).get("pair_accuracy", float("nan"))
            print(f"seed {r['seed']} {arm}{TAG}: held-out pass@1 {x['baseline_accuracy']:.3f} -> {x['final_accuracy']:.3f} "
                  f"({x['lift_points']:+.1f} points, best {x['best_accuracy']:.3f}); RM pair accuracy "
                  f"{rm:.3f}; first learned_reward finding at step {x['first_learned_reward_step']}, "
                  f"first 5-point fall at step {x['first_5pt_fall_step']}; diagnosis {x['diagnosis']}")
    for r in runs:
        if "probe" in r:
            print(f"seed {r['seed']} probe: " + json.dumps({k: v for k, v in r["probe"].items() if "seconds" not in k}))
    print(f"wrote {a.results}")


if __name__ == "__main__":
    main()
