#!/usr/bin/env bash
# The extended fault benchmark of issue 41, unattended, from a fresh clone after `make install`:
#
#   bash benchmarks/faultbench_extended.sh 16          # the number of worker processes (one thread each)
#
# Every fault kind of both halves of the fixed split (tether/health/faults/split.py: the tuned half and the
# held-out half, scored separately) at both severities over 3 seeds in advise mode, auto mode for the
# remediable kinds, 20 healthy seeds in advise and auto mode, the healthy seeds again with run.threads=2 and
# with a KL anchor (algo.kl.coef=0.1), and the healthy controls in each remediable fault's own base config.
# About 420 runs of 30 RL steps, ~15 CPU-seconds each: ~7 minutes of 16 cores, ~1 hour on 2.
#
# Resumable: the runs finished so far are kept in $OUT/cases.jsonl; run the same command again to continue.
# Writes $OUT/results.json and benchmarks/results/faultbench_extended.json (the same plus provenance: commit,
# CPU, load average, wall and CPU seconds). OUT defaults to runs/faultbench_extended.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS="${1:-2}"
OUT="${OUT:-runs/faultbench_extended}"
PY=.venv/bin/python
[ -x "$PY" ] || { echo "faultbench_extended.sh: no .venv here; run 'make install' first" >&2; exit 2; }
case "$WORKERS" in ''|*[!0-9]*) echo "faultbench_extended.sh: the worker count must be a number, got '$WORKERS'" >&2; exit 2;; esac
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=0  # one thread per run: no spin-waiting between runs
LOAD_BEFORE="$(cat /proc/loadavg 2>/dev/null || echo unknown)"
START="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
nice -n 10 .venv/bin/tether faultbench --out "$OUT" --seeds 0,1,2 --healthy-seeds 0-19 --workers "$WORKERS" \
    --steps 30 --start 13 --auto-remediable-only \
    --variant "threads2=run.threads=2" --variant "kl=algo.kl.coef=0.1"
"$PY" - "$OUT" "$WORKERS" "$START" "$LOAD_BEFORE" <<'EOF'
import json, os, platform, subprocess, sys, time
from pathlib import Path

out, workers, start, load_before = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
res = json.loads((out / "results.json").read_text())
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res["provenance"] = {
    "command": f"bash benchmarks/faultbench_extended.sh {workers}", "commit": git("rev-parse", "HEAD"),
    "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "started": start,
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
    "workers": workers, "loadavg_before": load_before, "loadavg_after": open("/proc/loadavg").read().strip(),
}
dest = Path("benchmarks/results/faultbench_extended.json")
dest.write_text(json.dumps(res, indent=2) + "\n")
print(f"wrote {dest}")
EOF
