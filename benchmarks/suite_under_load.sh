#!/usr/bin/env bash
# The README's test suite N times in a row (default 3) while two busy loops
# keep both cores of a 2-core machine busy: the check that no test depends
# on a sleep being long enough. Prints one line per run (exit status,
# seconds, pytest's last line); logs in $OUT (default /tmp/suite-under-load).
#   benchmarks/suite_under_load.sh [N]      # from the repository root
set -u
N=${1:-3}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-/tmp/suite-under-load}
mkdir -p "$OUT"
"$PY" -c "while True: pass" & B1=$!
"$PY" -c "while True: pass" & B2=$!
trap 'kill $B1 $B2 2>/dev/null' EXIT
status=0
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  "$PY" -m pytest -q -p no:cacheprovider > "$OUT/run$i.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $(tail -n 1 "$OUT/run$i.log")"
done
exit $status
