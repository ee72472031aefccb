#!/bin/bash
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
PY=/work/main/.venv/bin/python
OUT=/work/wt/notes/speed13
pipe() {
  cd $2; rm -rf /tmp/s13_$1_$3
  s=$(date +%s.%N)
  PYTHONPATH=$2/src $PY -m tether.cli pipeline configs/reverse.yaml --run-dir /tmp/s13_$1_$3 > $OUT/pipe_$1_$3.log 2>&1
  rc=$?; e=$(date +%s.%N)
  echo "pipeline $1 round$3 rc=$rc wall=$(echo "$e - $s" | bc) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $OUT/summary.txt
}
B=/work/wt/before; A=/work/main
pipe after $A 2; pipe before $B 2; pipe after $A 3; pipe before $B 3
