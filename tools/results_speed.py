"""docs/results.md's speed sections: tether against TRL, the regression guard, the step's floor, and the
measured effect of each speed change.

Each `Entry` reads its files at generation time (tools/gen_results.py); numbers never go into the text.
The comparison table is rendered by benchmarks/vs_trl.py's own `table`, the one that prints it.
"""

from __future__ import annotations

import re
import statistics
import sys

from results_lib import ROOT, Entry, cpu_of, f2, f3, loadavg, mmss, table

sys.path.insert(0, str(ROOT / "benchmarks"))
import vs_trl  # noqa: E402  (stdlib only at import time)

R = "benchmarks/results/"


def _machine(m: dict) -> str:
    la = [m.get("load_avg_start", [None])[0], (m.get("load_avg_end") or [None])[0]]
    load = "/".join(f"{x:.1f}" for x in la if x is not None)
    return f"{cpu_of(m)}, {m['cores']} cores, {m['date']}, 1-minute load {load} at the start/end"


def _ratios(r: dict) -> str:
    sp = r["same_precision"]
    return ", ".join(f"{p} {f2(x['s_per_step_ratio'])}" for p, x in sp.items())


def read_vs_trl(d):
    v, late, late32 = d["v"], d["latest"], d["floor32"]
    s, lg = v["sizes"]["small"], v["sizes"]["large"]
    ls, ll = late["sizes"]["small"], late["sizes"]["large"]
    learn = v["learning"]["summary"]
    fl = d["floor"]["sizes"]
    return {
        "table": vs_trl.table(v), "machine": _machine(v["machine"]), "runs": v["settings"]["runs"],
        "minutes": f"{v['wall_s'] / 60:.0f}",
        "best_s": f2(s["s_per_step_ratio_best"]), "best_l": f2(lg["s_per_step_ratio_best"]),
        "def_s": f2(s["s_per_step_ratio"]), "def_l": f2(lg["s_per_step_ratio"]),
        "rss_s": f2(s["peak_rss_ratio"]), "rss_l": f2(lg["peak_rss_ratio"]),
        "late_machine": _machine(late["machine"]), "late_best_s": f2(ls["s_per_step_ratio_best"]),
        "late_best_l": f2(ll["s_per_step_ratio_best"]), "late_same_s": _ratios(ls), "late_same_l": _ratios(ll),
        "late_fp32_l5": f2(d["large32"]["sizes"]["large"]["same_precision"]["fp32"]["s_per_step_ratio"]),
        "auto": f2(d["auto"]["sizes"]["large"]["s_per_step_ratio"]),
        "tl": f"{learn['tether']['last_window_mean']:.3f} ± {learn['tether']['sd']:.3f}",
        "rl": f"{learn['trl']['last_window_mean']:.3f} ± {learn['trl']['sd']:.3f}",
        "lsteps": v["learning"]["steps"], "lseeds": len(v["learning"]["seeds"]),
        "floor_bf16": " / ".join(f2(fl[k]["gemm_attention_floor_over_trl"]) for k in ("small", "large")),
        "floor_fp32": " / ".join(f2(late32["sizes"][k]["gemm_attention_floor_over_trl"]) for k in ("small", "large")),
        "tether_bf16": " / ".join(f2(fl[k]["tether_over_trl"]) for k in ("small", "large")),
        "tether_fp32": " / ".join(f2(late32["sizes"][k]["tether_over_trl"]) for k in ("small", "large")),
        "targets": _targets([v, late]),
    }


