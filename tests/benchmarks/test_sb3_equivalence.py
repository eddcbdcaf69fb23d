"""Our TD3, SAC and PPO updates against Stable-Baselines3's, from the same
weights on the same batches and noise (``benchmarks/sb3_equivalence/``).
Needs the ``.[torch]`` extra; skipped without it (CI installs ``.[test]``
only)."""

import re
import subprocess
import sys

import pytest

pytest.importorskip('stable_baselines3')

pytestmark = pytest.mark.slow


def _run(*args, env='Pendulum-v1'):
  # A process of its own: the check turns on JAX's float64 mode, which
  # must not leak into other tests.
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.sb3_equivalence', '--env', env,
       *args], capture_output=True, text=True, timeout=900)
  found = re.search(r'largest relative difference (\S+) \(', proc.stdout)
  assert found, proc.stdout + proc.stderr
  return proc.returncode, float(found.group(1))


@pytest.mark.parametrize('agent', ['td3', 'sac'])
def test_update_equals_sb3_in_float64(agent):
  # 60 steps (TD3: 30 of them with policy and target steps, target noise
  # 0.2; SAC: its temperature moves every step).
  rc, worst = _run('--agent', agent, '--steps', '60')
  assert rc == 0
  # float64 (tests/numerics.py, rule 2): rounding, 256 x 1.1e-16 = 3e-14 a
  # step, stays near 2e-12 in 60; a defect moves weights by ~lr = 3e-4.
  assert worst < 1e-10


@pytest.mark.parametrize('env', ['Pendulum-v1', 'CartPole-v1'])
def test_ppo_iteration_equals_sb3_in_float64(env):
  # Two iterations of 128 steps in 2 envs (Pendulum's 200-step time limit
  # truncates inside the second; CartPole terminates under a fresh policy),
  # 4 epochs of 8 minibatches each: 64 Adam steps with entropy weight 0.01.
  rc, worst = _run('--agent', 'ppo', env=env)
  assert rc == 0
  # float64 rounding stays near 1e-14 (rule 2 of tests/numerics.py); a
  # defect moves weights far more: treating truncations as terminations on
  # SB3's side alone gives 5e-4.
  assert worst < 1e-10


@pytest.mark.parametrize('env', ['Pendulum-v1', 'CartPole-v1'])
def test_ppo_with_vecnormalize_equals_sb3_in_float64(env):
  # The same two iterations with observation and reward normalisation on
  # both sides: SB3's VecNormalize.step_wait scales the rewards step by
  # step (Pendulum's time limit resets the returns inside the second
  # iteration), and the statistics and returns are compared too.
  rc, worst = _run('--agent', 'ppo', '--normalize-observations',
                   '--normalize-rewards', env=env)
  assert rc == 0
  # As above: float64 rounding near 1e-15; never resetting the returns at
  # episode ends gives 0.8 (measured), a defect in the scaling moves every
  # reward and so every weight.
  assert worst < 1e-10


def test_the_check_reports_float32_rounding_as_a_difference():
  # The same comparison in float32 differs at rounding level and above, so
  # a tolerance below that makes the check fail: it can fail.
  rc, worst = _run('--steps', '60', '--float32', '--tolerance', '1e-12')
  assert rc == 1
  # Above: float32 rounds at 6e-8 relative, far above 1e-12. Below: it grows
  # to a few percent only in 500 Hopper updates (the module's docstring).
  assert 1e-12 < worst < 1e-1
  # PPO's 64 float32 Adam steps likewise (about 1e-5 measured).
  rc, worst = _run('--agent', 'ppo', '--float32', '--tolerance', '1e-12')
  assert rc == 1
  assert 1e-12 < worst < 1e-1


def test_sac_check_sees_sb3s_log_prob_epsilon():
  # SB3's 1e-6 inside log(1 - tanh^2) is a real (small) difference: with
  # it the float64 comparison is no longer exact.
  rc, worst = _run('--agent', 'sac', '--steps', '5', '--sb3-epsilon', '1e-6',
                   '--tolerance', '1e-10')
  assert rc == 1
  # The 1e-6 shifts each log-probability by 1e-6 / (1 - tanh^2) >= 1e-6,
  # above the 1e-10 that float64 rounding stays under (the first test).
  assert worst > 1e-10


def test_a_discrete_task_is_refused_in_one_line():
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.sb3_equivalence', '--env',
       'CartPole-v1', '--steps', '2'], capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('--env CartPole-v1'), \
      proc.stderr
