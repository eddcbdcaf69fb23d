"""``benchmarks.peers``'s pure parts, neither library run: each row's two
commands read back to the same layout, the environments each side starts
with, and the page generated from a record written here."""

import argparse
import dataclasses
import json

import pytest

from benchmarks import peers
from benchmarks.peers import report
from benchmarks.peers import rows as rows_lib

ALL_ROWS = rows_lib.rows(peers.ROWS)


def _fastpbrl_flags(argv):
  """The flags of a ``fastpbrl seeds`` command line, read by a parser of
  this test's own (not fastpbrl's: no JAX imported)."""
  parser = argparse.ArgumentParser()
  for flag in ('--agent', '--env', '--run-dir'):
    parser.add_argument(flag)
  for flag in ('--population-size', '--env-steps', '--batch-size',
               '--warmup-steps', '--replay-capacity'):
    parser.add_argument(flag, type=int)
  parser.add_argument('--hidden-sizes', type=int, nargs='+')
  parser.add_argument('--hparams', nargs='+', default=[])
  parser.add_argument('--agent-settings', nargs='+', default=[])
  parser.add_argument('--no-warmup-counts-as-data', action='store_true')
  parser.add_argument('--no-progress', action='store_true')
  assert argv[0] == 'seeds'
  flags = parser.parse_args(argv[1:])
  flags.hparams = {k: float(v) for k, v in
                   (h.split('=', 1) for h in flags.hparams)}
  flags.agent_settings = dict(s.split('=', 1) for s in flags.agent_settings)
  return flags


def _rejax_config(argv):
  """The rejax driver's members, mode and create() keywords, read back
  from its command line."""
  assert argv[0] == rows_lib.DRIVER
  args = dict(zip(argv[1::2], argv[2::2]))
  return int(args['--members']), args['--mode'], json.loads(args['--config'])


def test_the_rows_are_the_briefs_tasks_at_their_sizes():
  sizes = {r.name: (r.agent, r.env, r.members, r.env_steps) for r in ALL_ROWS}
  assert sizes == {
      'ppo-sb3': ('ppo', 'CartPole-v1', 16, 500_000),
      'td3': ('td3', 'Pendulum-v1', 4, 15_000),
      'ppo-purejaxrl': ('ppo', 'CartPole-v1', 16, 500_000),
      'ppo-purejaxrl-16': ('ppo', 'CartPole-v1', 16, 100_000),
      'ppo-purejaxrl-64': ('ppo', 'CartPole-v1', 64, 100_000),
      'ppo-purejaxrl-256': ('ppo', 'CartPole-v1', 256, 100_000)}
  scaled = rows_lib.rows(['scale'], scale_members=[8], scale_env_steps=123)
  assert [(r.members, r.env_steps) for r in scaled] == [(8, 123)]


@pytest.mark.parametrize('row', [r for r in ALL_ROWS if r.agent == 'ppo'],
                         ids=lambda r: r.name)
