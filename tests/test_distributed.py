"""The population over several processes (``fastpbrl.distributed``) and
the local launcher (``fastpbrl.launch``).

The end-to-end check starts 2 processes on this machine (2 CPU devices
each, gloo collectives) through the launcher, running a 4-member TD3 PBT
(``tests/distributed_worker.py``), and compares what they wrote with the
same run in this process on one device.
"""

import json
import os
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from fastpbrl import distributed, launch
from tests import distributed_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu',
       'PYTHONPATH': os.pathsep.join(
           [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p])}
for name in (distributed.COORDINATOR, distributed.NUM_PROCESSES,
             distributed.PROCESS_ID):
  ENV.pop(name, None)
LAUNCH = [sys.executable, '-m', 'fastpbrl.launch']


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.slow
def test_two_processes_agree_and_equal_one_process(tmp_path):
  """2 processes x 2 CPU devices, 4 members, 2 learner calls then a PBT
  exploit, twice: both processes record the same rule decisions, which
  copy members across processes, and the final state assembled from
  their rows equals the one-process, one-device run's."""
  env = {**ENV, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  proc = subprocess.run(
      LAUNCH + ['--num-processes', '2', '--timeout', '280', '--grace', '5',
                '--', sys.executable, '-m', 'tests.distributed_worker',
                str(tmp_path)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  log = proc.stdout[-3000:] + proc.stderr[-5000:]
  assert proc.returncode == 0, log
  outs = [json.loads((tmp_path / f'process_{i}.json').read_text())
          for i in range(2)]
  assert [o['rows'] for o in outs] == [[0, 1], [2, 3]]
  assert all(o['num_processes'] == 2 and o['global_devices'] == 4
             and o['local_devices'] == 2 for o in outs)
  for o in outs:
    assert not alive(o['pid']), o['pid']

  # (a) the same decisions in both processes, exactly.
  assert outs[0]['decisions'] == outs[1]['decisions']
  decisions = outs[0]['decisions']
  # The fitness table has process 0's members copy process 1's, then the
  # other way round.
  assert decisions[0]['replaced'] == [True, True, False, False]
  assert set(decisions[0]['parent'][:2]) <= {2, 3}
  assert decisions[1]['replaced'] == [False, False, True, True]
  assert set(decisions[1]['parent'][2:]) <= {0, 1}

  # (b) the one-process run on the same batches with the same keys.
  ref = distributed_worker.reference()
  for got, want in zip(decisions, ref['decisions']):
    assert got['parent'] == want['parent']
    assert got['replaced'] == want['replaced']
    np.testing.assert_allclose(got['fitness'], want['fitness'], rtol=1e-5)
    for field, values in want['hparams'].items():
      np.testing.assert_allclose(got['hparams'][field], values, rtol=1e-6,
                                 err_msg=field)
  for part in ('state', 'hparams'):
    assert set(outs[0][part]) == set(ref[part])
    for path, want in ref[part].items():
      got = np.concatenate([np.asarray(o[part][path]) for o in outs])
      want = np.asarray(want)
      assert got.shape == want.shape, (path, got.shape, want.shape)
      if np.issubdtype(want.dtype, np.integer):  # keys, step counters
        np.testing.assert_array_equal(got, want, err_msg=path)
      else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6,
                                   err_msg=path)


def test_settings_from_env():
  ours = {'FASTPBRL_COORDINATOR': 'host-a:1234',
          'FASTPBRL_NUM_PROCESSES': '3', 'FASTPBRL_PROCESS_ID': '2'}
  assert distributed.settings_from_env(ours) == dict(
      coordinator_address='host-a:1234', num_processes=3, process_id=2,
      cluster_detection_method='deactivate')
  assert distributed.settings_from_env({}) is None
  assert distributed.settings_from_env({'PATH': '/bin'}) is None
  # SLURM: the task count and rank; jax finds the coordinator unless given.
  slurm = {'SLURM_NTASKS': '4', 'SLURM_PROCID': '1',
           'SLURM_STEP_NODELIST': 'node[01-02]', 'SLURM_JOB_ID': '9'}
  assert distributed.settings_from_env(slurm) == dict(num_processes=4,
                                                      process_id=1)
  assert distributed.settings_from_env(
      {**slurm, 'FASTPBRL_COORDINATOR': 'node01:555'}) == dict(
          num_processes=4, process_id=1, coordinator_address='node01:555')
  # Our variables win over SLURM's (the launcher inside an allocation).
  assert distributed.settings_from_env({**slurm, **ours})['process_id'] == 2
  for env, pattern in [
      ({**ours, 'FASTPBRL_PROCESS_ID': '3'},
       r'^FASTPBRL_PROCESS_ID must be an integer in \[0, 3\), got .3.$'),
      ({**ours, 'FASTPBRL_NUM_PROCESSES': 'two'},
       r'^FASTPBRL_NUM_PROCESSES must be an integer >= 1, got .two.$'),
      ({**ours, 'FASTPBRL_NUM_PROCESSES': '0'}, '^FASTPBRL_NUM_PROCESSES'),
      ({**ours, 'FASTPBRL_COORDINATOR': 'host-a'},
       '^FASTPBRL_COORDINATOR must be host:port'),
      ({'FASTPBRL_NUM_PROCESSES': '2', 'FASTPBRL_PROCESS_ID': '0'},
       '^FASTPBRL_COORDINATOR is not set but FASTPBRL_NUM_PROCESSES is'),
      ({'FASTPBRL_COORDINATOR': 'a:1', 'FASTPBRL_NUM_PROCESSES': '2'},
       '^FASTPBRL_PROCESS_ID is not set'),
      ({'FASTPBRL_COORDINATOR': 'a:1'},
       '^FASTPBRL_COORDINATOR is set but FASTPBRL_NUM_PROCESSES is not'),
      ({'SLURM_NTASKS': '2', 'SLURM_PROCID': '5'}, '^SLURM_PROCID must be'),
      ({'SLURM_NTASKS': '2', 'SLURM_PROCID': '0'},
       '^FASTPBRL_COORDINATOR is not set and SLURM_STEP_NODELIST')]:
    with pytest.raises(ValueError, match=pattern) as e:
      distributed.settings_from_env(env)
    assert '\n' not in str(e.value)


def test_initialize_from_env_alone_is_one_process():
  info = distributed.initialize_from_env({})
  assert (info.process_id, info.num_processes) == (0, 1)
  assert info.local_devices == info.global_devices


def fake_mesh(processes):
  return types.SimpleNamespace(devices=np.array(
      [types.SimpleNamespace(process_index=p) for p in processes]))


def test_member_rows():
  mesh = fake_mesh([0, 0, 1, 1])
  np.testing.assert_array_equal(distributed.member_rows(mesh, 4, 0), [0, 1])
  np.testing.assert_array_equal(distributed.member_rows(mesh, 8, 1),
                                [4, 5, 6, 7])
  with pytest.raises(ValueError, match='^a population of 6 does not split '
                     'evenly over 4 devices'):
    distributed.member_rows(mesh, 6, 0)
  with pytest.raises(ValueError, match=r'^process 0 owns rows \[0, 2\], not '
                     'one block'):
    distributed.member_rows(fake_mesh([0, 1, 0, 1]), 4, 0)


def test_single_process_round_trip_and_pbt_step():
  """One process, one device: the same functions are the identity on
  rows, and ``pbt_step`` equals the rule called directly."""
  import jax
  from fastpbrl.population import pbt as pbt_lib
  mesh = distributed.global_population_mesh(jax.devices()[:1])
  assert distributed.local_members(4, mesh) == slice(0, 4)
  tree = {'w': np.arange(8.0).reshape(4, 2), 'step': np.int32(3)}
  placed = distributed.to_global(tree, mesh, 4)
  back = distributed.to_local(placed)
  np.testing.assert_array_equal(back['w'], tree['w'])
  assert back['step'] == 3
  np.testing.assert_array_equal(
      distributed.allgather_members(np.arange(4), mesh, 4), np.arange(4))
  a = distributed_worker.agent()
  hparams = distributed_worker.hparams_of(a)
  state = {'x': np.arange(4.0)[:, None] * np.ones((4, 3)),
           'key': np.asarray(jax.random.split(jax.random.PRNGKey(0), 4))}
  exploit = pbt_lib.CompiledExploitExplore(distributed_worker.CONFIG,
                                           distributed_worker.SPACE)
  fitness, ready = np.array([0., 1., 2., 3.], np.float32), np.ones(4, bool)
  key = jax.random.PRNGKey(5)
  result, decision = distributed.pbt_step(exploit, key, state, hparams,
                                          fitness, ready, mesh)
  want = exploit(key, state, hparams, fitness, ready)
  np.testing.assert_array_equal(decision['parent'], want.parent)
  np.testing.assert_array_equal(decision['replaced'], want.replaced)
  np.testing.assert_array_equal(decision['fitness'], fitness)
  np.testing.assert_array_equal(result.state['x'], want.state['x'])
  for got, ref in zip(decision['hparams'], want.hparams):
    np.testing.assert_array_equal(got, ref)


def test_launch_sets_variables_and_stops_the_others_on_failure(tmp_path):
  """Process 1 fails at once; process 0 would sleep a minute: it is
  stopped after the grace period, and the launcher exits with 3."""
  # One os.write per line: the children share the launcher's stdout, and
  # print() may write its parts separately (PYTHONUNBUFFERED), so two
  # children's lines could interleave.
  script = ('import os, sys, time; e = os.environ; '
            "os.write(1, ' '.join(['vars', e['FASTPBRL_PROCESS_ID'], "
            "e['FASTPBRL_NUM_PROCESSES'], e['FASTPBRL_COORDINATOR'], "
            "str(os.getpid())]).encode() + b'\\n'); "
            "sys.exit(3) if e['FASTPBRL_PROCESS_ID'] == '1' else "
            'time.sleep(60)')
  start = time.monotonic()
  proc = subprocess.run(LAUNCH + ['--num-processes', '2', '--grace', '0.5',
                                  '--', sys.executable, '-c', script],
                        cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 3, proc.stdout + proc.stderr
  assert time.monotonic() - start < 30
  lines = sorted(l.split() for l in proc.stdout.splitlines()
                 if l.startswith('vars'))
  assert [l[1:3] for l in lines] == [['0', '2'], ['1', '2']], proc.stdout
  assert lines[0][3] == lines[1][3] and lines[0][3].startswith('localhost:')
  assert 'a process exited with status 3' in proc.stderr
  for line in lines:
    assert not alive(int(line[4]))


def test_launch_forwards_sigterm():
  script = ('import os, signal, sys, time; '
            'signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); '
            "os.write(1, b'ready\\n'); time.sleep(60)")
  proc = subprocess.Popen(LAUNCH + ['--num-processes', '2', '--', sys.executable,
                                    '-c', script],
                          cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    for _ in range(2):
      assert proc.stdout.readline().strip() == 'ready'
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def test_launch_timeout_and_usage():
  proc = subprocess.run(LAUNCH + ['--num-processes', '1', '--timeout', '0.5',
                                  '--grace', '0.5', '--', sys.executable, '-c',
                                  'import time; time.sleep(60)'],
                        cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 124, proc.stderr
  assert 'timed out after 0.5 s' in proc.stderr
  proc = subprocess.run(LAUNCH + ['--num-processes', '2'], cwd=REPO, env=ENV,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and 'no command given' in proc.stderr
  assert launch.exit_status(-signal.SIGTERM) == 128 + signal.SIGTERM


def test_launch_stops_children_that_ignore_a_forwarded_signal():
  script = ('import os, signal, time; '
            'signal.signal(signal.SIGTERM, signal.SIG_IGN); '
            "os.write(1, b'ready\\n'); time.sleep(60)")
  proc = subprocess.Popen(LAUNCH + ['--num-processes', '1', '--grace', '0.5',
                                    '--', sys.executable, '-c', script],
                          cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == 'ready'
    proc.send_signal(signal.SIGTERM)
    # Ignored twice (forwarded, then the grace period's SIGTERM): killed.
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
