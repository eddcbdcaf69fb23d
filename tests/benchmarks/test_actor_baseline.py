"""The benchmark of today's actor beside an earlier commit's: the earlier
tree it runs, its measurement there, and the table of ratios."""

import os
import subprocess

import pytest

from benchmarks import actor_baseline
from benchmarks.pages import actor_baseline_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def has_baseline() -> bool:
  """Whether this checkout holds the baseline commit (a shallow clone may
  not)."""
  done = subprocess.run(
      ['git', 'cat-file', '-e', f'{actor_baseline.BASELINE_REV}^{{commit}}'],
      cwd=ROOT, capture_output=True)
  return done.returncode == 0


needs_baseline = pytest.mark.skipif(
    not has_baseline(), reason='the baseline commit is not in this checkout')


def test_the_table_divides_each_mode_by_the_earlier_actor():
  record = {'rows': [{'env': 'E', 'members': 8, 'baseline': 10_000.0,
                      'serial': 12_000.0, 'vectorized': 15_500.0}]}
  table = actor_baseline_table(record)
  assert ('| E | 8 | 10,000 | 12,000 | 15,500 | 1.20x | 1.55x | 1.29x |'
          in table)


@needs_baseline
def test_the_earlier_tree_has_the_serial_actor(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  full = actor_baseline.extract_tree(actor_baseline.BASELINE_REV[:12],
                                     str(tmp_path))
  assert full == actor_baseline.BASELINE_REV
  # Before the batched stepping: no vectorized env batches, and the
  # benchmark's own measurement the probe calls.
  assert not (tmp_path / 'fastpbrl' / 'actors' / 'vector_envs.py').exists()
  source = (tmp_path / 'benchmarks' / 'actor_throughput.py').read_text()
  assert 'class Args' in source and 'def actor_steps_per_s' in source


@pytest.mark.slow
@needs_baseline
def test_the_probe_measures_the_earlier_tree(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  actor_baseline.extract_tree(actor_baseline.BASELINE_REV, str(tmp_path))
  args = actor_baseline.parse_args(['--seconds', '0.5', '--hidden', '8'])
  rate = actor_baseline.baseline_steps_per_s(str(tmp_path), args,
                                             'Pendulum-v1', 2)
  assert rate > 0


def test_bad_settings_stop_with_the_flag_named(capsys):
  with pytest.raises(SystemExit):
    actor_baseline.parse_args(['--repeats', '0'])
  assert '--repeats' in capsys.readouterr().err


def test_a_revision_not_in_the_checkout_stops_with_the_flag_named(
    monkeypatch):
  monkeypatch.chdir(ROOT)
  with pytest.raises(SystemExit, match='--baseline-rev'):
    actor_baseline.main(['--baseline-rev', 'no-such-revision'])
