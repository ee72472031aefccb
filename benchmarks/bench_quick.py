"""The performance regression guard (`make bench-quick`, ~2-3 min on 2 quiet cores).

    python benchmarks/bench_quick.py             # run, compare with the committed baseline, exit 1 if worse
    python benchmarks/bench_quick.py --update    # run and record this result as the baseline of this CPU (class and generation)

Runs the small-model comparison of `vs_trl.py` in one sitting (tether with its defaults and TRL
in fp32, alternating fresh processes, `--runs` each) and compares the tether/TRL s/step ratio with
the committed baseline for this machine (`benchmarks/results/baseline_quick.json`: keyed by
tether.hardware.cpu_class, native-bf16, avx512, avx2, other, and where known the CPU generation,
e.g. "native-bf16 family 25 model 17"; a class entry recorded on another generation is not used).
A ratio, not a time: both sides slow down together on a busy machine. The guard fails (exit 1) when
the ratio is more than `--tolerance` (15%) above the baseline; with no baseline for this machine it
passes and says how to record one. Refreshing the baseline: docs/performance.md ("The regression guard").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
BASELINE = HERE / "results" / "baseline_quick.json"


def check_ratio(ratio: float, baseline: dict | None, tolerance: float, note: str = "") -> tuple[bool, str]:
    """(passed, message): `ratio` (tether s/step / TRL s/step, lower is better) against the baseline's."""
    if baseline is None:
        why = note or "no baseline for this CPU class"
        return True, f"tether/TRL s/step {ratio:.3f}; {why}: not checked; record one with --update"
    limit = baseline["ratio"] * (1 + tolerance)
    verdict = "OK" if ratio <= limit else "REGRESSION"
    msg = (f"{verdict}: tether/TRL s/step {ratio:.3f} vs baseline {baseline['ratio']:.3f} "
           f"({ratio / baseline['ratio'] - 1:+.0%}; limit {limit:.3f} = baseline +{tolerance:.0%}; "
           f"baseline measured {baseline.get('date', '?')} on {baseline.get('cpu', '?')}"
           f"{', ' + baseline['cpu_generation'] if baseline.get('cpu_generation') else ''})")
    return ratio <= limit, msg


def find_baseline(table: dict, cls: str, generation: str | None) -> tuple[dict | None, str]:
    """(the baseline to compare with, or None; a note): this CPU generation's entry ("<class> <generation>")
    if there is one, else the class's. A class entry recorded on another generation is not used: the
    ratio differs between generations of one class (native-bf16: 0.33 on an AMD EPYC of family 26,
    ~0.40 on one of family 25; docs/performance.md, "The regression guard")."""
    if generation and f"{cls} {generation}" in table:
        return table[f"{cls} {generation}"], ""
    base = table.get(cls)
    other = base and base.get("cpu_generation")
    if base and generation and other and other != generation:
        return None, f"the {cls} baseline ({base['ratio']:.3f}) is from another CPU generation ({other}, this one: {generation})"
    return base, ""


def run_comparison(runs: int, slowdown: float, out: str | None) -> dict:
    from vs_trl import main as vs_trl

    with tempfile.TemporaryDirectory(prefix="tether-bench-quick-") as tmp:
        argv = ["--sizes", "small", "--runs", str(runs), "--steps", "2", "--trl-precision", "fp32", "--no-match-precision",
                "--no-compiled-arm", "--no-curves", "--no-prefix", "--no-ablations", "--slow-factor", "0", "--no-account",
                "--out", out or str(Path(tmp) / "quick.json")]
        if slowdown:
            argv += ["--slowdown", str(slowdown)]
        return vs_trl(argv)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="counted runs per side")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--baseline", default=str(BASELINE))
    p.add_argument("--update", action="store_true", help="write this run's ratio as the baseline of this CPU class")
    p.add_argument("--slowdown", type=float, default=0.0,
                   help="seconds of sleep added to every tether update: a deliberately slowed build (shows the guard fail)")
    p.add_argument("--out", help="also keep the comparison's full result (vs_trl.py JSON) here")
    p.add_argument("--from-result", help="check a result kept with --out instead of running")
    a = p.parse_args(argv)
    res = json.loads(Path(a.from_result).read_text()) if a.from_result else run_comparison(a.runs, a.slowdown, a.out)
    m, small = res["machine"], res["sizes"]["small"]
    ratio = small["tether"]["s_per_step"] / small["trl_fp32"]["s_per_step"]
    path = Path(a.baseline)
    table = json.loads(path.read_text()) if path.is_file() else {}
    cls, gen = m["cpu_class"], m.get("cpu_generation")
    if a.update:
        key = f"{cls} {gen}" if gen else cls
        table[key] = {"ratio": round(ratio, 4), "tether_s_per_step": round(small["tether"]["s_per_step"], 3),
                      "trl_s_per_step": round(small["trl_fp32"]["s_per_step"], 3),
                      "tether_precision": small["arm_precision"]["tether"], "trl_precision": "fp32",
                      "cpu": m["cpu"], "cpu_generation": gen, "cpu_flags": m["cpu_flags"], "date": m["date"], "runs": res.get("settings", {}).get("runs", a.runs),
                      "load_avg": [m["load_avg_start"][0], m["load_avg_end"][0]], "command": " ".join(["python"] + sys.argv)}
        path.write_text(json.dumps(table, indent=2) + "\n")
        print(f"[bench-quick] baseline for {key} set to {ratio:.3f} in {path}")
        return 0
    base, note = find_baseline(table, cls, gen)
    ok, msg = check_ratio(ratio, base, a.tolerance, note)
    print(f"[bench-quick] {cls} CPU ({m['cpu']}{', ' + gen if gen else ''}), tether ({small['arm_precision']['tether']}) "
          f"{small['tether']['s_per_step']:.2f} s/step vs TRL (fp32) {small['trl_fp32']['s_per_step']:.2f}, "
          f"load {m['load_avg_start'][0]:.1f} -> {m['load_avg_end'][0]:.1f}, {res['wall_s']:.0f} s\n[bench-quick] {msg}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
