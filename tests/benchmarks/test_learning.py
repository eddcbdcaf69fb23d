"""The learning benchmark end to end at a tiny budget, and its flag checks."""

import csv
import json
import os
import subprocess

import jax
import numpy as np
import pytest

# Each import binds its module as learning.<module>.
import benchmarks.learning.cli  # noqa: F401
import benchmarks.learning.matrix  # noqa: F401
import benchmarks.learning.population  # noqa: F401
import benchmarks.learning.references  # noqa: F401
import benchmarks.learning.report  # noqa: F401
import benchmarks.learning.runs  # noqa: F401
import benchmarks.learning.store  # noqa: F401
import benchmarks.learning.suite  # noqa: F401
import benchmarks.learning.tables  # noqa: F401
from benchmarks import learning
from fastpbrl.cli import parse as fastpbrl_cli
from fastpbrl.rules import registry


@pytest.mark.slow
def test_tiny_benchmark_writes_results_table_and_plot(tmp_path):
  out = str(tmp_path / 'learning')
  runs = tmp_path / 'runs'
  runs.mkdir()
  argv = ['--tasks', 'Pendulum-v1', '--methods', 'seeds-td3', '--seeds', '0',
          '--env-steps', '400', '--population-size', '2', '--eval-episodes',
          '1', '--out', out, '--run-root', str(runs)]
  learning.cli.main(argv)
  # The run's own folder lands under --run-root, not in the system's /tmp.
  (run_dir,) = runs.iterdir()
  assert run_dir.name.startswith('fpbrl-bench-seeds-td3-')
  assert (run_dir / 'run' / 'config.json').exists()
  path = learning.store.result_path(out, 'Pendulum-v1', 'seeds-td3', 0, 400, 2)
  assert path.endswith(os.path.join('runs', 'Pendulum-v1@400_pop2',
                                    'seeds-td3', 'seed0.json'))
  with open(path) as f:
    result = json.load(f)
  assert len(result['final_returns']) == 2
  assert all(np.isfinite(r) for r in result['final_returns'])
  # The row says where its learner ran: a GPU's name, or no device at all.
  assert result.get('device') == learning.runs.learner_device()
  assert result['env_steps'] >= 400 and result['curve']
  # The last curve point is the final evaluation, at the budget.
  steps, best, mean = result['curve'][-1]
  # Exact: with one episode the curve holds the final returns themselves
  # (CSV and JSON write a float's repr), averaged in the same member order.
  assert best == max(result['final_returns'])
  assert mean == np.mean(result['final_returns'])
  with open(os.path.join(out, 'results.md')) as f:
    table = f.read()
  assert '| Pendulum-v1 | 400 | 2 | seeds-td3 | 1 |' in table
  assert os.path.getsize(os.path.join(out, 'learning.png')) > 1000
  # A second call keeps the existing result instead of running again.
  mtime = os.path.getmtime(path)
  learning.cli.main(argv)
  assert os.path.getmtime(path) == mtime


def _tiny_pbt_run(tmp_path, method):
  """One tiny run of ``method`` through the benchmark: its result JSON and
  the events of its lineage file."""
  out, runs = str(tmp_path / 'learning'), tmp_path / 'runs'
  runs.mkdir()
  learning.cli.main([
      '--tasks', 'Pendulum-v1', '--methods', method, '--seeds', '0',
      '--env-steps', '400', '--population-size', '2', '--eval-episodes', '1',
      '--out', out, '--run-root', str(runs)])
  with open(learning.store.result_path(out, 'Pendulum-v1', method, 0, 400,
                                       2)) as f:
    result = json.load(f)
  (run_dir,) = runs.iterdir()
  lineage = run_dir / 'run' / 'lineage.jsonl'
  events = [json.loads(line) for line in lineage.read_text().splitlines()]
  return result, events


@pytest.mark.slow
def test_tiny_pbt_benchmark_records_the_lineages_left(tmp_path):
  result, events = _tiny_pbt_run(tmp_path, 'pbt-ttest-td3')
  assert '--exploit ttest' in result['command']
  # From the lineage file, by hand: members whose line no copy replaced.
  copied = {e['member'] for e in events if e['event'] == 'exploit'}
  parents = {e['parent'] for e in events if e['event'] == 'exploit'}
  if not copied:
    assert result['lineages_at_end'] == 2
  else:  # with 2 members, every copy leaves one line
    assert result['lineages_at_end'] == 1 and len(copied | parents) == 2


@pytest.mark.slow
def test_tiny_no_copy_benchmark_decides_nothing(tmp_path):
  # The diagnostic row differs from the baseline only in the path: every
  # member starts at the defaults (pbt-td3's start would differ here; that
  # no copy passes --min-gap-absolute is tests/rules/pbt/test_exploit.py's).
  _, events = _tiny_pbt_run(tmp_path, 'pbt-no-copy-td3')
  inits = [e for e in events if e['event'] == 'init']
  assert [e['member'] for e in inits] == [0, 1]
  assert inits[0]['hparams'] == inits[1]['hparams']  # both at the defaults


@pytest.mark.slow
def test_tiny_random_search_benchmark_keeps_its_draws(tmp_path):
  """``random-td3`` runs through ``experiments.random``: its members end
  with distinct hyperparameters, the draws of its seed (no decision
  changes them), and no lineage."""
  out, runs = str(tmp_path / 'learning'), tmp_path / 'runs'
  runs.mkdir()
  learning.cli.main([
      '--tasks', 'Pendulum-v1', '--methods', 'random-td3', '--seeds', '0',
      '--env-steps', '400', '--population-size', '2', '--eval-episodes', '1',
      '--out', out, '--run-root', str(runs)])
  with open(
      learning.store.result_path(out, 'Pendulum-v1', 'random-td3', 0, 400,
                                 2)) as f:
    result = json.load(f)
  assert result['command'].startswith('python -m experiments.random ')
  first, second = result['hparams']
  assert first['policy_lr'] != second['policy_lr']
  (run_dir,) = runs.iterdir()
  assert not (run_dir / 'run' / 'lineage.jsonl').exists()
  with open(run_dir / 'run' / 'hparams.csv') as f:
    rows = list(csv.DictReader(f))
  for row in rows:  # every row set is the final one: the draws, unchanged
    final = result['hparams'][int(row['member'])]
    assert float(row['policy_lr']) == final['policy_lr']
  assert learning.tables.edge_share(result) is not None


