#!/usr/bin/env bash
# The wheels that a GPU machine without a package index needs to run
# fastpbrl's benchmarks, for its Python 3.12 (x86-64) whose image already
# holds jax with CUDA, optax, chex, orbax, scipy, pandas, matplotlib and
# tqdm: the rest of pyproject.toml's dependencies and what they need
# beyond that image, as the device tool's package list of that image
# names it (not yet tried on such a machine). Downloaded here into .whl/
# (dm-acme 0.2.4 ships no wheel: it is built from its sdist, pure
# Python). .whl/ is git-ignored; name it in the device tool's carry. On
# the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
DEST=${DEST:-.whl}
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64)
mkdir -p "$DEST"
python3 -m pip download -q --no-deps -d "$DEST" "${TARGET[@]}" \
  mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 websockets \
  glfw==2.11.0 pyopengl==3.1.10 gymnasium==1.4.0 farama-notifications==0.0.6 \
  dm-haiku==0.0.17 jmp==0.0.4 dm-env==1.6 dm-tree==0.1.10 tyro==1.0.17 \
  docstring-parser==0.18.0 typeguard==4.6.1 tensorboardX==2.6.5
sdist=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$sdist" dm-acme==0.2.4
python3 -m pip wheel -q --no-deps -w "$DEST" "$sdist"/dm-acme-0.2.4.tar.gz
rm -rf "$sdist"
ls "$DEST"
