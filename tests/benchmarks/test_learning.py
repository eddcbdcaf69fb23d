"""The learning benchmark end to end at a tiny budget, and its flag checks."""

import json
import os

import numpy as np
import pytest

from benchmarks import learning


@pytest.mark.slow
def test_tiny_benchmark_writes_results_table_and_plot(tmp_path):
  out = str(tmp_path / 'learning')
  runs = tmp_path / 'runs'
  runs.mkdir()
  argv = ['--tasks', 'Pendulum-v1', '--methods', 'seeds-td3', '--seeds', '0',
          '--env-steps', '400', '--population-size', '2', '--eval-episodes',
          '1', '--out', out, '--run-root', str(runs)]
  learning.main(argv)
  # The run's own folder lands under --run-root, not in the system's /tmp.
  (run_dir,) = runs.iterdir()
  assert run_dir.name.startswith('fpbrl-bench-seeds-td3-')
  assert (run_dir / 'run' / 'config.json').exists()
  path = learning.result_path(out, 'Pendulum-v1', 'seeds-td3', 0, 400)
  assert path.endswith(os.path.join('runs', 'Pendulum-v1@400', 'seeds-td3',
                                    'seed0.json'))
  with open(path) as f:
    result = json.load(f)
  assert len(result['final_returns']) == 2
  assert all(np.isfinite(r) for r in result['final_returns'])
  assert result['env_steps'] >= 400 and result['curve']
  # The last curve point is the final evaluation, at the budget.
  steps, best, mean = result['curve'][-1]
  assert best == pytest.approx(max(result['final_returns']))
  assert mean == pytest.approx(np.mean(result['final_returns']))
  with open(os.path.join(out, 'results.md')) as f:
    table = f.read()
  assert '| Pendulum-v1 | 400 | seeds-td3 | 1 |' in table
  assert os.path.getsize(os.path.join(out, 'learning.png')) > 1000
  # A second call keeps the existing result instead of running again.
  mtime = os.path.getmtime(path)
  learning.main(argv)
  assert os.path.getmtime(path) == mtime


@pytest.mark.parametrize('argv, message', [
    (['--tasks', 'Nope-v0'], '--tasks: unknown task'),
    (['--methods', 'ppo'], '--methods: unknown method'),
    (['--population-size', '1'], '--population-size must be >= 2'),
    (['--run-root', '/nonexistent/runs'], '--run-root:'),
])
def test_bad_flags_name_the_flag(argv, message, capsys):
  with pytest.raises(SystemExit):
    learning.main(argv + ['--report-only', '--out', '/nonexistent'])
  assert message in capsys.readouterr().err


@pytest.mark.slow
def test_sb3_reference_leaves_no_folders_in_the_temp_dir(tmp_path,
                                                          monkeypatch):
  pytest.importorskip('stable_baselines3')
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  monkeypatch.setenv('TMPDIR', str(scratch))  # each run is a subprocess
  out = str(tmp_path / 'learning')
  learning.main(['--tasks', 'Pendulum-v1', '--methods', 'sb3-td3', '--seeds',
                 '0', '--env-steps', '400', '--population-size', '2',
                 '--eval-episodes', '1', '--out', out])
  with open(learning.result_path(out, 'Pendulum-v1', 'sb3-td3', 0, 400)) as f:
    result = json.load(f)
  assert len(result['final_returns']) == 2
  assert len(result['curve']) >= 2  # one evaluation per --eval-every at least
  # SB3 makes an SB3-<date> folder per learn() call unless given a logger
  # (torch keeps one cache folder per user there: not ours to remove).
  assert [p.name for p in scratch.iterdir() if p.name.startswith('SB3-')] == []
