#!/bin/bash
# Issue 13 speed check: before (8987590, pre-seam) vs after (main) side by side, interleaved.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
PY=/work/main/.venv/bin/python
OUT=/work/wt/notes/speed13
pipe() {  # $1=label $2=tree $3=round
  cd $2; rm -rf /tmp/s13_$1_$3
  s=$(date +%s.%N)
  PYTHONPATH=$2/src $PY -m tether.cli pipeline configs/reverse.yaml --run-dir /tmp/s13_$1_$3 > $OUT/pipe_$1_$3.log 2>&1
  rc=$?; e=$(date +%s.%N)
  echo "pipeline $1 round$3 rc=$rc wall=$(echo "$e - $s" | bc) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $OUT/summary.txt
}
bench() {
  cd $2
  PYTHONPATH=$2/src $PY benchmarks/vs_trl.py --sizes small --runs 3 --trl-precision fp32 --no-compiled-arm --no-curves --no-prefix --no-ablations --out $OUT/bench_$1_$3.json > $OUT/bench_$1_$3.log 2>&1
  echo "bench $1 round$3 rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $OUT/summary.txt
}
echo "start $(date -u)" >> $OUT/summary.txt
B=/work/wt/before; A=/work/main
bench before $B 1; bench after $A 1
pipe before $B 1; pipe after $A 1
pipe after $A 2; pipe before $B 2
bench after $A 2; bench before $B 2
echo "end $(date -u)" >> $OUT/summary.txt
