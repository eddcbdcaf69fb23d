#!/usr/bin/env bash
# Learning rows on a GPU machine: each row of benchmarks/learning/ pinned
# to two cores (the actor layout of the 2-core machine that ran the CPU
# rows: one actor process for the 4 members), its learner on the GPU, as
# many rows at once as the machine has pairs of cores. Rows are taken in
# the order given; at the deadline the rows still running are stopped and
# only finished rows are kept (a row's JSON is written atomically at its
# end); the script lists each row as kept or left out, and exits 1 if any
# was left out. The result JSONs land under $RESULTS/runs/, as in
# benchmarks/results/learning/runs/; each names the GPU its learner ran on
# (its "device").
# A row records the commit it ran (git rev-parse there): the device tool
# sends no .git, so carry a shallow clone's, ignored here
# (git clone -q --depth 1 file://$PWD /tmp/s && mv /tmp/s/.git .devgit),
# and `cp -r .devgit .git` there first; the wheels: gpu_wheels.sh.
#   RESULTS=/tmp/rows DEADLINE_S=540 bash benchmarks/gpu_learning.sh \
#     HalfCheetah-v5:50000:pbt-pb2-td3:0 ...   # TASK:STEPS:METHOD:SEED
# A task may hold colons itself (gymnax:Acrobot-v1:1048576:pbt-ppo:0); the
# last three fields are read from the right. MEMBERS=16 runs every row at
# 16 members (default 4, the benchmark's).
set -uo pipefail
PY=${PYTHON:-python}
MEMBERS=${MEMBERS:-4}
RESULTS=${RESULTS:-benchmarks/results/learning}
DEADLINE_S=${DEADLINE_S:-540}
LOGS=${LOGS:-$RESULTS/logs}
mkdir -p "$RESULTS" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several learners share one GPU
cores=$(nproc)
slots=$(( cores / 2 ))
(( slots >= 1 )) || slots=1
start=$SECONDS
declare -A slot_pid=()
pin() {  # pin SLOT: the core pair of a slot, or nothing where taskset is missing
  if command -v taskset >/dev/null; then echo "taskset -c $(( 2 * $1 )),$(( 2 * $1 + 1 ))"; fi
}
split() {  # split ROW: sets task, steps, method, seed (read from the right)
  local rest=$1
  seed=${rest##*:}; rest=${rest%:*}
  method=${rest##*:}; rest=${rest%:*}
  steps=${rest##*:}; task=${rest%:*}
}
for row in "$@"; do
  split "$row"
  while :; do
    for (( s = 0; s < slots; s++ )); do
      pid=${slot_pid[$s]:-}
      if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then free=$s; break 2; fi
    done
    (( SECONDS - start < DEADLINE_S )) || break 2
    sleep 2
  done
  (( SECONDS - start < DEADLINE_S )) || break
  echo "$(( SECONDS - start ))s slot $free: $row"
  $(pin "$free") "$PY" -m benchmarks.learning --one "$task" "$method" "$seed" \
    --env-steps "$steps" --population-size "$MEMBERS" --out "$RESULTS" \
    >"$LOGS/$task-$steps-$method-$seed.log" 2>&1 &
  slot_pid[$free]=$!
done
while (( SECONDS - start < DEADLINE_S )); do
  running=0
  for pid in "${slot_pid[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
  (( running )) || break
  sleep 2
done
for pid in "${slot_pid[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null; done
sleep 5
echo "$(( SECONDS - start ))s done"
left_out=0
for row in "$@"; do  # where the benchmark writes the row's JSON
  split "$row"
  f=$("$PY" -c 'import sys; from benchmarks.learning import store as l; a = sys.argv
print(l.result_path(a[1], a[2], a[3], int(a[4]), int(a[5]), int(a[6])))' \
      "$RESULTS" "$task" "$method" "$seed" "$steps" "$MEMBERS")
  if [[ -f $f ]]; then echo "kept $f"; else echo "left out $row"; left_out=1; fi
done
exit "$left_out"  # 1: a row did not finish by the deadline, or failed (its log says)
