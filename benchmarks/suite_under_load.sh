#!/usr/bin/env bash
# The README's test suite N times in a row (default 3) while two busy loops
# keep both cores of a 2-core machine busy: the check that no test depends
# on a sleep being long enough. Prints one line per run (exit status,
# seconds, pytest's last line); logs in $OUT (default /tmp/suite-under-load).
# pytest runs as the README's test command does (PYTEST_ARGS, default
# "-n auto --maxprocesses 4 --dist worksteal": one pytest-xdist worker
# per core, an idle worker taking queued tests from a busy one).
#   benchmarks/suite_under_load.sh [N]      # from the repository root
set -u
N=${1:-3}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-/tmp/suite-under-load}
PYTEST_ARGS=${PYTEST_ARGS:--n auto --maxprocesses 4 --dist worksteal}
mkdir -p "$OUT"
"$PY" -c "while True: pass" & B1=$!
"$PY" -c "while True: pass" & B2=$!
trap 'kill $B1 $B2 2>/dev/null' EXIT
status=0
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
  "$PY" -m pytest -q -p no:cacheprovider $PYTEST_ARGS > "$OUT/run$i.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $(tail -n 1 "$OUT/run$i.log")"
done
exit $status