def test_ppo_commands_have_one_layout_on_both_sides(row):
  fast = _fastpbrl_flags(rows_lib.fastpbrl_command(row, '/tmp/run'))
  for mode in ('vmap', 'pmap'):
    members, got_mode, rejax = _rejax_config(rows_lib.rejax_command(row,
                                                                    mode))
    assert got_mode == mode
    assert fast.agent == 'ppo' and fast.env == f'gymnax:{rejax["env"]}'
    assert fast.population_size == members == row.members
    assert fast.env_steps == rejax['total_timesteps'] == row.env_steps
    settings = fast.agent_settings
    # Steps per rollout, envs, epochs, minibatch size, widths, activation.
    assert int(settings['rollout_length']) == rejax['num_steps']
    assert int(settings['num_envs']) == rejax['num_envs']
    assert int(settings['epochs']) == rejax['num_epochs']
    assert int(settings['batch_size']) == (
        rejax['num_envs'] * rejax['num_steps'] // rejax['num_minibatches'])
    assert fast.hidden_sizes == rejax['agent_kwargs']['hidden_layer_sizes']
    assert settings['activation'] == rejax['agent_kwargs']['activation']
    # The hyperparameters both have, by each side's name.
    assert fast.hparams == {
        'learning_rate': rejax['learning_rate'],
        'clip_range': rejax['clip_eps'], 'ent_coef': rejax['ent_coef'],
        'vf_coef': rejax['vf_coef'], 'gae_lambda': rejax['gae_lambda'],
        'discount': rejax['gamma'],
        'max_grad_norm': rejax['max_grad_norm']}
    # rejax evaluates once, at the end.
    assert rejax['eval_freq'] == rejax['total_timesteps']
    assert rejax['skip_initial_evaluation'] is True


def test_the_layouts_are_sb3s_and_purejaxrls():
  by_name = {r.name: _fastpbrl_flags(rows_lib.fastpbrl_command(r, 'x'))
             for r in ALL_ROWS}
  assert by_name['ppo-sb3'].agent_settings == {
      'rollout_length': '2048', 'num_envs': '1', 'epochs': '10',
      'batch_size': '64', 'activation': 'tanh'}
  assert by_name['ppo-sb3'].hparams['learning_rate'] == 3e-4
  # 4 envs x 128 steps in 4 minibatches: 128 each.
  assert by_name['ppo-purejaxrl'].agent_settings == {
      'rollout_length': '128', 'num_envs': '4', 'epochs': '4',
      'batch_size': '128', 'activation': 'tanh'}
  assert by_name['ppo-purejaxrl'].hparams['ent_coef'] == 0.01
  for flags in by_name.values():
    assert flags.hidden_sizes == [64, 64] and flags.no_progress


def test_td3_commands_take_one_update_per_env_step_on_both_sides():
  row, = rows_lib.rows(['td3'])
  fast = _fastpbrl_flags(rows_lib.fastpbrl_command(row, '/tmp/run'))
  members, _, rejax = _rejax_config(rows_lib.rejax_command(row, 'vmap'))
  assert fast.population_size == members == 4
  assert fast.env_steps == rejax['total_timesteps'] == 15_000
  assert fast.hidden_sizes == [64, 64]  # rejax 0.1.3's TD3: fixed 64x64
  assert fast.batch_size == rejax['batch_size'] == 256
  # fastpbrl counts only steps after the warm-up toward its one update per
  # env step; rejax updates once its step count passes fill_buffer.
  assert fast.no_warmup_counts_as_data
  assert rejax['fill_buffer'] == fast.warmup_steps - 1
  assert rejax['num_envs'] == 1 and rejax['num_epochs'] == 1
  # Every transition kept on both sides.
  assert rejax['buffer_size'] == 15_000 <= fast.replay_capacity
  h = fast.hparams
  assert h['policy_lr'] == h['critic_lr'] == rejax['learning_rate']
  assert h['discount'] == rejax['gamma']
  assert rejax['polyak'] == pytest.approx(1 - h['tau'])
  assert rejax['policy_delay'] == 1 / h['policy_update_fraction'] == 2
  # Noises: fastpbrl's in half action ranges, rejax's in Pendulum's units
  # (actions in [-2, 2]).
  assert rejax['exploration_noise'] == pytest.approx(
      2 * h['exploration_noise'])
  assert rejax['target_noise'] == pytest.approx(2 * h['target_noise'])
  assert rejax['target_noise_clip'] == pytest.approx(2 * h['noise_clip'])
  assert rejax['actor_kwargs'] == rejax['critic_kwargs'] == {
      'activation': 'relu'}


def test_td3_refuses_widths_rejax_cannot_build():
  row, = rows_lib.rows(['td3'])
  with pytest.raises(ValueError, match='64x64 networks only'):
    rows_lib.rejax_config(dataclasses.replace(row, hidden=(256, 256)))


def test_only_rejaxs_pmap_process_gets_a_device_per_core():
  base = {'PATH': '/bin', 'XLA_FLAGS': '--xla_backend_optimization_level=0',
          'FASTPBRL_CPU_DEVICES': '1'}
  assert rows_lib.side_environment('vmap', 8, base) == {'PATH': '/bin'}
  assert rows_lib.side_environment('pmap', 8, base) == {
      'PATH': '/bin',
      'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  assert base['FASTPBRL_CPU_DEVICES'] == '1'  # the caller's left alone
  assert rows_lib.side_environment('one-device', 8, base) == {
      'PATH': '/bin', 'FASTPBRL_CPU_DEVICES': '1'}


def _side(*seconds):
  return {'runs': [{'seconds': s} for s in seconds],
          **report.summary(seconds)}


def test_the_page_is_generated_from_the_json(tmp_path):
  sb3, td3 = rows_lib.rows(['ppo-sb3', 'td3'])
  args = argparse.Namespace(cores=2, sides=list(report.SIDES))
  record_rows = []
  for row, sides in ((sb3, {'fastpbrl': _side(30.0, 34.0, 31.0),
                            'fastpbrl-one-device': _side(45.0, 47.0, 46.0),
                            'fastpbrl-pbt': _side(31.5, 33.0, 32.0),
                            'rejax-vmap': _side(60.0, 62.0, 61.0),
                            'rejax-pmap': _side(40.0, 44.0, 42.0)}),
                     (td3, {'fastpbrl': _side(10.0, 12.0, 11.0),
                            'rejax-vmap': {'runs': [{'error': 'failed (1): '
                                                     'boom'}],
                                           'error': 'failed (1): boom'},
                            'rejax-pmap': _side(20.0, 20.0, 20.0)})):
    settings = dataclasses.asdict(row)
    settings['hparams'] = dict(row.hparams)
    record_rows.append({'row': row.name, 'settings': settings,
                        'commands': peers.commands(row, args.sides, 2),
                        'sides': sides})
  record = {'command': 'python -m benchmarks.peers --repeats 3',
            'machine': {'platform': 'Linux', 'cpu_model': 'Test CPU',
                        'cpus': 2, 'cores_available': 2, 'jax': '0.10.2'},
            'date': '2026-12-10', 'commit': 'a' * 40, 'code': 'aaaaaaa',
            'versions': {'fastpbrl': {'jax': '0.10.2', 'jaxlib': '0.10.2'},
                         'rejax': {'rejax': '0.1.3', 'jax': '0.10.2',
                                   'jaxlib': '0.10.2', 'gymnax': '0.0.9'}},
            'settings': {'repeats': 3, 'cores': 2}, 'rows': record_rows}
  out = tmp_path / 'peers.json'
  out.write_text(json.dumps(record))
  peers.main(['--report-only', '--out', str(out)])
  page = (tmp_path / 'peers.md').read_text()
  # min (median); the ratio against the faster rejax variant (pmap here):
  # 30 / 40 by min, 31 / 42 by median.
  # One device against the default: 45 / 30 by min; PBT: 31.5 / 30.
  assert ('| ppo-sb3 | PPO CartPole-v1 | 16 x 500,000 | 30.0 (31.0) '
          '| 45.0 (46.0) | 31.5 (32.0) | 60.0 (61.0) | 40.0 (42.0) '
          '| 0.75 (0.74) | 1.50 | 1.05 |') in page
  # A failed variant: its error in its cell, the ratio from the other; a
  # side not run says so.
  assert ('| td3 | TD3 Pendulum-v1 | 4 x 15,000 | 10.0 (11.0) | not run '
          '| not run | failed (1): boom | 20.0 (20.0) | 0.50 (0.55) |  |  |'
          ) in page
  assert ('FASTPBRL_CPU_DEVICES=1 fastpbrl seeds --agent ppo') in page
  # PBT's run decides every 5% of the budget: 500,000 / 20.
  assert 'fastpbrl pbt --agent ppo' in page and '--ready-after 25000' in page
  assert 'rejax, pmap over 2 devices (s)' in page
  assert 'Test CPU, 2 cores' in page and 'commit ' + 'a' * 40 in page
  assert 'rejax 0.1.3, jax 0.10.2' in page
  assert ('SB3: 1 env(s) x 2048 steps, 10 epochs of minibatches of 64 '
          '| 64x64 tanh | learning_rate 0.0003') in page
  assert ('XLA_FLAGS=--xla_force_host_platform_device_count=2 '
          '.venv-rejax/bin/python benchmarks/peers/rejax_train.py --algo '
          'td3') in page
  assert report.DIFFERENCES[0] in page  # the record's own list, or these
