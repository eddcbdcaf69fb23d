#!/usr/bin/env bash
# The accelerator figures of the data path, ready to run unchanged on a GPU
# machine (jax with CUDA installed; from the repository root). Everything
# goes to benchmarks/results/gpu/: the update-speed sweep (its own JSON, CSV,
# plot and summary), sampling inside the call against host sampling, the
# learner wait fraction of the three data paths, and whole PBT runs.
#   bash benchmarks/gpu.sh            # about an hour on one GPU
set -euo pipefail
OUT=${OUT:-benchmarks/results/gpu}
PY=${PYTHON:-python}
mkdir -p "$OUT"
"$PY" -c 'import jax, sys; b = jax.default_backend(); print("backend", b, jax.devices()); sys.exit(b == "cpu")' \
  || { echo "no accelerator visible to jax: these are the GPU figures" >&2; exit 1; }
"$PY" -m benchmarks.update_speed --agents td3 sac --population-sizes 1 8 32 80 \
  --steps-per-call default --repeats 5 --shared-critic --out "$OUT"
"$PY" -m benchmarks.sampling_inside --members 1 8 32 80 --hidden 256 256 \
  --capacity 100000 | tee "$OUT/sampling_inside.txt"
"$PY" -m benchmarks.learner_wait --members 8 32 80 --hidden 256 256 \
  --seconds 120 --out "$OUT/learner_wait.json" | tee "$OUT/learner_wait.txt"
"$PY" -m benchmarks.end_to_end --members 4 16 80 --env-steps 20000 \
  --out "$OUT/end_to_end.json" | tee "$OUT/end_to_end.txt"
# The on-device data path: a Brax task stepped inside the learner call
# (needs pip install -e '.[brax]'), 256 to 1,024 members, small networks.
"$PY" -m benchmarks.data_paths --modes on-device --jax-env brax:hopper \
  --members 256 1024 --envs-per-member 4 --seconds 120 \
  --out "$OUT/data_paths.json" | tee "$OUT/data_paths.txt"
