"""Our TD3 update against Stable-Baselines3's, from the same weights on the
same batches and noise (``benchmarks/sb3_td3_equivalence.py``). Needs the
``.[torch]`` extra; skipped without it (CI installs ``.[test]`` only)."""

import re
import subprocess
import sys

import pytest

pytest.importorskip('stable_baselines3')

pytestmark = pytest.mark.slow


def _run(*args):
  # A process of its own: the check turns on JAX's float64 mode, which
  # must not leak into other tests.
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.sb3_td3_equivalence', '--env',
       'Pendulum-v1', *args], capture_output=True, text=True, timeout=900)
  found = re.search(r'largest relative difference (\S+) \(', proc.stdout)
  assert found, proc.stdout + proc.stderr
  return proc.returncode, float(found.group(1))


def test_td3_update_equals_sb3_in_float64():
  # 60 steps: 30 delayed policy and target updates, target noise 0.2.
  rc, worst = _run('--steps', '60')
  assert rc == 0
  assert worst < 1e-10


def test_the_check_reports_float32_rounding_as_a_difference():
  # The same comparison in float32 differs at rounding level and above, so
  # a tolerance below that makes the check fail: it can fail.
  rc, worst = _run('--steps', '60', '--float32', '--tolerance', '1e-12')
  assert rc == 1
  assert 1e-12 < worst < 1e-1
