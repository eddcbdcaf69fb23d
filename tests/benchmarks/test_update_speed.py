"""Update-speed benchmark: smoke runs at tiny sizes, the torch-missing path,
flag validation, the benchmark's shapes, and torch vectorized vs sequential."""

import csv
import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest

from benchmarks import update_speed
from fastpbrl.core.types import make_env_spec
from tests import numerics

# A 128-wide matmul for the peak: the default 2048 takes about 7 s on two
# cores, and a smoke run measures it once per sweep (five times for TD3).
TINY = ['--population-sizes', '1', '2', '--repeats', '2', '--warmup', '0',
        '--batch-size', '4', '--hidden', '8', '--torch-threads', '1',
        '--max-seconds-per-config', '60', '--matmul-size', '128']
HAS_TORCH = update_speed.TORCH_AVAILABLE


def _run(tmp_path, *args):
  out = str(tmp_path / 'out')
  assert update_speed.main([*TINY, *args, '--out', out]) == 0
  with open(os.path.join(out, 'update_speed.json')) as f:
    result = json.load(f)
  with open(os.path.join(out, 'update_speed.csv')) as f:
    csv_rows = list(csv.DictReader(f))
  assert os.path.getsize(os.path.join(out, 'update_speed.png')) > 1000
  with open(os.path.join(out, 'summary.md')) as f:
    summary = f.read()
  assert len(csv_rows) == len(result['rows'])
  return result, csv_rows, summary


def _assert_complete(result, csv_rows, expected_keys):
  """Every expected (mode, agent, implementation, steps, N) has one ok row
  with positive, finite numbers."""
  meta = result['meta']
  assert meta['finished']
  assert meta['command'].startswith('python -m benchmarks.update_speed ')
  assert meta['machine']['device'] and meta['machine']['versions']['jax']
  assert meta['matmul']['peak_flop_per_s'] > 0
  assert meta['matmul']['size'] == 128
  rows = {(r['mode'], r['agent'], r['implementation'], r['steps_per_call'],
           r['population_size']): r for r in result['rows']}
  assert set(rows) == set(expected_keys)
  for key, row in rows.items():
    assert row['status'] == 'ok', (key, row['reason'])
    for field in ('time_per_call_ms', 'time_per_member_step_ms',
                  'time_per_update_step_ms', 'flops_per_call',
                  'achieved_flop_per_s', 'fraction_of_matmul_peak',
                  'peak_rss_bytes'):
      assert math.isfinite(row[field]) and row[field] > 0, (key, field)
    n, steps = key[4], key[3]
    # Both from one float64 1e3 * median (JSON keeps its repr): a division
    # by n * steps there, two multiplications here, 3 roundings.
    np.testing.assert_allclose(row['time_per_member_step_ms'] * n * steps,
                               row['time_per_call_ms'],
                               rtol=numerics.rounding_rtol(3, np.float64))
    assert row['num_samples'] == 2
    if key[2].startswith('jax'):
      assert math.isfinite(row['compile_s']) and row['compile_s'] >= 0, key
  for row in csv_rows:
    assert row['status'] == 'ok'
    assert float(row['time_per_call_ms']) > 0


def _in_process_impls():
  impls = ['jax-vectorized', 'jax-sequential']
  if HAS_TORCH:
    impls += ['torch-sequential', 'torch-vectorized']
  return impls


@pytest.mark.slow
def test_smoke_td3_and_shared_critic(tmp_path):
  impls = _in_process_impls()
  result, csv_rows, summary = _run(
      tmp_path, '--agents', 'td3', '--steps-per-call', '2',
      '--implementations', *impls, '--shared-critic', '--isolation', 'none')
  expected = [('independent', 'td3', i, 2, n) for i in impls for n in (1, 2)]
  expected += [('shared-critic', 'td3', i, 2, n)
               for i in ('jax-vectorized', 'jax-sequential') for n in (1, 2)]
  _assert_complete(result, csv_rows, expected)
  assert '### TD3: ms per member-step' in summary
  assert '### TD3 shared critic' in summary