def _targets(runs: list[dict]) -> str:
    """The performance issue's two targets, judged on every run given: best/best <= 0.33, same precision <= 0.5."""
    best = [r["s_per_step_ratio_best"] for v in runs for r in v["sizes"].values()]
    same = {p: [r["same_precision"][p]["s_per_step_ratio"] for v in runs for r in v["sizes"].values() if p in r["same_precision"]]
            for p in ("bf16", "fp32")}
    verdict = lambda xs, t: "met" if xs and max(xs) <= t else ("met in part" if xs and min(xs) <= t else "not met")  # noqa: E731
    return (f"tether-best / TRL-best ≤ 0.33 is **{verdict(best, 0.33)}** (these runs: {min(best):.2f}-{max(best):.2f}); "
            f"≤ 0.5 at the same precision is **{verdict(same['bf16'], 0.5)}** in bf16 "
            f"({min(same['bf16']):.2f}-{max(same['bf16']):.2f}) and **{verdict(same['fp32'], 0.5)}** in fp32 "
            f"({min(same['fp32']):.2f}-{max(same['fp32']):.2f})")


VS_TRL = Entry(
    key="vs-trl", title="tether against TRL's GRPOTrainer (`make bench`)",
    sources={"v": R + "vs_trl.json", "latest": R + "vs_trl_2026-12-04.json", "large32": R + "vs_trl_large_fp32_2026-12-04.json",
             "auto": R + "vs_trl_large_auto_2026-12-02.json", "floor": R + "step_floor_family25_2026-12-03_late.json",
             "floor32": R + "step_floor_fp32_family25_2026-12-03_late.json"},
    command="make bench (= python benchmarks/vs_trl.py); the rerun: python benchmarks/vs_trl.py --no-curves --no-ablations "
            "--no-prefix; the floor: python benchmarks/step_floor.py [--precision fp32]",
    read=read_vs_trl,
    headline="an RL step in {late_best_s}× (small model) and {late_best_l}× (large) the time of TRL's GRPOTrainer, "
             "each at its fastest setting on the same CPU",
    text="""
The same locally built Llama, prompts (the reverse task), reward and sampling; 8 prompts × 8
completions × up to 64 tokens; one update per batch; the frameworks alternate in fresh processes,
{runs} counted runs each, medians. TRL runs in fp32 and in bf16 and TRL-best is its faster arm; every
row names its precision. "compiled" is `train.compile=true rollout.compile=true`.

**The full run** ({machine}; {minutes} min):

{table}

- tether at its best against TRL at its best: **{best_s} (small) and {best_l} (large)**; with tether's
  defaults {def_s} / {def_l}; peak RSS {rss_s} / {rss_l} of TRL's. With `train.compile` / `rollout.compile`
  on `auto` (since this run), the large model compiled by default ran at {auto} of TRL bf16's time
  (`vs_trl_large_auto_2026-12-02.json`).
- **The rerun on the current code** ({late_machine}): tether-best / TRL-best **{late_best_s} / {late_best_l}**;
  same precision: small {late_same_s}, large {late_same_l} (the large fp32 arm over 5 runs:
  {late_fp32_l5}, `vs_trl_large_fp32_2026-12-04.json`). Two machines of one class differ by about a
  quarter in this ratio, so the runs are not a before/after of the code; docs/performance.md has the
  in-process A/Bs.
- The performance issue's targets, over the two full runs above: {targets}. The floor measured on
  the family-25 machine, matmuls plus attention alone, is {floor_bf16} (small / large) of TRL's step in
  bf16 and {floor_fp32} in fp32, against tether's {tether_bf16} and {tether_fp32} there: what no
  implementation on these kernels could beat.
- Learning is not traded for speed: reward over the last 10 of {lsteps} steps from the same SFT start,
  {lseeds} seeds, tether {tl} vs TRL {rl} (sd over seeds), within noise.
""",
)


def read_avx2(d):
    v = d["v"]
    rows = []
    for size, r in v["sizes"].items():
        for name in ("tether", "trl_fp32", "tether_compiled"):
            x = r[name]
            rows.append([f"{size} ({r['params'] / 1e6:.1f}M)", vs_trl._label(name, r["arm_precision"][name], x),
                         f2(x["s_per_step"]), f"{x['gen_over_decode_floor']:.1f}x{vs_trl.kv_floor(x)}"])
        rows.append([size, "**tether, defaults / TRL-best**", f"**{f2(r['s_per_step_ratio'])}**", ""])
    return {"table": table(["size", "framework (precision)", "s/step", "gen time / decode floor (with KV reads)"], rows),
            "machine": _machine(v["machine"]), "runs": v["settings"]["runs"],
            "rss": " / ".join(f2(r["peak_rss_ratio"]) for r in v["sizes"].values()),
            "sim": " / ".join(f2(r["s_per_step_ratio"]) for r in d["sim"]["sizes"].values())}


