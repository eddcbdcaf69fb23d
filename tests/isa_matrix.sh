#!/usr/bin/env bash
# The suite's float comparisons (tests marked `numeric`) once per CPU
# instruction set that XLA can be capped to, on this one machine: a
# tolerance that holds only for one vector width fails here, also on a
# machine without AVX-512 (tests/numerics.py says how each tolerance is
# derived; `python -m tests.isa_spread` measures how far results move).
#
#   tests/isa_matrix.sh [PYTEST ARGS ...]     default: -m numeric
#   ISAS="SSE4_2 AVX2" tests/isa_matrix.sh    fewer instruction sets
#
# Runs from a checkout with the test extra installed (the README's test
# command); PYTEST defaults to .venv/bin/pytest, else pytest on the PATH.
# Exits non-zero if any instruction set failed.
set -uo pipefail
cd "$(dirname "$0")/.."
isas=${ISAS:-SSE4_2 AVX AVX2 default}
pytest=${PYTEST:-$( [ -x .venv/bin/pytest ] && echo .venv/bin/pytest || echo pytest)}
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-m numeric)
failed=()
for isa in $isas; do
  flags=${XLA_FLAGS:-}
  [ "$isa" != default ] && flags="$flags --xla_cpu_max_isa=$isa"
  echo "== --xla_cpu_max_isa=$isa"
  if ! XLA_FLAGS="$flags" "$pytest" -q -n auto --maxprocesses 4 \
      --dist worksteal "${args[@]}"; then
    failed+=("$isa")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed under: ${failed[*]}" >&2
  exit 1
fi
echo "passed under every instruction set: $isas"
