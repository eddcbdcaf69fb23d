"""Every core by default on the device path (``fastpbrl.devices.cores``):
the device count each case gets, worked out by hand; a run that starts
JAX itself splits its population over one host device per core; the
actor path and a JAX already started are left as they are."""

import logging
import os
import subprocess
import sys

import jax
import pytest

from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.devices import cores
from fastpbrl.run import build

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DEFAULT_ENV = {}  # neither XLA_FLAGS' count nor FASTPBRL_CPU_DEVICES


@pytest.mark.parametrize('devices, members, processes, machine, expected', [
    ('auto', 16, 1, 2, 2),  # 8 members on each core
    ('auto', 6, 1, 4, 3),  # 4 does not divide 6: 3 devices of 2 members
    ('auto', 4, 1, 16, 4),  # no more devices than members
    ('auto', 3, 1, 2, None),  # only 1 divides 3 below 2: one device
    ('auto', 1, 1, 8, None),
    ('auto', 4, 2, 16, 2),  # 8 cores a process; 4 = 2 processes x 2 x 1
    ('auto', 8, 2, 2, None),  # 1 core a process
    ('2', 4, 1, 1, 2),  # --devices K asks for K, whatever the cores
    (4, 8, 2, 16, 2),  # K over every process
    (3, 6, 2, 16, None),  # K that processes do not share: the checks refuse
    ('1', 4, 1, 16, None),
    ('many', 4, 1, 16, None),  # refused later, naming --devices
])
def test_the_count_of_each_case(devices, members, processes, machine,
                                expected):
  assert cores.cpu_devices_for(devices, members, processes, DEFAULT_ENV,
                               cores=machine) == expected


def test_the_users_own_count_comes_first():
  flags = {'XLA_FLAGS': '--xla_force_host_platform_device_count=3'}
  assert cores.cpu_devices_for('auto', 16, env=flags, cores=8) is None
  assert cores.cpu_devices_for(
      'auto', 16, env={cores.CPU_DEVICES_VAR: '5'}, cores=8) == 5
  assert cores.cpu_devices_for(
      '2', 16, env={cores.CPU_DEVICES_VAR: '1'}, cores=8) is None
  for bad in ('0', '-2', 'two'):
    with pytest.raises(ValueError, match=f'^{cores.CPU_DEVICES_VAR} must be '
                       'a positive integer'):
      cores.cpu_devices_for('auto', 16, env={cores.CPU_DEVICES_VAR: bad})


def test_the_actor_path_keeps_its_cores(monkeypatch):
  asked = []
  monkeypatch.setattr(cores, 'set_cpu_devices', asked.append)
  monkeypatch.delenv(cores.CPU_DEVICES_VAR, raising=False)
  build.use_every_core(RunConfig(env='Pendulum-v1', population_size=4))
  assert asked == []
  build.use_every_core(RunConfig(env='gymnax:Pendulum-v1',
                                 population_size=4))
  count = cores.cpu_devices_for('auto', 4)  # None on a 1-core machine
  assert asked == ([] if count is None else [count])
  monkeypatch.setenv(cores.CPU_DEVICES_VAR, 'x')
  with pytest.raises(ConfigError, match=f'^{cores.CPU_DEVICES_VAR} must'):
    build.use_every_core(RunConfig(env='gymnax:Pendulum-v1'))


def test_a_jax_already_started_is_said_and_kept(monkeypatch, caplog):
  jax.devices()  # the backend starts
  before = len(jax.local_devices())
  monkeypatch.setenv(cores.CPU_DEVICES_VAR, '2')
  assert not cores.set_cpu_devices(2)
  with caplog.at_level(logging.INFO, logger='fastpbrl'):
    build.use_every_core(RunConfig(env='gymnax:Pendulum-v1',
                                   population_size=4))
  assert 'JAX started before the run' in caplog.text
  assert len(jax.local_devices()) == before


def test_a_command_on_the_device_path_uses_every_core(tmp_path):
  """``fastpbrl seeds`` with nothing set splits 4 PPO members over the
  most host devices (at most one per core) that divide them."""
  pytest.importorskip('gymnax')
  machine = len(os.sched_getaffinity(0))
  expected = max(d for d in range(1, min(machine, 4) + 1) if 4 % d == 0)
  env = {k: v for k, v in os.environ.items() if k != cores.CPU_DEVICES_VAR}
  proc = subprocess.run(
      [sys.executable, '-m', 'experiments.seeds', '--agent', 'ppo',
       '--env', 'gymnax:CartPole-v1', '--population-size', '4',
       '--agent-settings', 'rollout_length=16', 'num_envs=2',
       'batch_size=16', 'epochs=1', '--hidden-sizes', '8', '--env-steps',
       '32', '--eval-episodes', '1', '--no-progress', '--track', 'none',
       '--run-dir', str(tmp_path / 'run')],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  word = 'device:' if expected == 1 else 'devices:'
  assert f'population of 4 over {expected} {word}' in proc.stderr, (
      proc.stderr[-3000:])