VS_TRL_AVX2 = Entry(
    key="vs-trl-avx2", title="The same comparison on a CPU without native bf16",
    sources={"v": R + "vs_trl_avx2_2026-12-02.json", "sim": R + "vs_trl_avx2_simulated.json"},
    command="python benchmarks/vs_trl.py --sizes small,large --runs 3 --trl-precision fp32 --no-curves --no-ablations --no-prefix",
    read=read_avx2,
    text="""
A real AVX2-only EPYC ({machine}), {runs} runs per arm; tether's `auto` precision is fp32 there and
TRL runs in fp32 (its bf16 would be emulated). Another engineer's single-threaded runs used the
second core throughout.

{table}

tether with its defaults is faster than TRL at TRL's best setting on both sizes, not 3x; peak RSS
{rss} of TRL's. The earlier simulation (a native-bf16 CPU with its kernels capped at AVX2) read {sim}.
""",
)


HISTORY = ["vs_trl_2026-11-30.json", "vs_trl_2026-12-02_am.json", "vs_trl.json", "vs_trl_2026-12-03.json",
           "vs_trl_2026-12-04.json", "seam_speed/vs_trl_small_after.json", "vs_trl_avx2_small_before_shared_prefill.json",
           "vs_trl_avx2_2026-12-02.json"]  # every full or small-model comparison kept; add a new run's file here


def read_history(d):
    rows = []
    for name in HISTORY:
        v = d[name]
        m, cells = v["machine"], []
        for size in ("small", "large"):
            r = v["sizes"].get(size)
            best = "—" if not r or r.get("s_per_step_ratio_best") is None else f2(r["s_per_step_ratio_best"])
            dflt = "—" if not r else f2(r["s_per_step_ratio"])
            cells.append(f"{best} / {dflt}")
        each = v["sizes"]["small"]["tether"].get("s_per_step_each_run") or []
        spread = f"{min(each):.2f}-{max(each):.2f}" if each else "—"
        rows.append([f"`{name}`", m.get("date", "—"), cpu_of(m) if m.get("cpu_class") else m.get("cpu", "—"),
                     loadavg((m.get("load_avg_start") or [])[:1]), v["settings"]["runs"], *cells, spread])
    return {"table": table(["file", "date", "CPU", "load at start", "runs", "small: best / defaults",
                            "large: best / defaults", "tether defaults, small: s/step over runs"], rows)}


HISTORY_ENTRY = Entry(
    key="vs-trl-runs", title="Every committed run of the comparison",
    sources={name: R + name for name in HISTORY},
    command="python benchmarks/vs_trl.py (each file's settings.command has its exact flags)",
    read=read_history,
    text="""
tether's step time over TRL's: "best" is tether at its fastest arm over TRL at its faster precision
("—" where the run had no such arms), "defaults" is tether's defaults over TRL-best. The runs differ
in code, in machine (two generations of one CPU class differ by about a quarter in this ratio) and in
load, so a difference between rows is not the code's alone; the spread of tether's small-model step
over one run's repetitions shows how noisy its machine was. The code's own effects are the paired
A/Bs under "What each speed change measured".

{table}
""",
)


def read_guard(d):
    rows = [[cls, f2(b["ratio"]), f"{b['tether_s_per_step']:.2f} ({b['tether_precision']})",
             f"{b['trl_s_per_step']:.2f} ({b['trl_precision']})", b["runs"], b["date"], loadavg(b.get("load_avg"))]
            for cls, b in d["b"].items()]
    return {"table": table(["CPU class (generation)", "tether / TRL", "tether s/step", "TRL s/step", "runs", "date",
                            "load avg (start/end)"], rows)}