@pytest.mark.parametrize('argv, message', [
    (['--tasks', 'Nope-v0'], '--tasks: unknown task'),
    (['--methods', 'ppo'], '--methods: unknown method'),
    (['--population-size', '0'], '--population-size must be >= 1'),
    (['--run-root', '/nonexistent/runs'], '--run-root:'),
])
def test_bad_flags_name_the_flag(argv, message, capsys):
  with pytest.raises(SystemExit):
    learning.cli.main(argv + ['--report-only', '--out', '/nonexistent'])
  assert message in capsys.readouterr().err


@pytest.mark.slow
def test_sb3_reference_leaves_no_folders_in_the_temp_dir(tmp_path,
                                                          monkeypatch):
  pytest.importorskip('stable_baselines3')
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  monkeypatch.setenv('TMPDIR', str(scratch))  # each run is a subprocess
  out = str(tmp_path / 'learning')
  learning.cli.main([
      '--tasks', 'Pendulum-v1', '--methods', 'sb3-td3', '--seeds', '0',
      '--env-steps', '400', '--population-size', '2', '--eval-episodes', '1',
      '--out', out])
  with open(learning.store.result_path(out, 'Pendulum-v1', 'sb3-td3', 0, 400,
                                       2)) as f:
    result = json.load(f)
  assert len(result['final_returns']) == 2
  assert len(result['curve']) >= 2  # one evaluation per --eval-every at least
  # SB3 makes an SB3-<date> folder per learn() call unless given a logger
  # (torch keeps one cache folder per user there: not ours to remove).
  assert [p.name for p in scratch.iterdir() if p.name.startswith('SB3-')] == []


def test_cem_mean_policy_curve_counts_env_steps_per_member(tmp_path):
  path = tmp_path / 'mean_policy.csv'
  path.write_text('generation,total_env_steps,actor_steps,mean_policy_return\n'
                  '1,28032,0,-157.5\n2,40064,4000,-399.25\n')
  assert learning.runs.cem_mean_policy_curve(str(path), 4) == [(7008, -157.5),
                                                               (10016, -399.25)]


def test_mean_of_curves_interpolates_over_the_common_span():
  a = [(0, 0.0), (10, 10.0), (20, 20.0)]
  b = [(5, 100.0), (15, 200.0), (25, 300.0)]
  steps, mean = learning.report._mean_of_curves([a, b])
  # The common span is [5, 20]; a at 5, 10, 15, 20 is 5, 10, 15, 20 and b
  # is 100, 150, 200, 250 there.
  np.testing.assert_array_equal(steps, [5, 10, 15, 20])
  # Exact: slopes 1 and 10 on whole numbers, then a halving: no rounding.
  np.testing.assert_array_equal(mean, [52.5, 80.0, 107.5, 135.0])


