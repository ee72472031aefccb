#!/usr/bin/env bash
# The extended fault benchmark of issue 41, unattended, from a fresh clone after `make install`:
#
#   bash benchmarks/faultbench_extended.sh 16          # the number of worker processes (one thread each)
#   PY=python3 TETHER=tether OUT=/data/fb bash benchmarks/faultbench_extended.sh 14   # tether installed elsewhere
#
# Every fault kind of both halves of the fixed split (tether/health/faults/split.py: the tuned half and the
# held-out half, scored separately) at both severities over 3 seeds in advise mode, auto mode for the
# remediable kinds, 40 healthy seeds in advise and auto mode, the healthy seeds again with run.threads=2 and
# with a KL anchor (algo.kl.coef=0.1), and the healthy controls in each remediable fault's own base config.
# About 930 runs of 30 RL steps, ~11 CPU-seconds each (2-core Intel Xeon, 2026-12-05): ~11 minutes of 16 cores, ~1.5 hours on 2.
#
# PY: the Python that has tether installed (default: .venv/bin/python, else python3); TETHER: the tether
# command (default: .venv/bin/tether, else `tether` on PATH, else PY running tether's CLI). OUT: where the runs
# go (default: runs/faultbench_extended; a relative path is taken from the directory you run this from).
# Arguments after the worker count go to `tether faultbench` after the ones above (a later --seeds wins),
# e.g. a small trial: `bash benchmarks/faultbench_extended.sh 2 --fault mask_shift --seeds 0 --healthy-seeds 0`.
# Resumable: the runs finished so far are kept in $OUT/cases.jsonl; run the same command again to continue.
# Writes $OUT/results.json and faultbench_extended.json in benchmarks/results/ (the same plus provenance: commit,
# CPU, load average, wall and CPU seconds; RESULT=path writes it elsewhere); `make results` then turns that file into docs/results.md's
# "health-extended" section (tools/results_quality.py).
set -euo pipefail
WORKERS="${1:-2}"
case "$WORKERS" in ''|*[!0-9]*) echo "faultbench_extended.sh: the worker count must be a number, got '$WORKERS'" >&2; exit 2;; esac
OUT="${OUT:-}"
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT="$PWD/$OUT"; fi  # relative to where it was run from
RESULT="${RESULT:-}"
if [ -n "$RESULT" ] && [ "${RESULT#/}" = "$RESULT" ]; then RESULT="$PWD/$RESULT"; fi
export RESULT
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/faultbench_extended}"
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -n "${TETHER:-}" ]; then read -r -a TCMD <<< "$TETHER"
elif [ -x .venv/bin/tether ]; then TCMD=(.venv/bin/tether)
elif command -v tether >/dev/null 2>&1; then TCMD=(tether)
else TCMD=("$PY" -m tether.cli); fi
"$PY" -c "import tether" 2>/dev/null || {
    echo "faultbench_extended.sh: '$PY' cannot import tether; run 'make install' or set PY to a Python that has it" >&2; exit 2; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=0  # one thread per run: no spin-waiting between runs
LOAD_BEFORE="$(cat /proc/loadavg 2>/dev/null || echo unknown)"
START="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
REUSED="$( [ -f "$OUT/cases.jsonl" ] && wc -l < "$OUT/cases.jsonl" || echo 0)"
nice -n 10 "${TCMD[@]}" faultbench --out "$OUT" --seeds 0,1,2 --healthy-seeds 0-39 --workers "$WORKERS" \
    --steps 30 --start 13 --auto-remediable-only \
    --variant "threads2=run.threads=2" --variant "kl=algo.kl.coef=0.1" "${@:2}"
"$PY" - "$OUT" "$WORKERS" "$START" "$LOAD_BEFORE" "$REUSED" "${@:2}" <<'EOF'
import json, os, platform, subprocess, sys, time
from pathlib import Path

out, workers, start, load_before, reused = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
extra = sys.argv[6:]
res = json.loads((out / "results.json").read_text())
def git(*a):
    try:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on the machine: the commit is unknown
        return ""

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res["provenance"] = {
    "command": " ".join(["bash benchmarks/faultbench_extended.sh", str(workers), *extra]), "commit": git("rev-parse", "HEAD") or "unknown",
    "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if git("rev-parse", "HEAD") else None, "started": start, "out": str(out),
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
    "workers": workers, "runs_reused": reused, "loadavg_before": load_before,
    "loadavg_after": open("/proc/loadavg").read().strip(),
}
dest = Path(os.environ.get("RESULT") or "benchmarks/results/faultbench_extended.json")
dest.write_text(json.dumps(res, indent=2) + "\n")
print(f"wrote {dest}")
EOF