GUARD = Entry(
    key="bench-quick", title="The regression guard (`make bench-quick`)",
    sources={"b": R + "baseline_quick.json"},
    command="make bench-quick (refresh a baseline: make bench-quick BENCH_QUICK_ARGS=--update)",
    read=read_guard,
    text="""
The small model's tether/TRL step-time ratio in one sitting, against the committed baseline for
this CPU class and generation; `make bench-quick` exits 1 when the ratio is more than 15% worse.
Two generations of one class differ by about a quarter in this ratio, hence one baseline each:

{table}
""",
)


def read_changes(d):
    z32, z16 = d["zero32"]["fractions"], d["zero16"]["fractions"]
    frac = [k for k in z32 if not k.startswith("0/")]
    g = d["gemm"]["steps"]
    pre = d["v"]["prefix_sharing"]
    rows = [
        ["fp32 linear layers through oneDNN", "step time, fp32: small " + f2(g["small fp32"]["onednn_over_torch_time"]["step_s"])
         + ", large " + f2(g["large fp32"]["onednn_over_torch_time"]["step_s"]) + "; bf16 compiled: small "
         + f2(g["small bf16"]["onednn_over_torch_time"]["step_s"]) + ", large " + f2(g["large bf16"]["onednn_over_torch_time"]["step_s"]),
         "`cpu_gemm.json`", "python benchmarks/cpu_gemm.py --pairs 4"],
        ["zero-advantage sequences forward only", "update time with " + ", ".join(frac) + " groups at zero advantage: fp32 "
         + " / ".join(f2(z32[k]["b_over_a"]["update_s"]) for k in frac) + "; bf16 compiled "
         + " / ".join(f2(z16[k]["b_over_a"]["update_s"]) for k in frac),
         "`zero_adv_skip_small_*.json`", "python benchmarks/archive/zero_adv_skip.py [--precision bf16 --compiled]"],
        ["the LM head on loss positions only (demo batch)", f"update time: vocabulary {d['head']['vocab']} "
         f"{f2(d['head']['after_over_before'])}, padded to {d['head32k']['vocab']} {f2(d['head32k']['after_over_before'])}",
         "`head_demo.json`, `head_vocab32000.json`", "python benchmarks/archive/demo_update_ab.py --change head [--vocab 32000]"],
        ["fp32 attention through SDPA (demo batch)", f"update time {f2(d['sdpa']['after_over_before'])}", "`fp32_sdpa_demo.json`",
         "python benchmarks/archive/demo_update_ab.py --change fp32_sdpa"],
        ["keys/values carried across turns (demo RL step)", f"sampling {f2(d['turn']['b_over_a']['generate_s'])}, "
         f"step {f2(d['turn']['b_over_a']['step_s'])}", "`turn_kv_demo.json`", "python benchmarks/archive/turn_kv.py"],
        ["prefix sharing, forward+backward", f"{pre['speedup']:.1f}x faster ({pre['shared_s']:.3f} vs {pre['unshared_s']:.3f} s; "
         + pre["description"] + ")", "`vs_trl.json`", "python benchmarks/bench_prefix.py"],
    ]
    return {"table": table(["change", "measured (new time / old time)", f"file (under `{R}`)", "command"], rows)}


CHANGES = Entry(
    key="speed-changes", title="What each speed change measured",
    sources={"gemm": R + "cpu_gemm.json", "zero32": R + "zero_adv_skip_small_fp32.json",
             "zero16": R + "zero_adv_skip_small_bf16_compiled.json", "head": R + "head_demo.json",
             "head32k": R + "head_vocab32000.json", "sdpa": R + "fp32_sdpa_demo.json", "turn": R + "turn_kv_demo.json",
             "v": R + "vs_trl.json"},
    command="see each row",
    read=read_changes,
    text="""
Paired A/Bs in one process (one torch thread, family-25 native-bf16 EPYC unless the file says
otherwise; about ±5-10% noise), each a change that is on by default now. docs/performance.md explains
each change and what was tried and did not help.

{table}
""",
)