def test_report_plots_the_cem_mean_policy(tmp_path, monkeypatch):
  out = tmp_path / 'learning'
  for seed, curve in ((0, [(100, -500.0), (200, -300.0)]),
                      (1, [(120, -400.0), (220, -200.0)])):
    path = learning.store.result_path(str(out), 'Pendulum-v1', 'cemrl', seed,
                                      400, 2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      json.dump({'final_returns': [-900.0, -800.0], 'wall_time_s': 1.0,
                 'curve': [[200, -800.0, -850.0]], 'task': 'Pendulum-v1',
                 'method': 'cemrl', 'seed': seed, 'population_size': 2,
                 'eval_episodes': 1, 'budget': {'env_steps': 400},
                 'machine': 'test', 'date': '2026-11-24', 'code': 'x',
                 'cem_mean_policy_return': curve[-1][1],
                 'cem_mean_policy_curve': curve}, f)
  lines = []
  import matplotlib.axes  # noqa: PLC0415

  original = matplotlib.axes.Axes.plot

  def plot(ax, *args, **kwargs):
    lines.append((list(args[0]), list(args[1]), kwargs.get('label')))
    return original(ax, *args, **kwargs)

  monkeypatch.setattr(matplotlib.axes.Axes, 'plot', plot)
  table = learning.report.report(str(out))
  # The curve has no point in the budget's last fifth: no late mean.
  # CEM mean policy: mean of -300 and -200, sample std 50 x sqrt(2) = 71.
  assert ('| Pendulum-v1 | 400 | 2 | cemrl | 2 | -800 ± 0 | - | -850 ± 0 | '
          '-250 ± 71 |') in table
  (steps, ys, label), = lines
  assert label == 'cemrl mean policy (2 of 2 seeds)'
  # Seed 0 interpolated at 120 is -460 and seed 1 at 200 is -240: exact
  # (slope 2 on whole numbers, then a halving: no rounding).
  assert steps == [120, 200] and ys == [-430.0, -270.0]


def write_run(out, method: str, seed: int, **extra) -> None:
  """A Pendulum-v1 run of 2 members at 400 env steps (finals -200 and
  -100, one minute), with ``extra`` fields, as the benchmark stores it."""
  path = learning.store.result_path(str(out), 'Pendulum-v1', method, seed, 400,
                                    2)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump({'final_returns': [-200.0, -100.0], 'wall_time_s': 60.0,
               'curve': [[400, -100.0, -150.0]], 'task': 'Pendulum-v1',
               'method': method, 'seed': seed, 'population_size': 2,
               'eval_episodes': 1, 'budget': {'env_steps': 400},
               'machine': 'test', 'date': '2026-11-24', 'code': 'x',
               **extra}, f)


def test_report_gives_the_final_and_run_mean_action_distance(tmp_path):
  out = tmp_path / 'learning'
  # Seed 0 has the distance's history (rule.csv), seed 1 was stored before
  # it was recorded: the run mean covers seed 0 only and says so.
  for seed, final, curves in (
      (0, 0.5, {'mean_pairwise_action_distance': [(100, 2.0), (200, 1.5),
                                                  (300, 0.5)]}),
      (1, 0.7, None)):
    extra = {'rule_curves': curves} if curves else {}
    write_run(out, 'dvd', seed, rule_scalars={
        'mean_pairwise_action_distance': final}, **extra)
  table = learning.report.report(str(out))
  # Final: (0.5 + 0.7) / 2; run mean of seed 0: (2 + 1.5 + 0.5) / 3.
  assert ('| Pendulum-v1 | 400 | 2 | dvd | 2 | -100 ± 0 | -100 ± 0 | -150 ± 0 '
          '|  | 0.600 (1.333, 1 of 2 seeds) |  |  | 1.0 min | x |') in table
  with open(out / 'results.csv') as f:
    rows = f.read().splitlines()
  # DvD chooses no hyperparameters: no edge share.
  assert rows[1].endswith(',0.5,1.3333333333333333,,,60.0')
  assert rows[2].endswith(',0.7,,,,60.0')


def test_lineages_at_end_reads_the_runs_lineage_file(tmp_path, capsys):
  assert learning.runs.lineages_at_end(str(tmp_path)) is None  # no lineage kept
  events = [{'event': 'init', 'member': m, 'step': 0} for m in range(4)] + [
      {'event': 'exploit', 'member': 0, 'parent': 2, 'step': 10},
      {'event': 'exploit', 'member': 1, 'parent': 2, 'step': 20}]
  path = tmp_path / 'lineage.jsonl'
  path.write_text(''.join(json.dumps(e) + '\n' for e in events))
  assert learning.runs.lineages_at_end(str(tmp_path)) == 2  # members 2 and 3
  # A copy of a member the file never started: reported, not raised.
  with open(path, 'a') as f:
    f.write(json.dumps({'event': 'exploit', 'member': 3, 'parent': 7,
                        'step': 30}) + '\n')
  assert learning.runs.lineages_at_end(str(tmp_path)) is None
  assert 'lineages not counted' in capsys.readouterr().err


def test_report_gives_the_lineages_left_at_the_end(tmp_path):
  out = tmp_path / 'learning'
  # Seeds 0 and 1 recorded their lineages (3 and 2 left), seed 2 was
  # stored before the benchmark recorded them.
  for seed, count in ((0, 3), (1, 2), (2, None)):
    write_run(out, 'pbt-td3', seed,
              **({} if count is None else {'lineages_at_end': count}))
  table = learning.report.report(str(out))
  assert '|  | 2.5 (2 of 3 seeds) | 1.0 min | x |' in table
  with open(out / 'results.csv') as f:
    rows = f.read().splitlines()
  assert [r.split(',')[-2] for r in rows[1:]] == ['3', '2', '']


def test_late_best_averages_the_best_member_over_the_last_fifth(tmp_path):
  result = {'budget': {'env_steps': 1000},
            'curve': [[100, 500.0, 0.0], [700, 10.0, 0.0], [850, 20.0, 0.0],
                      [900, float('nan'), 0.0], [950, 40.0, 0.0],
                      [1000, 60.0, 0.0]]}
  # Points at 800 steps or later, the final one included; a missing
  # evaluation (nan) is left out: (20 + 40 + 60) / 3, exact (120 / 3).
  assert learning.report.late_best(result) == 40.0
  assert learning.report.late_best(
      {'budget': {'env_steps': 1000}, 'curve': []}) is None
  out = tmp_path / 'learning'
  for seed, curve in ((0, result['curve']),
                      (1, [[800, 100.0, 0.0], [1000, 0.0, 0.0]])):
    path = learning.store.result_path(str(out), 'Pendulum-v1', 'pbt-td3', seed,
                                      1000, 2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      json.dump({'final_returns': [60.0 if seed == 0 else 0.0, -10.0],
                 'wall_time_s': 60.0, 'curve': curve, 'task': 'Pendulum-v1',
                 'method': 'pbt-td3', 'seed': seed, 'population_size': 2,
                 'eval_episodes': 1, 'budget': {'env_steps': 1000},
                 'machine': 'test', 'date': '2026-11-25', 'code': 'x'}, f)
  table = learning.report.report(str(out))
  # Finals 60 and 0 (sample std 30 x sqrt(2) = 42); late means 40 and 50
  # (5 x sqrt(2) = 7).
  assert '| Pendulum-v1 | 1,000 | 2 | pbt-td3 | 2 | 30 ± 42 | 45 ± 7 |' in table
  with open(out / 'results.csv') as f:
    rows = f.read().splitlines()
  assert rows[0].startswith('task,env_steps_per_member,members,method,seed,'
                            'best_final,best_late,mean_final,')
  assert rows[1].startswith('Pendulum-v1,1000,2,pbt-td3,0,60.0,40.0,25.0,')


@pytest.mark.slow
def test_synchronous_loop_is_seeded_and_updates_after_the_warm_up():
  args = learning.cli.parse_args([
      '--env-steps', '300', '--population-size', '2', '--eval-episodes', '1',
      '--report-only'])
  task = learning.suite.task_budget(args, 'Pendulum-v1')
  first = learning.references.run_sync(args, 'Pendulum-v1', 'td3', seed=3)
  # One update per env step after the warm-up, as in SB3's loop (the
  # agent's own step counter, read back from its state).
  assert first['update_steps'] == 300 - task.warmup_steps > 0
  assert [s for s, _, _ in first['curve']] == list(
      range(task.eval_every, 301, task.eval_every))
  steps, best, mean = first['curve'][-1]
  # Exact: the curve's mean and this one average the same float64 member
  # means in the same order.
  assert best == max(first['final_returns'])
  assert mean == np.mean(first['final_returns'])
  # The seed fixes everything: a second run gives the same curve.
  again = learning.references.run_sync(args, 'Pendulum-v1', 'td3', seed=3)
  assert again['curve'] == first['curve']


def test_report_compares_each_rule_with_its_agents_seeds(tmp_path):
  out = tmp_path / 'learning'
  finals = {'seeds-td3': [-150.0, -140.0, -160.0, -145.0, -155.0],
            'pbt-td3': [-100.0, -110.0, -90.0, -105.0, -95.0],
            'seeds-sac': [-100.0, -300.0]}
  for method, values in finals.items():
    for seed, value in enumerate(values):
      path = learning.store.result_path(str(out), 'Pendulum-v1', method, seed,
                                        1000, 2)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w') as f:
        json.dump({'final_returns': [value, value - 50.0], 'wall_time_s': 1.0,
                   'curve': [], 'task': 'Pendulum-v1', 'method': method,
                   'seed': seed, 'population_size': 2, 'eval_episodes': 1,
                   'budget': {'env_steps': 1000}, 'machine': 'test',
                   'date': '2026-11-26', 'code': 'x'}, f)
  table = learning.report.report(str(out))
  row = next(line for line in table.splitlines()
             if line.startswith('| Pendulum-v1 | 1,000 | 2 | pbt-td3 | 5 | -100 ['))
  # Every PBT seed beats every seeds-td3 seed: P = 1, and so does every
  # resample: the interval is [1, 1].
  # No random-td3 row here: the random-search columns are blank.
  assert row.endswith('| 1.00 [1.00, 1.00] | better |  |  |'), row
  assert learning.suite.baseline_of('pbt-td3') == 'seeds-td3'
  assert learning.suite.baseline_of('pbt-sac') == 'seeds-sac'
  assert learning.suite.baseline_of('dvd') == 'seeds-td3'
  assert learning.suite.baseline_of('random-td3') == 'seeds-td3'
  assert learning.suite.baseline_of('random-ppo') == 'seeds-ppo'
  assert learning.suite.baseline_of('seeds-td3') is None
  assert learning.suite.baseline_of('sb3-td3') is None
  assert learning.suite.control_of('pbt-pb2-ppo') == 'random-ppo'
  assert learning.suite.control_of('hypertrick') == 'random-td3'
  assert learning.suite.control_of('random-td3') is None
  assert learning.suite.control_of('seeds-td3') is None


def _write_runs(out, task, steps, finals, population_size=2):
  for method, values in finals.items():
    for seed, value in enumerate(values):
      path = learning.store.result_path(str(out), task, method, seed, steps,
                                        population_size)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w') as f:
        json.dump({'final_returns': [value] * population_size,
                   'wall_time_s': 1.0, 'curve': [], 'task': task,
                   'method': method, 'seed': seed,
                   'population_size': population_size, 'eval_episodes': 1,
                   'budget': {'env_steps': steps}, 'machine': 'test',
                   'date': '2026-11-29', 'code': 'x'}, f)


def test_report_compares_pbt_with_random_search_and_ours_with_sb3(tmp_path):
  out = tmp_path / 'learning'
  # PBT above every random seed and below every default seed: P(better
  # than random) = 1 and P(better than seeds) = 0 in every resample, so
  # "better" and "worse" at 5 seeds a side; ours above every SB3 seed.
  _write_runs(out, 'Pendulum-v1', 1000, {
      'seeds-td3': [10.0, 11.0, 12.0, 13.0, 14.0],
      'random-td3': [0.0, 1.0, 2.0, 3.0, 4.0],
      'pbt-td3': [5.0, 6.0, 7.0, 8.0, 9.0]})
  _write_runs(out, 'HalfCheetah-v5', 2000, {
      'seeds-ppo-zoo': [5.0, 6.0, 7.0, 8.0, 9.0],
      'sb3-ppo-zoo': [0.0, 1.0, 2.0, 3.0, 4.0]}, population_size=1)
  table = learning.report.report(str(out))
  row = next(line for line in table.splitlines()
             if line.startswith('| Pendulum-v1 | 1,000 | 2 | pbt-td3 | 5 | 7 ['))
  assert row.endswith('| 0.00 [0.00, 0.00] | worse | 1.00 [1.00, 1.00] '
                      '| better |'), row
  parity = next(line for line in table.splitlines()
                if line.startswith('| HalfCheetah-v5 | 2,000 | 1 | '
                                   'seeds-ppo-zoo | sb3-ppo-zoo | 5 | 5 |'))
  assert parity.endswith('| 1.00 [1.00, 1.00] | better |'), parity
  # A population of 4 at the same task and budget is a group of its own:
  # its seeds do not count against the 2-member rows.
  _write_runs(out, 'Pendulum-v1', 1000, {
      'seeds-td3': [100.0] * 5}, population_size=4)
  table = learning.report.report(str(out))
  assert '| Pendulum-v1 | 1,000 | 4 | seeds-td3 | 5 | 100 ' in table
  row = next(line for line in table.splitlines()
             if line.startswith('| Pendulum-v1 | 1,000 | 2 | pbt-td3 | 5 | 7 ['))
  assert row.endswith('| 0.00 [0.00, 0.00] | worse | 1.00 [1.00, 1.00] '
                      '| better |'), row


def test_zoo_methods_take_the_zoo_settings_and_skip_other_tasks():
  flags = learning.suite.zoo_flags('HalfCheetah-v5')
  hparams = flags[flags.index('--hparams') + 1:flags.index('--agent-settings')]
  assert 'discount=0.98' in hparams and 'learning_rate=2.0633e-05' in hparams
  settings = flags[flags.index('--agent-settings') + 1:
                   flags.index('--hidden-sizes')]
  assert {'rollout_length=512', 'epochs=20', 'activation=relu',
          'ortho_init=False', 'normalize_rewards=True'} <= set(settings)
  assert flags[-2:] == ['256', '256']
  assert learning.suite.fits('HalfCheetah-v5', 'seeds-ppo-zoo') is None
  assert 'no rl-zoo PPO settings' in learning.suite.fits(
      'Pendulum-v1', 'sb3-ppo-zoo')


def test_edge_share_counts_values_in_the_outer_tenth_of_their_range():
  defaults = dict(policy_lr=3e-4, critic_lr=3e-4, policy_update_fraction=0.5,
                  exploration_noise=0.15, target_noise=0.2, noise_clip=0.5,
                  discount=0.99, tau=0.005, reward_scale=1.0)
  # In the space's own scales (TD3's default space): policy_lr 3.5e-5 is
  # log(3.5/3) / log(100) = 0.03 of the way up its log range; exploration
  # noise 0.95 is 0.95 of [0, 1]; 1 - 0.9985 = 0.0015 is 0.91 of the way
  # from 0.1 down to 0.001 in log. The rest (and tau, not searched) are
  # inside: 3 of 2 x 7 searched values.
  outer = dict(defaults, policy_lr=3.5e-5, exploration_noise=0.95,
               discount=0.9985)
  run = {'method': 'pbt-pb2-td3', 'hparams': [defaults, outer],
         'command': 'python -m experiments.pbt --explore pb2'}
  assert learning.tables.edge_share(run) == pytest.approx(3 / 14)
  # Runs recorded before the rename carry TD3's old name, policy_delay.
  old = [{('policy_delay' if k == 'policy_update_fraction' else k): v
          for k, v in h.items()} for h in run['hparams']]
  assert learning.tables.edge_share(dict(run,
                                         hparams=old)) == pytest.approx(3 / 14)
  assert learning.tables.edge_share(dict(run, method='seeds-td3')) is None
  # Random search chooses hyperparameters too (by its draws alone).
  assert learning.tables.edge_share(dict(
      run, method='random-td3')) == (pytest.approx(3 / 14))
  assert learning.tables.edge_share(
      dict(run, command=run['command'] + ' --search-space s.json')) is None


def _runs(*finals):
  return [{'final_returns': [value, value - 50.0]} for value in finals]


def test_matrix_gives_each_pbt_variants_verdict_per_task():
  by = {('Pendulum-v1', 20_000, 4): {
      'seeds-td3': _runs(-150.0, -140.0, -160.0, -145.0, -155.0),
      # Every seed above every default seed, then every one below.
      'pbt-td3': _runs(-100.0, -110.0, -90.0, -105.0, -95.0),
      'pbt-pb2-td3': _runs(-200.0, -210.0, -190.0, -205.0, -195.0),
      # -100 beats all 5 default seeds, -300 none: P = 5 / 10.
      'pbt-resample-td3': _runs(-100.0, -300.0),
      # Random search's seeds straddle the variants': other P values than
      # against the default seeds (counted below).
      'random-td3': _runs(-95.0, -100.0, -130.0, -200.0, -300.0)},
        ('Hopper-v5', 50_000, 4): {'pbt-td3': _runs(1.0, 2.0, 3.0),
                                   'pbt-pb2-td3': _runs(4.0)},
        # Not a budget of the matrix: not in it.
        ('HalfCheetah-v5', 100_000, 4): {'seeds-td3': _runs(1.0)},
        # Not its population size (4 members): not in it either.
        ('HalfCheetah-v5', 50_000, 16): {'seeds-td3': _runs(1.0)}}
  lines = learning.matrix.matrix_summary(by)
  split = lines.index('', lines.index('') + 1)  # after the first count
  against_seeds, against_random = _rows(lines[:split]), _rows(lines[split:])
  tasks = ['Pendulum-v1 at 20,000 env steps', 'Hopper-v5 at 50,000 env steps',
           'HalfCheetah-v5 at 50,000 env steps',
           'Walker2d-v5 at 50,000 env steps (held out)',
           'Ant-v5 at 50,000 env steps (held out)']
  assert list(against_seeds) == list(against_random) == tasks
  seeds, pbt, resample, pb2, shared = against_seeds[tasks[0]]
  assert seeds == '5 seeds'
  assert pbt == 'better: P 1.00 [1.00, 1.00], 5 seeds'
  assert pb2 == 'worse: P 0.00 [0.00, 0.00], 5 seeds'
  assert resample.startswith('too few seeds (< 5): P 0.50 [')
  assert resample.endswith(', 2 seeds')
  assert shared == 'not run'
  assert against_seeds[tasks[2]] == ['not run'] * 5
  assert against_seeds[tasks[1]] == ['not run', 'no baseline yet, 3 seeds',
                                     'not run', 'no baseline yet, 1 seed',
                                     'not run']
  random, pbt, resample, pb2, shared = against_random[tasks[0]]
  assert random == '5 seeds'
  # pbt-td3 (-90 to -110) against random search (-95, -100, -130, -200,
  # -300): every seed above the last three; -90 above -95 and -100, -95
  # level with -95 and above -100, -100 level with -100:
  # (15 + 2 + 1.5 + 0.5) / 25 = 0.76.
  assert pbt.startswith('not distinguishable: P 0.76 [')
  # pbt-pb2-td3 (-190 to -210): every seed above -300; -190 and -195
  # above -200, -200 level with it: (5 + 2 + 0.5) / 25 = 0.30.
  assert pb2.startswith('not distinguishable: P 0.30 [')
  # -100: above the last three, level with -100; -300: level with -300:
  # (3.5 + 0.5) / 10.
  assert resample.startswith('too few seeds (< 5): P 0.40 [')
  assert shared == 'not run'
  assert lines[-1] == learning.matrix.power_note()
  assert lines[split - 1] == (
      'A PBT variant better than seeds-td3 on 1 of 5 tasks (Pendulum-v1 at '
      '20,000 env steps); worse on 1 (Pendulum-v1 at 20,000 env steps). '
      'Every method has 5 seeds or more on 0 of 5 tasks.')
  assert lines[-3] == (
      'A PBT variant better than random-td3 (random search from the whole '
      'prior; the variants start near the defaults, a head start it does '
      'not get) on 0 of 5 tasks; worse on 0. Every method has 5 seeds or '
      'more on 0 of 5 tasks.')
  # Only random search's seeds so far: the matrix is there, with them.
  alone = learning.matrix.matrix_summary(
      {('Ant-v5', 50_000, 4): {'random-td3': _runs(1.0)}})
  assert _rows(alone[alone.index('', alone.index('') + 1):])[tasks[4]] == [
      '1 seed', 'not run', 'not run', 'not run', 'not run']
  # A folder with no run of the matrix (another experiment's) has none.
  assert learning.matrix.matrix_summary(
      {('HalfCheetah-v5', 100_000, 4): {'pbt-td3': _runs(1.0)}}) == []


def _rows(lines):
  """``{task: [cells]}`` of the markdown table rows in ``lines``."""
  return {line.split(' | ')[0][2:]: [c.rstrip(' |') for c in
                                     line.split(' | ')[1:]]
          for line in lines if line.startswith('| ') and
          not line.startswith('| task')}


def test_population_summary_compares_each_rule_with_random_search():
  cell = ('gymnax:Acrobot-v1', 1_048_576, 16)
  by = {cell: {
      'seeds-ppo': _runs(-300.0, -310.0, -290.0, -305.0, -295.0),
      # Every seed above the default seeds', none above random search's:
      # against random search P = 0 of 25 pairs, against seeds 25 of 25.
      'random-ppo': _runs(-100.0, -110.0, -90.0, -105.0, -95.0),
      'pbt-prior-ppo': _runs(-200.0, -210.0, -190.0, -205.0, -195.0),
      # Every seed above random search's.
      'pbt-pb2-prior-ppo': _runs(-80.0, -85.0, -75.0, -70.0, -60.0),
      # From near the defaults: a second table, not the goal's.
      'pbt-ppo': _runs(-400.0, -410.0, -390.0, -405.0, -395.0),
      'pbt-pb2-ppo': _runs(-100.0, -110.0, -90.0, -105.0, -95.0),
      # Resampling from the prior: a third table, of the 16-member cells.
      'pbt-resample-prior-ppo': _runs(-80.0, -85.0, -75.0, -70.0, -60.0)},
        ('gymnax:Pendulum-v1', 1_048_576, 16): {
            'seeds-ppo': _runs(-150.0, -140.0),
            'pbt-prior-ppo': _runs(-120.0)},
        # PB2's own setting at another budget: not a cell of the summary.
        ('Hopper-v5', 100_000, 4): {'pbt-prior-ppo': _runs(1.0)}}
  lines = learning.population.population_summary(by)
  split = lines.index('From near the defaults (the library\'s default '
                      'start; not counted toward the goal):')
  third = lines.index(learning.population.RESAMPLE_HEADING)
  rows, near = _rows(lines[:split]), _rows(lines[split:third])
  resample = _rows(lines[third:])
  acrobot = 'gymnax:Acrobot-v1, 16 members, 1,048,576 env steps each'
  larger = ['gymnax:Pendulum-v1, 16 members, 1,048,576 env steps each',
            acrobot, 'gymnax:MountainCarContinuous-v0, 16 members, '
            '1,048,576 env steps each (held out)']
  assert list(rows) == list(near) == larger + [
      'HalfCheetah-v5, 4 members, 1,000,000 env steps each',
      'Hopper-v5, 4 members, 1,000,000 env steps each']
  assert list(resample) == larger
  # Every seed above random search's, and so above the default seeds'.
  assert resample[acrobot][2:] == ['better: P 1.00 [1.00, 1.00], 5 seeds'] * 2
  assert resample[acrobot][:2] == rows[acrobot][:2]
  seeds, random, pbt_r, pbt_s, pb2_r, pb2_s = rows[acrobot]
  # IQM of 5 values: the mean of the middle 3 (scipy's trimmed share 0.25
  # drops one from each end): -300 for the seeds, -100 for random search,
  # (-80 - 75 - 70) / 3 = -75 for PB2.
  assert seeds.startswith('-300 [') and seeds.endswith(', 5 seeds')
  assert random.startswith('-100 [')
  assert pbt_r == 'worse: P 0.00 [0.00, 0.00], 5 seeds'
  assert pbt_s == 'better: P 1.00 [1.00, 1.00], 5 seeds'
  assert pb2_r == 'better: P 1.00 [1.00, 1.00], 5 seeds'
  assert pb2_s == 'better: P 1.00 [1.00, 1.00], 5 seeds'
  # The same controls, against the near-defaults rules: PBT below the
  # seeds (P 0), PB2 level with random search (P 1/2: 12.5 of 25 pairs).
  assert near[acrobot][:2] == [seeds, random]
  assert near[acrobot][3] == 'worse: P 0.00 [0.00, 0.00], 5 seeds'
  assert near[acrobot][4].startswith('not distinguishable: P 0.50')
  pendulum = rows['gymnax:Pendulum-v1, 16 members, 1,048,576 env steps '
                  'each']
  assert pendulum[1] == 'not run'
  assert pendulum[2] == 'nothing to compare with yet, 1 seed'
  assert pendulum[3].startswith('too few seeds (< 5): P 1.00')
  sentences = [line for line in lines[:split] if line.startswith('- ')]
  assert sentences[1] == (
      f'- {acrobot}: pbt-pb2-prior-ppo beats random search (random-ppo); '
      'pbt-prior-ppo against random search: worse (P 0.00 [0.00, 0.00]); '
      'pbt-pb2-prior-ppo against random search: better (P 1.00 [1.00, '
      '1.00]); random search against default seeds: better (P 1.00 [1.00, '
      '1.00]); no rule worse than default seeds; best member at '
      'gymnasium\'s reward threshold (-100) or above: seeds-ppo 0 of 5 '
      'seeds, random-ppo 3 of 5 seeds, pbt-prior-ppo 0 of 5 seeds, '
      'pbt-pb2-prior-ppo 5 of 5 seeds; highest IQM: pbt-pb2-prior-ppo '
      '(-75).')
  assert sentences[0].endswith(
      ': no verdict yet, too few seeds (seeds-ppo 2, random-ppo 0, '
      'pbt-prior-ppo 1, pbt-pb2-prior-ppo 0; 5 an arm needed).')
  assert sentences[3].endswith(': not run yet.')
  near_sentence = next(line for line in lines[split:third]
                       if line.startswith(f'- {acrobot}'))
  assert near_sentence.startswith(f'- {acrobot}: no rule beats random '
                                  'search (random-ppo);')
  assert 'pbt-ppo worse than default seeds' in near_sentence
  assert lines[split - 2] == (
      'Goal (PBT or PB2 from the same prior better than random search on '
      'at least 2 of the 3 16-member tasks, worse than default seeds on '
      f'none): not decided yet. Better on 1 ({acrobot}), worse on 0; every '
      'arm has 5 seeds or more on 1 of 3.')
  # A folder with none of these cells (another experiment's) has none.
  assert learning.population.population_summary(
      {('Hopper-v5', 100_000, 4): {'pbt-ppo': _runs(1.0)}}) == []


def test_resampling_from_the_prior_does_not_count_toward_the_goal():
  """PBT with resampling beats random search on every 16-member task, PBT
  and PB2 on none: its table says so, and the goal is not met."""
  level = _runs(-100.0, -110.0, -90.0, -105.0, -95.0)
  by = {cell[:3]: {'seeds-ppo': level, 'random-ppo': level,
                   'pbt-prior-ppo': level, 'pbt-pb2-prior-ppo': level,
                   'pbt-resample-prior-ppo': _runs(-10.0, -11.0, -9.0,
                                                   -10.5, -9.5)}
        for cell in learning.population.POPULATION_CELLS if cell[2] == 16}
  lines = learning.population.population_summary(by)
  third = lines.index(learning.population.RESAMPLE_HEADING)
  resample = _rows(lines[third:])
  assert len(resample) == 3
  for cells in resample.values():
    assert cells[2:] == ['better: P 1.00 [1.00, 1.00], 5 seeds'] * 2
  goal = next(line for line in lines if line.startswith('Goal'))
  assert ': not met. Better on 0, worse on 0;' in goal, goal


def test_population_goal_is_met_only_with_two_wins_and_no_loss():
  cell = learning.population.GoalCell
  win = cell('a', won=True, lost=False, complete=True, unsolved=False)
  tie = cell('b', won=False, lost=False, complete=True, unsolved=False)
  loss = cell('c', won=True, lost=True, complete=True, unsolved=False)
  goal = learning.population.population_goal
  assert ': met. Better on 2 (a; a), worse on 0;' in goal([win, win, tie])
  assert ': not met. Better on 1 (a), worse on 0;' in goal([win, tie, tie])
  # Two wins, but a rule worse than the default seeds on a third task.
  assert ': not met. Better on 3 (a; a; c), worse on 1 (c);' in goal(
      [win, win, loss])
  # Every count is in, but for one cell's seeds: nothing decided yet.
  assert ': not decided yet. Better on 2' in goal(
      [win, win, tie._replace(complete=False)])
  assert goal([win, win, tie]).endswith(
      'every arm has 5 seeds or more on 3 of 3.')
  # Two wins, one on a task no seed of any arm solves: met, with a but.
  unsolved = cell('d', won=True, lost=False, complete=True, unsolved=True)
  assert (': met, but only by counting a task where no seed of any arm '
          'reaches the reward threshold. Better on 2 (a; d, where no seed '
          'of any arm reaches the reward threshold), worse on 0;'
          ) in goal([win, unsolved, tie])
  assert ': met. Better on 3' in goal([win, win, unsolved])


def test_population_goal_names_a_win_where_no_arm_solves_the_task():
  # MountainCarContinuous: +100 at the goal, minus 0.1 a^2 a step; a
  # policy that never reaches it ends just below 0. PB2's members push
  # less than random search's (every seed above, P = 1), yet none of any
  # arm reaches gymnasium's threshold of 90: the goal line says so.
  by = {('gymnax:MountainCarContinuous-v0', 1_048_576, 16): {
      'seeds-ppo': _runs(-2e-5, -3e-5, -1e-5, -4e-5, -5e-5),
      'random-ppo': _runs(-2e-5, -3e-5, -1e-5, -4e-5, -5e-5),
      'pbt-prior-ppo': _runs(-2e-5, -3e-5, -1e-5, -4e-5, -5e-5),
      'pbt-pb2-prior-ppo': _runs(-2e-6, -3e-6, -1e-6, -4e-6, -5e-6)}}
  lines = learning.population.population_summary(by)
  name = ('gymnax:MountainCarContinuous-v0, 16 members, 1,048,576 env '
          'steps each (held out)')
  row = next(line for line in lines if line.startswith(f'| {name}'))
  # IQM of -2e-5, -3e-5, -4e-5 (the middle 3 of 5): -3e-5, not -0.
  assert row.split(' | ')[1].startswith('-3e-05 [')
  sentence = next(line for line in lines if line.startswith(f'- {name}'))
  assert ("reward threshold (90) or above: seeds-ppo 0 of 5 seeds, "
          "random-ppo 0 of 5 seeds, pbt-prior-ppo 0 of 5 seeds, "
          "pbt-pb2-prior-ppo 0 of 5 seeds; highest IQM: pbt-pb2-prior-ppo "
          "(-3e-06).") in sentence
  goal = next(line for line in lines if line.startswith('Goal'))
  assert goal.startswith(
      'Goal (PBT or PB2 from the same prior better than random search on '
      'at least 2 of the 3 16-member tasks, worse than default seeds on '
      f'none): not decided yet. Better on 1 ({name}, where no seed of any '
      'arm reaches the reward threshold), worse on 0;')


def test_reward_threshold_is_gymnasiums_for_a_port_or_none():
  assert learning.population.reward_threshold(
      'gymnax:MountainCarContinuous-v0') == 90
  assert learning.population.reward_threshold('Hopper-v5') == 3800
  assert learning.population.reward_threshold('gymnax:Pendulum-v1') is None
  assert learning.population.reward_threshold('brax:inverted_pendulum') is None


def _population_arms() -> tuple:
  population = learning.population
  return ((population.POPULATION_BASELINE, population.POPULATION_CONTROL) +
          population.POPULATION_RULES + population.POPULATION_NEAR_RULES +
          population.POPULATION_RESAMPLE_RULES)


def _ours(task: str) -> tuple:
  """The methods of ours (not SB3's, not the synchronous loop) that can
  act in ``task``."""
  return tuple(
      m for m, (module, _) in learning.suite.METHODS.items()
      if module not in ('sb3', 'sync') and learning.suite.fits(task, m) is None)


# The TD3 matrix's smallest task with every method of ours that acts there;
# a 16-member cell on the device and PB2's setting through the actors, at
# their own budgets, with the papers' comparison's arms.
HARNESS_CELLS = (
    ('Pendulum-v1', [], _ours),
    ('gymnax:Acrobot-v1', ['--env-steps', '1048576', '--population-size',
                           '16'], lambda task: _population_arms()),
    ('Hopper-v5', ['--env-steps', '1000000'], lambda task: _population_arms()),
)


@pytest.mark.parametrize('task, flags, methods', HARNESS_CELLS)
def test_every_method_gives_its_rule_a_command_it_accepts(task, flags, methods):
  """Each method of a cell gets a command line (``experiment_argv``) that
  its rule's parser and checks accept, at the cell's budget and size: a
  flag the harness misspells, or a value out of range, fails here in
  seconds rather than minutes into a benchmark run."""
  args = learning.cli.parse_args(flags)
  budget = learning.suite.task_budget(args, task)
  methods = methods(task)
  if task == 'Pendulum-v1':  # every rule of the TD3 matrix is among them
    assert set(learning.matrix.MATRIX_RULES) <= set(methods)
  for method in methods:
    assert learning.suite.fits(task, method) is None, method
    name, argv = learning.runs.experiment_argv(args, task, method, 0,
                                               '/nonexistent/run')
    rule = registry.get(name)
    config = fastpbrl_cli.parse(rule.presets, '', argv, prog=method)
    rule.from_config(config)
    assert (config.env, config.seed,
            config.population_size) == (task, 0, args.population_size), method
    if name == 'cemrl':  # its budget is the population's
      assert config.total_env_steps == budget.env_steps * 4, method
    else:
      assert config.env_steps == budget.env_steps, method


def test_pb2_setting_budget_decides_every_24_ppo_iterations():
  args = learning.cli.parse_args(['--env-steps', '1000000'])
  for name in ('HalfCheetah-v5', 'Hopper-v5'):
    task = learning.suite.task_budget(args, name)
    assert (task.env_steps, task.ready_after, task.eval_every) == (
        1_000_000, 24 * 2048, 24 * 2048)
  # Another task at that budget is scaled as before: Walker2d's 100,000
  # steps x 10.
  assert learning.suite.task_budget(args, 'Walker2d-v5').ready_after == 100_000


def test_power_note_gives_the_threshold_of_five_seeds_a_side():
  # 21 of 25 pairs (tests/benchmarks/test_stats.py); the gap by hand:
  # sqrt(2) * Phi^-1(0.84) = 1.414 * 0.994 = 1.41.
  note = learning.matrix.power_note()
  assert 'from P = 0.84 (21 of the 25 pairs of seeds)' in note
  assert 'a gap of 1.4 standard deviations' in note


def test_runs_on_code_without_a_later_fix_of_their_rule_are_superseded():
  """ef3bee1 changed when PBT decides, a2f8eb2 when HyperTrick restarts,
  69a4018 how PB2 chooses: runs of those rules (of PBT with --explore pb2
  for the last) on older code are superseded; the baseline's runs, and
  PBT's other explores, on the same old code are not (no fix of theirs)."""
  if subprocess.run(['git', 'cat-file', '-e', 'ef3bee1^{commit}'],
                    cwd=learning.store.REPO, capture_output=True).returncode:
    pytest.skip('needs the repository history')
  old, new = 'ca7df4e', 'b86a46a'  # before and after ef3bee1
  superseded_by = learning.store.superseded_by
  assert superseded_by({'method': 'pbt-td3', 'code': old}).startswith(
      'ef3bee1')
  assert superseded_by({'method': 'pbt-td3', 'code': new}) is None
  assert superseded_by({'method': 'pbt-pb2-td3',
                        'code': f'{new}+changes'}).startswith(
                            '69a4018')
  for method in ('pbt-td3', 'pbt-resample-td3', 'pbt-shared-td3'):
    assert superseded_by({'method': method,
                          'code': '590d4b0'}) is None, method
  assert superseded_by({'method': 'pbt-pb2-td3',
                        'code': 'da132cf'}).startswith('69a4018')
  assert superseded_by({'method': 'pbt-pb2-td3',
                        'code': '69a4018'}) is None
  assert superseded_by({'method': 'seeds-td3', 'code': old}) is None
  assert superseded_by({'method': 'hypertrick',
                        'code': 'a60515a'}).startswith('a2f8eb2')
  assert superseded_by({'method': 'hypertrick',
                        'code': '644da36'}) is None
  # A version git cannot place is kept: runs are left out on evidence only.
  assert superseded_by({'method': 'pbt-td3', 'code': 'unknown'}) is None


def test_a_new_run_sets_a_superseded_result_aside(tmp_path, monkeypatch):
  """A run over a result of code without a later fix moves that result to
  ``superseded/`` (the report shows it apart); over a current result it
  does nothing (the new run replaces it)."""
  path = tmp_path / 'runs' / 'Walker2d-v5@50000' / 'pbt-pb2-td3' / 'seed3.json'
  path.parent.mkdir(parents=True)
  old = {'method': 'pbt-pb2-td3', 'code': 'abc1234+changes', 'seed': 3}
  path.write_text(json.dumps(old))
  monkeypatch.setattr(learning.store, 'superseded_by', lambda r: None
                      if r['code'] == 'new' else 'fix: why')
  assert not learning.store.is_current(str(path))  # so the benchmark runs it
  moved = learning.store.set_aside_superseded(str(path))
  assert moved == str(path.parent / 'superseded' / 'seed3@abc1234-changes.json')
  assert not path.exists() and json.loads(open(moved).read()) == old
  path.write_text(json.dumps({**old, 'code': 'new'}))
  assert learning.store.is_current(str(path))
  assert learning.store.set_aside_superseded(
      str(path)) is None and path.exists()
  assert learning.store.set_aside_superseded(str(tmp_path /
                                                 'none.json')) is None


def test_a_row_names_the_gpu_its_learner_ran_on():
  """A row's ``device`` is the GPU its learner ran on, and there is none
  where JAX has only the CPU (CI's case)."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    assert learning.runs.learner_device() is None
  else:
    assert learning.runs.learner_device() == f'{device.device_kind} (learner)'


def test_methods_are_skipped_where_their_agent_cannot_act():
  # TD3 refuses CartPole's discrete actions and SB3 steps no JAX env; a
  # continuous task takes TD3, and its own refusal is what is reported.
  assert learning.suite.fits('Pendulum-v1', 'seeds-td3') is None
  assert 'discrete' in learning.suite.fits('CartPole-v1', 'pbt-td3')
  assert learning.suite.fits('gymnax:CartPole-v1',
                             'sb3-ppo') == ('sb3 steps gymnasium envs only')


def _member_csv(path, rows):
  """A member CSV of ``(evaluation, return, objective)`` rows."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['wall_time', 'env_steps', 'update_steps', 'member',
                     'episode_return', 'episode_length', 'evaluation',
                     'true_objective'])
    for k, (evaluation, ret, objective) in enumerate(rows):
      writer.writerow([k, 100 * k, 100 * k, 0, ret, 200, evaluation,
                       objective])


def test_a_shaped_run_is_scored_on_its_true_objective(tmp_path):
  shaped = str(tmp_path / 'shaped')
  for m, final in enumerate((-120.0, -140.0)):
    _member_csv(os.path.join(shaped, 'members', f'member_00{m}.csv'), [
        (False, -150.0, -200.0), (True, -90.0, -200.0), (True, -80.0, -180.0),
        (True, -60.0, final), (True, -50.0, final)])
  assert learning.runs.scored_field(shaped) == 'true_objective'
  # Two evaluations of two episodes each; the last is (final + final) / 2.
  assert learning.runs.final_scores(shaped, 2,
                                    'true_objective') == [-120.0, -140.0]
  assert learning.runs.final_scores(shaped, 2,
                                    'episode_return') == [-55.0, -55.0]
  # An env that reports no objective (or a CSV from before the column).
  plain = str(tmp_path / 'plain')
  _member_csv(os.path.join(plain, 'members', 'member_000.csv'),
              [(True, -90.0, ''), (True, -80.0, '')])
  assert learning.runs.scored_field(plain) == 'episode_return'
