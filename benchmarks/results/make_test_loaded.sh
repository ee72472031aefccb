#!/bin/bash
# Issue 14: `make test` (via .ci/run) on a fresh clone of main while two other busy processes load the machine.
OUT=/work/wt/notes/loaded
rm -rf /work/fresh-load; git clone -q /work/main /work/fresh-load; cd /work/fresh-load
git log --oneline -1 > $OUT/commit.txt
( while true; do :; done ) & B1=$!
python3 -c "
import hashlib
x=b'x'*1000000
while True: hashlib.sha256(x).digest()" & B2=$!
echo "busy pids $B1 $B2" > $OUT/summary.txt
( while true; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/load.log; sleep 30; done ) & L=$!
s=$(date +%s)
bash .ci/run > $OUT/ci.log 2>&1; rc=$?
e=$(date +%s)
kill $B1 $B2 $L
echo "rc=$rc wall_s=$((e-s)) start=$(date -u -d @$s +%T) end=$(date -u -d @$e +%T)" >> $OUT/summary.txt
tail -5 $OUT/ci.log >> $OUT/summary.txt