@pytest.mark.slow
def test_smoke_sac_and_dqn(tmp_path):
  impls = _in_process_impls()
  # N = 2 only: N = 1 of every implementation is covered by the TD3 smoke
  # run above, and each extra size is another compilation per row.
  result, csv_rows, summary = _run(
      tmp_path, '--agents', 'sac', 'dqn', '--steps-per-call', '1',
      '--implementations', *impls, '--isolation', 'none',
      '--population-sizes', '2')
  _assert_complete(result, csv_rows,
                   [('independent', a, i, 1, 2) for a in ('sac', 'dqn')
                    for i in impls])
  assert '### SAC' in summary and '### DQN' in summary
  if HAS_TORCH:
    # Stacked members do the same work as a loop over them: the FLOP counts
    # agree (torch's counter alone overcounts grouped-conv backward as N^2).
    flops = {(r['agent'], r['implementation'], r['population_size']):
             r['flops_per_call'] for r in result['rows']}
    # The same integer count of matmuls and convolutions on both sides, each
    # divided by its number of calls and scaled by N: 4 float64 roundings.
    for agent in ('sac', 'dqn'):
      assert flops[(agent, 'torch-vectorized', 2)] == pytest.approx(
          flops[(agent, 'torch-sequential', 2)],
          rel=numerics.rounding_rtol(4, np.float64))


@pytest.mark.slow
def test_smoke_every_implementation_in_own_processes(tmp_path):
  impls = list(update_speed.IMPLEMENTATIONS if HAS_TORCH else
               [i for i in update_speed.IMPLEMENTATIONS
                if i not in update_speed.TORCH_IMPLEMENTATIONS])
  result, csv_rows, _ = _run(
      tmp_path, '--agents', 'td3', '--steps-per-call', '1',
      '--implementations', *impls, '--population-sizes', '2')
  _assert_complete(result, csv_rows,
                   [('independent', 'td3', i, 1, 2) for i in impls])
  parallel = [r for r in result['rows']
              if r['implementation'] == 'jax-parallel']
  assert all(r['memory_note'] == 'sum over the member processes'
             for r in parallel)


@pytest.mark.slow
def test_smoke_ppo(tmp_path):
  impls = _in_process_impls()
  # Minibatches of 512: one call is one iteration of 4 x 10 Adam steps on a
  # 2048-step rollout; '1' and 'default' both round to that iteration.
  result, csv_rows, summary = _run(
      tmp_path, '--agents', 'ppo', '--steps-per-call', '1', 'default',
      '--implementations', *impls, '--isolation', 'none',
      '--population-sizes', '2', '--batch-size', '512')
  _assert_complete(result, csv_rows,
                   [('independent', 'ppo', i, 2048, 2) for i in impls])
  assert '### PPO' in summary


def test_ppo_batch_size_must_divide_its_rollout(capsys):
  with pytest.raises(SystemExit):
    update_speed.parse_args(['--agents', 'ppo', '--batch-size', '100'])
  assert "--batch-size 100 must divide PPO's 2048-step rollout" in (
      capsys.readouterr().err)
  # Replay agents take any batch size.
  update_speed.parse_args(['--agents', 'td3', '--batch-size', '100'])


def test_without_torch_rows_are_skipped_with_a_message(tmp_path, monkeypatch,
                                                       capsys):
  monkeypatch.setattr(update_speed, 'TORCH_AVAILABLE', False)
  result, _, summary = _run(
      tmp_path, '--agents', 'td3', '--steps-per-call', '1',
      '--implementations', 'jax-sequential', 'torch-sequential',
      'torch-vectorized', '--isolation', 'none')
  assert 'torch is not installed: skipping torch-sequential, torch-vectorized' \
      in capsys.readouterr().out
  torch_rows = [r for r in result['rows']
                if r['implementation'].startswith('torch')]
  assert len(torch_rows) == 4
  assert all(r['status'] == 'skipped' and r['reason'] == 'torch is not installed'
             for r in torch_rows)
  jax_rows = [r for r in result['rows'] if r['implementation'] == 'jax-sequential']
  assert [r['status'] for r in jax_rows] == ['ok', 'ok']
  assert 'speed-up over JAX sequential' in summary
  assert result['meta']['torch_available'] is False


def test_time_budget_skips_larger_populations():
  cfg = update_speed.parse_args(
      ['--agents', 'td3', '--population-sizes', '1', '2', '4',
       '--steps-per-call', '1', '--repeats', '3', '--batch-size', '4',
       '--hidden', '8', '--max-seconds-per-config', '1e-6',
       '--implementations', 'jax-sequential', '--isolation', 'none'])
  case, = update_speed.build_cases(cfg)
  matmul = dict(peak_flop_per_s=1e12)
  rows = []
  update_speed.run_sweep(case, cfg, matmul, rows.append)
  assert [r['status'] for r in rows] == ['ok', 'skipped', 'skipped']
  assert rows[0]['num_samples'] == update_speed.MIN_SAMPLES
  assert '--max-seconds-per-config' in rows[1]['reason']