def read_dist(d):
    t = d["t"]
    rows = [[k, f"{v:.2f}x"] for k, v in t["ratios"].items()]
    return {"table": table(["ratio of trained samples/s", "value"], rows), "steps": t["steps"],
            "la": loadavg(t["machine"]["loadavg_before"])}


DIST = Entry(
    key="async", title="Asynchronous RL on Ray: throughput on 2 cores (docs/distributed.md)",
    sources={"t": R + "dist_throughput.json"},
    command="python benchmarks/dist_throughput.py",
    read=read_dist,
    text="""
Medians from one sitting, {steps} steps per configuration, on a 2-core machine at load {la}
(1/5/15 min) from other jobs. The trainer and every rollout worker share the two cores, so these
ratios say that the recipe runs and overlaps, not what a GPU cluster gains.

{table}
""",
)


def read_harness_modes(d):
    m = d["m"]
    per, pers = m["modes"]["process_per_episode"], m["modes"]["persistent"]
    rows = [[name, row["episodes"], f"{row['wall_seconds']:.0f}", f"**{row['episodes_per_s']:.2f}**",
             f"{row['cpu_seconds_tether']:.0f} / {row['cpu_seconds_agents']:.0f}", row["failed"]]
            for name, row in (("a process per episode", per), ("persistent (`harness.persistent=true`)", pers))]
    head = ["agent mode", "episodes", "wall s", "episodes/s", "CPU s: tether / agents", "failed"]
    ratio = m["persistent_over_process_per_episode"]
    return {"table": table(head, rows), "ratio": f"{ratio:.1f}", "rounds": m["rounds"],
            "meets": "at least" if ratio >= 3 else "short of", "problems": m["problems_per_round"],
            "n": m["samples_per_problem"], "conc": m["concurrency"], "la0": loadavg(m["load_average_at_start"]),
            "la1": loadavg(m["load_average_at_end"]), "date": m["date_utc"][:10], "cpu": m["cpu"], "cpus": m["cpus"]}


HARNESS_MODES = Entry(
    key="harness-modes", title="Agent harness: persistent agent processes against a process per episode",
    sources={"m": R + "harness_modes.json"},
    command="python benchmarks/harness_modes.py",
    read=read_harness_modes,
    text="""
The same agent program (configs/agents/chat_agent.py, the `openai` client's chat API), task
(configs/reverse.yaml's problems and its tiny model) and machine, side by side: {rounds} rounds of
one RL step's rollouts ({problems} problems × {n} episodes, {conc} agents at once), the two modes
alternating round by round so that the machine's load falls on both. A process per episode pays an
interpreter start and the `openai` import per episode; a persistent process pays them once (its
first round included here).

{table}

Persistent agents ran **{ratio}×** the episodes per second ({meets} the 3× target).
{date}, {cpu} with {cpus} cores, load average {la0} at the start and {la1} at the end (1/5/15 min).
""",
)


def read_make_test(d):
    t = d["t"]
    m = re.search(r"(\d+) passed, (\d+) skipped .* in ([\d.]+) s of pytest .*?; (\d+ min \d+ s) including", t["result"])
    if not m:
        raise ValueError("the result line's format changed")
    la = t["load_avg_1min"]
    return {"passed": m.group(1), "skipped": m.group(2), "pytest": f"{float(m.group(3)) / 60:.1f}", "all": m.group(4),
            "la_mean": f"{la['mean']:.1f}", "la_max": f"{la['max']:.0f}", "machine": t["machine"], "date": t["date"]}


MAKE_TEST = Entry(
    key="make-test", title="`make test` on a loaded machine",
    sources={"t": "docs/results/make_test_loaded_2026-12-01.json"},
    command="git clone <repo> fresh && cd fresh && bash .ci/run (with two busy loops running; benchmarks/results/make_test_loaded.sh)",
    read=read_make_test,
    text="""
A fresh clone's `bash .ci/run` ({machine}, {date}) with two busy processes running throughout (1-minute load
mean {la_mean}, max {la_max}): {passed} passed, {skipped} skipped in {pytest} min of pytest, {all} with the
install. The suite has grown since; an idle machine's timing is not committed (see the last section).
""",
)

