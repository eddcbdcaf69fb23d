"""``benchmarks.ppo_speed``'s record: rows added to a sweep's record."""

import json

import pytest

from benchmarks import ppo_speed

SETTINGS = {'members': [1, 4], 'env_steps': 1000, 'agent': 'ppo',
            'jax_env': 'gymnax:CartPole-v1', 'gym_env': 'CartPole-v1',
            'no_sb3': False}
MACHINE = {'cpu_model': 'test', 'cpus': 2, 'device': 'cpu'}


def _record(rows, settings=SETTINGS, commit='a' * 40, command='sweep'):
  return {'command': command, 'machine': MACHINE, 'date': '2026-11-29',
          'commit': commit, 'settings': settings, 'rows': rows}


def _row(n, mode, seconds):
  return {'members': n, 'mode': mode, 'seconds': seconds,
          'env_steps_per_s': n * 1000 / seconds}


def test_merge_adds_and_replaces_rows_and_lists_the_addition(tmp_path):
  path = tmp_path / 'speed.json'
  path.write_text(json.dumps(_record(
      [_row(1, 'fastpbrl', 2.0), _row(4, 'fastpbrl', 4.0),
       _row(1, 'sb3', 10.0)])))
  new = _record([_row(4, 'fastpbrl', 3.0), _row(256, 'fastpbrl', 50.0)],
                settings={**SETTINGS, 'members': [4, 256], 'no_sb3': True},
                commit='b' * 40, command='more')
  record = ppo_speed.merged(str(path), new)
  assert [(r['members'], r['mode'], r['seconds']) for r in record['rows']] == [
      (1, 'fastpbrl', 2.0), (4, 'fastpbrl', 3.0), (256, 'fastpbrl', 50.0),
      (1, 'sb3', 10.0)]
  assert record['commit'] == 'a' * 40  # the sweep's own provenance stays
  assert record['additions'] == [{'command': 'more', 'date': '2026-11-29',
                                  'commit': 'b' * 40,
                                  'rows': [(4, 'fastpbrl'),
                                           (256, 'fastpbrl')]}]
  text = ppo_speed.markdown(record)
  assert 'Rows N=4 (fastpbrl), N=256 (fastpbrl): `more`' in text
  # N x SB3 of the added row: 256 x 10 s against its 50 s.
  assert '| 256 | fastpbrl |  | 50.0 |' in text and '51.2x' in text


def test_merge_refuses_rows_measured_otherwise(tmp_path):
  path = tmp_path / 'speed.json'
  path.write_text(json.dumps(_record([_row(1, 'fastpbrl', 2.0)])))
  new = _record([_row(4, 'fastpbrl', 3.0)],
                settings={**SETTINGS, 'env_steps': 2000})
  with pytest.raises(SystemExit, match='--merge: the settings differ .*'
                     'env_steps'):
    ppo_speed.merged(str(path), new)
