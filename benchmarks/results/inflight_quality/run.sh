#!/bin/bash
# Issue 20: async quality with in-flight weight updates vs sync, on the reverse demo task, 3 seeds, from one SFT checkpoint.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
OUT=/work/wt/notes/final/inflight; mkdir -p $OUT
SFT=/work/wt/notes/final/sft_reverse_seed0
cd /work/main
for seed in 1 2; do
  for arm in sync async_inflight; do
    rd=/tmp/inflight/$arm-$seed; rm -rf $rd
    s=$(date +%s)
    if [ $arm = sync ]; then
      .venv/bin/python -m tether.cli train configs/reverse.yaml model.path=$SFT run.seed=$seed logging.progress=false --run-dir $rd > $OUT/$arm-$seed.log 2>&1
    else
      .venv/bin/python -m tether.cli train-async configs/reverse.yaml model.path=$SFT run.seed=$seed logging.progress=false dist.rollout_workers=2 dist.max_staleness=1 dist.correction=tis dist.inflight=true --run-dir $rd > $OUT/$arm-$seed.log 2>&1
    fi
    rc=$?; e=$(date +%s)
    echo "$arm seed=$seed rc=$rc wall=$((e-s)) $(python3 -c "import json;d=json.load(open('$rd/summary.json'));print('final', d.get('final_accuracy'), 'greedy', d.get('final_greedy_accuracy'), 'base', d.get('baseline_accuracy'))" 2>&1)" >> $OUT/summary.txt
  done
done