def read_refactor(d):
    r = d["r"]
    bq, demo = r["bench_quick"], r["demo"]
    s1, s2, every = bq["sitting_1_order_before_after_before_after"], bq["sitting_2_order_after_before_before_after_after_before"], bq["all_runs"]
    loads = [float(x["loadavg_start"].split()[0]) for x in bq["runs"]] + [float(x["loadavg_end"].split()[0]) for x in bq["runs"]]
    sitting = lambda s: (f"before {f3(s['before']['ratio_mean'])}, after {f3(s['after']['ratio_mean'])} "  # noqa: E731
                         f"(after/before {f2(s['after_over_before']['ratio_mean'])}; {s['before']['n']} + {s['after']['n']} runs)")
    b, a = demo["before"], demo["after"]
    held = lambda x: (f"pass@1 {f3(x['held_out']['baseline_accuracy'])} → {f3(x['held_out']['final_accuracy'])}, "  # noqa: E731
                      f"greedy {f2(x['held_out']['baseline_greedy_accuracy'])} → {f2(x['held_out']['final_greedy_accuracy'])}")
    rows = [[x["order"], x["tree"], x["commit"], f3(x["ratio_tether_over_trl"]), f2(x["tether_s_per_step"]), f2(x["trl_s_per_step"]),
             f"{x['process_tree']['cpu_s']:.0f}", x["loadavg_start"].split()[0] + " → " + x["loadavg_end"].split()[0]] for x in bq["runs"]]
    same = not demo["rl_metrics_differences_non_timing"] and not demo["sft_metrics_differences_non_timing"]
    return {"before": r["commits"]["before"][:7], "after": r["commits"]["after"][:7], "cpu": cpu_of(r["machine"]),
            "lmin": f"{min(loads):.0f}", "lmax": f"{max(loads):.0f}", "s1": sitting(s1), "s2": sitting(s2),
            "all_b": f3(every["before"]["ratio_median"]), "all_a": f3(every["after"]["ratio_median"]),
            "all_r": f2(every["after_over_before"]["ratio_median"]),
            "tet_r": f2(every["after_over_before"]["tether_s_per_step_median"]),
            "cpu_r": f2(every["after_over_before"]["process_tree_cpu_s_mean"]),
            "same_work": "the same" if bq["same_work"] else "NOT the same",
            "table": table(["#", "tree", "commit", "tether / TRL", "tether s/step", "TRL s/step", "CPU s (whole run)", "1-min load"], rows),
            "held_b": held(b), "held_a": held(a), "identical": "identical" if demo["held_out_identical"] else "**different**",
            "curves": "every non-timing metric of every SFT and RL step is equal too" if same else
                      "but some per-step metrics differ (the file lists them)",
            "wall_b": mmss(b["wall_seconds"]), "wall_a": mmss(a["wall_seconds"]),
            "cpu_b": f"{b['cpu_seconds']:.0f}", "cpu_a": f"{a['cpu_seconds']:.0f}",
            "arm_t": f2(r["arm_cpu_check"]["after_over_before_cpu_s"]["tether"]),
            "arm_r": f2(r["arm_cpu_check"]["after_over_before_cpu_s"]["trl"]),
            "trl_b": f2(statistics.median(x["trl_s_per_step"] for x in bq["runs"] if x["tree"] == "before")),
            "trl_a": f2(statistics.median(x["trl_s_per_step"] for x in bq["runs"] if x["tree"] == "after")),
            "tet_b": f2(every["before"]["tether_s_per_step_median"]), "tet_a": f2(every["after"]["tether_s_per_step_median"]),
            **_quiet(r["bench_quick_quiet"])}