def test_out_of_memory_stops_the_sweep(monkeypatch):
  cfg = update_speed.parse_args(
      ['--agents', 'td3', '--population-sizes', '1', '2', '4',
       '--steps-per-call', '1', '--implementations', 'jax-vectorized',
       '--isolation', 'none'])
  case, = update_speed.build_cases(cfg)

  def fake_measure(case, cfg, n, cache, matmul):
    if n >= 2:
      raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to '
                         'allocate 123 bytes.')
    row = update_speed._base_row(case, n)
    row.update(status='ok', time_per_call_ms=1.0)
    return row

  monkeypatch.setattr(update_speed.sweep, 'measure', fake_measure)
  rows = []
  update_speed.run_sweep(case, cfg, {}, rows.append)
  assert [r['status'] for r in rows] == ['ok', 'oom', 'skipped']
  assert rows[2]['reason'] == 'out of memory at N=2'


@pytest.mark.parametrize('argv, message', [
    (['--agents', 'a2c'], "invalid choice: 'a2c'"),
    (['--population-sizes', '0'], '0 must be >= 1'),
    (['--steps-per-call', 'many'], "'many' is not an integer"),
    (['--repeats', '-1'], '-1 must be >= 1'),
    (['--warmup', '-1'], '-1 must be >= 0'),
    (['--max-seconds-per-config', 'inf'], 'must be a positive number'),
    (['--agents'], 'nothing to run'),
    (['--shared-critic', '--implementations', 'torch-sequential'],
     '--shared-critic needs jax-vectorized or jax-sequential'),
])
def test_bad_flags_exit_with_a_clear_message(argv, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    update_speed.parse_args(argv)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_defaults_follow_the_issue():
  cfg = update_speed.parse_args([])
  assert cfg.population_sizes == (1, 2, 4, 8, 16, 32, 64, 80)
  steps = {(c.agent, c.steps) for c in update_speed.build_cases(cfg)}
  assert steps == {('td3', 1), ('td3', 50), ('sac', 1), ('sac', 50),
                   ('dqn', 1), ('dqn', 10)}
  batch = {c.agent: c.batch_size for c in update_speed.build_cases(cfg)}
  assert batch == {'td3': 256, 'sac': 256, 'dqn': 32}


def test_shapes_are_half_cheetah_v5_and_atari():
  env = gym.make('HalfCheetah-v5')
  try:
    real = make_env_spec(env)
  finally:
    env.close()
  spec = update_speed.env_spec('td3')
  assert spec.observations.shape == real.observations.shape
  assert spec.actions.shape == real.actions.shape
  np.testing.assert_array_equal(spec.actions.minimum, real.actions.minimum)
  np.testing.assert_array_equal(spec.actions.maximum, real.actions.maximum)
  atari = update_speed.env_spec('dqn')
  assert atari.observations.shape == (84, 84, 4)
  assert atari.observations.dtype == np.uint8


def test_flops_count_one_step_times_steps():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  flops = update_speed.xla_flops(lambda a, b: a @ b, jnp.zeros((64, 32)),
                                 jnp.zeros((32, 16)))
  # XLA's cost analysis is a model, not a rounding: it counts 2 m k n for a
  # dot today (exactly 65536 here); 1% leaves room for a version that adds
  # bookkeeping operations, and still tells a dot from anything else.
  assert flops == pytest.approx(2 * 64 * 32 * 16, rel=0.01)
  assert update_speed._flops_from([{'flops': 5.0}]) == 5.0
  assert update_speed._flops_from({'bytes accessed': 1.0}) is None
  assert update_speed._flops_from([]) is None


@pytest.mark.parametrize('agent', ['td3', 'dqn'])
def test_torch_vectorized_takes_the_members_own_steps(agent):
  torch = pytest.importorskip('torch')
  from benchmarks import torch_agents  # pylint: disable=import-outside-toplevel
  # TD3 in float64 (tests/numerics.py, rule 2): Adam's eps of 1e-8 turns a
  # float32 rounding difference in a gradient near zero into a full step.
  # DQN stays float32: its CNN casts the frames to float32.
  dtype = torch.float64 if agent == 'td3' else torch.float32
  default = torch.get_default_dtype()
  torch.set_default_dtype(dtype)  # the layers' parameters
  try:
    torch.manual_seed(0)
    dims = (dict(obs_dim=17, action_dim=6, hidden=(16, 16)) if agent == 'td3'
            else dict(num_actions=18))
    members = [torch_agents.make_agent(agent, **dims) for _ in range(3)]
    if agent == 'td3':  # no target smoothing noise: the two layouts draw
      for m in members:  # their random numbers in a different order
        m.target_noise = 0.0
    population = torch_agents.stack_members(members)
    if agent == 'td3':
      population.target_noise = 0.0
    spec = update_speed.env_spec(agent)
    batch = torch_agents.to_torch(
        update_speed.random_batch(spec, (3, 2, 8), 0), 'cpu',
        image=agent == 'dqn')
    batch = {k: v.to(dtype) if v.is_floating_point() else v
             for k, v in batch.items()}
    for step in range(2):  # TD3: a step with the policy update and one without
      population.update({k: v[:, step] for k, v in batch.items()})
      for i, m in enumerate(members):
        m.update({k: v[i, step] for k, v in batch.items()})
    expected = torch_agents.stack_members(members)
  finally:
    torch.set_default_dtype(default)
  if agent == 'td3':
    tolerance = numerics.TRAJECTORY  # 2 Adam steps in float64 (rule 2)
  else:
    # Centred RMSprop's eps = 0.01 caps what a float32 gradient difference d
    # does to a weight at 2 steps x lr / 0.01 x d = 0.05 d: atol allows 2e-4.
    tolerance = {'rtol': 1e-4, 'atol': 1e-5}
  for attr in population.modules:
    got = dict(getattr(population, attr).named_parameters())
    for name, value in getattr(expected, attr).named_parameters():
      assert got[name].dtype == dtype
      torch.testing.assert_close(got[name], value, **tolerance,
                                 msg=f'{attr}.{name}')


def test_torch_vectorized_ppo_takes_the_members_own_iterations():
  torch = pytest.importorskip('torch')
  from benchmarks import torch_agents  # pylint: disable=import-outside-toplevel
  from fastpbrl.agents import ppo  # pylint: disable=import-outside-toplevel
  default = torch.get_default_dtype()
  torch.set_default_dtype(torch.float64)  # rule 2 of tests/numerics.py
  try:
    torch.manual_seed(0)
    # One minibatch of the whole rollout per epoch: the shuffle (drawn
    # differently by the two layouts) then only reorders a mean's terms.
    settings = dict(obs_dim=17, action_dim=6, hidden=(16, 16),
                    minibatch_size=32)
    members = [torch_agents.make_agent('ppo', **settings) for _ in range(3)]
    for m in members:
      m.epochs, m.ent_coef = 2, 0.01
    population = torch_agents.stack_members(members)
    population.epochs, population.ent_coef = 2, 0.01
    agent = ppo.make_agent(update_speed.env_spec('ppo'), ppo.PPOConfig(
        rollout_length=16, num_envs=2, batch_size=32))
    rollout = update_speed.random_data(agent, (3,), 32, 32, 0)
    batch = torch_agents.to_torch(rollout, 'cpu', image=False)
    batch = {k: v.double()[:, 0] for k, v in batch.items()}  # iteration 0
    population.update(batch)
    for i, m in enumerate(members):
      m.update({k: v[i] for k, v in batch.items()})
    expected = torch_agents.stack_members(members)
  finally:
    torch.set_default_dtype(default)
  for attr in population.modules:  # 2 Adam steps in float64 (rule 2)
    got = dict(getattr(population, attr).named_parameters())
    for name, value in getattr(expected, attr).named_parameters():
      torch.testing.assert_close(got[name], value, **numerics.TRAJECTORY,
                                 msg=f'{attr}.{name}')
  torch.testing.assert_close(population.log_std, expected.log_std,
                             **numerics.TRAJECTORY)


def _gone(pid: int) -> bool:
  """Exited (a zombie counts: it runs no more)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
  except FileNotFoundError:
    return True


def test_a_benchmark_child_exits_when_its_parent_is_killed():
  """The sweep and member processes watch their parent: with it killed
  outright, they end instead of waiting forever on a queue no one reads."""
  import signal  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import time  # noqa: PLC0415
  repo = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  child = ('from benchmarks.update_speed.timing import exit_with_parent; '
           'import os, time; exit_with_parent(0.05); '
           "os.write(1, b'%d\\n' % os.getpid()); time.sleep(600)")
  parent = ('import subprocess, sys, time; '
            f'subprocess.Popen([sys.executable, "-c", {child!r}]); '
            'time.sleep(600)')
  proc = subprocess.Popen([sys.executable, '-c', parent], cwd=repo,
                          stdout=subprocess.PIPE, text=True,
                          env={**os.environ, 'PYTHONPATH': repo})
  try:
    pid = int(proc.stdout.readline())
    assert not _gone(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while not _gone(pid) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert _gone(pid), 'the orphaned child is still running'
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
