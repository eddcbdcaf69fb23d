#!/usr/bin/env bash
# The virtual environment that python -m benchmarks.peers runs rejax in:
# rejax 0.1.3 (a pure-JAX RL library: its own PPO and TD3, whole training
# loops under jit(vmap(...))) with gymnax < 1, apart from fastpbrl's venv
# so neither's pins move the other's. It asks for the main venv's jax and
# jaxlib (read from $MAIN_PYTHON, default the repository's .venv) and, if pip
# cannot resolve rejax with those, takes what resolves: the benchmark
# records both sides' jax versions. The folder is git-ignored.
#
#   bash benchmarks/peers/setup_rejax.sh              # .venv-rejax
#   bash benchmarks/peers/setup_rejax.sh /tmp/rejax   # another folder
# (then python -m benchmarks.peers --rejax-python /tmp/rejax/bin/python)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${1:-$ROOT/.venv-rejax}
MAIN_PYTHON=${MAIN_PYTHON:-$ROOT/.venv/bin/python}
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
JAX=$("$MAIN_PYTHON" -c \
  'import importlib.metadata as m; print(m.version("jax"))' 2>/dev/null || true)
if [ -n "$JAX" ] && "$VENV/bin/python" -m pip install -q rejax==0.1.3 \
    'gymnax<1' "jax==$JAX" "jaxlib==$JAX"; then
  echo "rejax with the main venv's jax $JAX"
else
  echo "rejax with the main venv's jax ${JAX:-(none found)} did not" \
       "resolve; installing what resolves" >&2
  "$VENV/bin/python" -m pip install -q rejax==0.1.3 'gymnax<1'
fi
"$VENV/bin/python" -c '
import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("rejax", "gymnax", "jax",
                                                 "jaxlib", "flax", "optax")))'