def _quiet(q):
    """The quiet-machine rerun of bench-quick (both trees alternating at load ~1)."""
    m = q["medians"]
    loads = [float(x["loadavg_start"].split()[0]) for x in q["runs"]] + [float(x["loadavg_end"].split()[0]) for x in q["runs"]]
    rows = [[x["order"], x["tree"], x["commit"], f3(x["ratio_tether_over_trl"]), f2(x["tether_s_per_step"]), f2(x["trl_s_per_step"]),
             f"{x['process_tree']['cpu_s']:.0f}", x["loadavg_start"].split()[0] + " → " + x["loadavg_end"].split()[0]] for x in q["runs"]]
    return {"q_n": sum(x["tree"] == "before" for x in q["runs"]), "q_after": q["runs"][-1]["commit"] if q["runs"][-1]["tree"] == "after"
            else next(x["commit"] for x in q["runs"] if x["tree"] == "after"),
            "q_lmax": f"{max(loads):.1f}", "q_b": f3(m["ratio_tether_over_trl"]["before"]), "q_a": f3(m["ratio_tether_over_trl"]["after"]),
            "q_r": f2(m["ratio_tether_over_trl"]["after_over_before"]), "q_tb": f2(m["tether_s_per_step"]["before"]),
            "q_ta": f2(m["tether_s_per_step"]["after"]), "q_tr": f2(m["tether_s_per_step"]["after_over_before"]),
            "q_table": table(["#", "tree", "commit", "tether / TRL", "tether s/step", "TRL s/step", "CPU s (whole run)", "1-min load"], rows)}


REFACTOR = Entry(
    key="refactor-unchanged", title="Behaviour and speed across the module moves (issue 38)",
    sources={"r": R + "refactor_unchanged.json"},
    command="make bench-quick and tether demo run.threads=1 in worktrees of both commits, alternating, under nice -n 10 "
            "(each run's exact command is in the file)",
    read=read_refactor,
    text="""
main before the round that moved the engine into `train/`, the rollout engines into `rollout/`, the
config into sections and the CLI helpers into one module ({before}) against main after it ({after}):
one virtualenv, the same CPU ({cpu}), a machine shared with other work (1-minute load {lmin}-{lmax}).

- The demo with `run.threads=1` pinned (`auto` picks 1 or 2 threads from the load, and the count
  changes the arithmetic): before {held_b}; after {held_a}: {identical}, and {curves}. Wall
  {wall_b} / {wall_a}, CPU {cpu_b} / {cpu_a} s (before / after; the wall times move with the load).
- `make bench-quick`, the tether/TRL s/step ratio, means per sitting: order before, after, before,
  after: {s1}; a second sitting in the order after, before, before, after, after, before: {s2}. All
  runs, medians: before {all_b}, after {all_a} ({all_r}): **outside the 5% the issue asks for**. Every
  run did {same_work} work (token and position counts). The ratio moved with TRL's arm, not tether's:
  tether's s/step {tet_b} → {tet_a} s ({tet_r}), TRL's {trl_b} → {trl_a} s. The CPU seconds did not
  move: the whole benchmark {cpu_r}, each arm run alone from each tree {arm_t} (tether) and {arm_r} (TRL),
  so TRL's worker waited less for a core when started from the newer tree, for a reason this
  measurement did not find. On a machine this loaded one run's tether step spread by half.
- The quiet rerun that settles it: `make bench-quick` in both trees, {q_n} runs each, alternating, on
  the same CPU at 1-minute load ≤ {q_lmax}, "after" being main at the end of the round ({q_after}):
  ratio medians before {q_b}, after {q_a} (**{q_r}**); tether s/step {q_tb} → {q_ta} ({q_tr}). Within 5%:
  the loaded sittings' difference did not reproduce.

The loaded sittings:

{table}

The quiet rerun:

{q_table}
""",
)


ENTRIES = [VS_TRL, VS_TRL_AVX2, HISTORY_ENTRY, GUARD, REFACTOR, CHANGES, DIST, HARNESS_MODES, MAKE_TEST]
