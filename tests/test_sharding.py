"""The population sharded over 4 host CPU devices (``fastpbrl.devices.sharding``).

jax reads ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` once, when
it is imported, and this pytest process imported it long ago: every check
runs in a subprocess (``tests/sharding_worker.py``, or ``fastpbrl pbt``)
given that flag, and is judged by its exit status and output.
"""

import os
import re
import subprocess
import sys
import types

import pytest

from fastpbrl.config.checks import validate
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.devices import sharding

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Added to the session's XLA_FLAGS (tests/conftest.py sets some).
FOUR_DEVICES = {**os.environ, 'XLA_FLAGS':
                os.environ.get('XLA_FLAGS', '') +
                ' --xla_force_host_platform_device_count=4',
                'JAX_PLATFORMS': 'cpu',
                'PYTHONPATH': os.pathsep.join(
                    [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p])}


def four_devices(args, timeout=600):
  proc = subprocess.run([sys.executable, *args], cwd=REPO, env=FOUR_DEVICES,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  return proc.stdout + proc.stderr


def worker(check):
  out = four_devices(['-m', 'tests.sharding_worker', check])
  assert f'OK {check}' in out, out
  return out


@pytest.mark.slow
def test_sharded_population_learner_equals_unsharded_and_compiles_once():
  """TD3, N=8 over 4 devices: init, update (3 calls with new hparams
  values, one compilation, no all-gather in the program), policy_params
  and reinit_members equal the unsharded learner's, and stay sharded."""
  worker('population_learner')


@pytest.mark.slow
def test_device_replay_on_the_mesh_stays_split_with_its_members():
  """A per-member device replay on 4 devices: rings sharded with their
  members through flushes and a copy across devices, and sampling inside
  the sharded call gives the one-device result."""
  worker('device_replay')


@pytest.mark.slow
def test_sharded_shared_critic_learner_equals_unsharded():
  """The shared critic of TD3, CEM-RL and DvD: the same values as on one
  device, policies sharded, critic replicated, an all-reduce for the mean
  over members."""
  worker('shared_critic_learner')


@pytest.mark.slow
def test_pbt_cem_dvd_on_sharded_state():
  """PBT copies member 1 (device 0) onto member 7 (device 3) leaf for
  leaf; the learner then takes the rule's output without compiling again;
  CEM and DvD give the unsharded values."""
  out = worker('rules')
  assert "pbt output shardings: [\"P('population',)\"]" in out, out


def test_choose_devices_on_four_devices():
  worker('choose_devices')


def fake_devices(k):
  return [types.SimpleNamespace(id=i, platform='cpu') for i in range(k)]


def test_choose_devices_auto_and_errors(caplog):
  devices = fake_devices(4)
  assert sharding.choose_devices('auto', 8, devices) == devices
  assert sharding.choose_devices('AUTO', 4, devices) == devices
  with caplog.at_level('INFO', logger='fastpbrl'):
    assert sharding.choose_devices('auto', 6, devices) == devices[:1]
  assert 'not a multiple of the 4 visible devices' in caplog.text
  assert sharding.choose_devices(2, 6, devices) == devices[:2]
  assert sharding.choose_devices('1', 7, devices) == devices[:1]
  for bad, population, pattern in [
      (5, 10, r'^--devices 5 exceeds the 4 visible cpu devices'),
      (3, 8, r'^--devices 3 does not divide --population-size 8'),
      ('two', 8, r"^--devices must be 'auto' or a positive integer, got 'two'"),
      (0, 8, r'^--devices must be .* got 0'), (2.0, 8, '^--devices must be')]:
    with pytest.raises(ValueError, match=pattern) as e:
      sharding.choose_devices(bad, population, devices)
    assert '\n' not in str(e.value)


def test_validate_checks_devices_before_anything_starts():
  validate(RunConfig(population_size=4, devices='2'))
  validate(RunConfig(population_size=4, devices='auto'))
  with pytest.raises(ConfigError, match='^--devices 3 does not divide'):
    validate(RunConfig(population_size=4, devices='3'))
  with pytest.raises(ConfigError, match='^--devices must be'):
    validate(RunConfig(population_size=4, devices='all'))


FLAGS = ['-m', 'experiments.pbt', '--env', 'Pendulum-v1',
         '--population-size', '4', '--warmup-steps', '100',
         '--hidden-sizes', '8', '8', '--batch-size', '8', '--steps-per-call',
         '10', '--ready-after', '100', '--eval-every', '100',
         '--eval-episodes', '1', '--num-actors', '1', '--replay-capacity',
         '2000', '--checkpoint-every', '50', '--no-progress', '--track', 'none']


@pytest.mark.slow
def test_pbt_over_devices_with_the_device_replay_resumes_on_another_count(
    tmp_path):
  """A tiny PBT run over 2 of the 4 devices with the replay on them (split
  with the members; the sampling key replicated), PBT copying replay data
  across devices and the replay checkpointed; then its resume over all 4
  (``--devices auto``): the checkpoint, replay included, is restored and
  resharded."""
  run_dir = str(tmp_path / 'run')
  flags = ['--replay-location', 'device', '--checkpoint-replay']
  out = four_devices(FLAGS + flags + ['--env-steps', '400', '--devices', '2',
                                      '--copy-replay', '--run-dir', run_dir])
  assert re.search(r'population of 4 over 2 devices: 2 members each on '
                   r'cpu:0, cpu:1\n', out), out
  assert 'replay on the device (requested with --replay-location device)' \
      in out, out
  assert 'final evaluation' in out
  out = four_devices(['-m', 'experiments.pbt', '--resume', run_dir,
                      '--env-steps', '600', '--devices', 'auto', *flags])
  assert 'population of 4 over 4 devices: 1 member each on cpu:0, cpu:1, ' \
         'cpu:2, cpu:3' in out, out
  assert re.search(f'resumed {re.escape(run_dir)} at call [1-9]', out), out
  assert 'replay restored' in out, out
  assert 'final evaluation (1 episodes per member at 6' in out, out
