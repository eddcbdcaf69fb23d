"""``fastpbrl.load_run``: every table against an independent reading of the
raw files (``csv``, ``json``), once on a run folder written by hand whose
every value is worked out in the comments, once on a tiny real PBT run;
``hparam_schedule`` against the hyperparameters each member's slot held
(``hparams.csv``), following the lineage's copies by hand."""

import csv
import json
import math
import os
import re

import pandas as pd
import pytest

import fastpbrl
from fastpbrl.config.errors import ConfigError
from fastpbrl.trained import run_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------
# A run folder written by hand
# ---------------------------------------------------------------------------

EPISODE_HEADER = ('wall_time,env_steps,update_steps,member,episode_return,'
                  'episode_length,evaluation')
# Three members, one hyperparameter ``lr`` (and ``tau``, never searched).
# update step 10 / env step 100: init, lr 1, 2, 3.
# update step 50 / env step 500, simultaneous copies: member 2 copies
#   member 0 (lr 4) while member 0 copies member 1 (lr 5); member 2 takes
#   member 0's weights as they were BEFORE that call (init line, lr 1).
# update step 90 / env step 900: member 1 copies member 2 (lr 6).
LINEAGE = [
    {'event': 'init', 'step': 10, 'env_steps': 100, 'member': m,
     'hparams': {'lr': lr, 'tau': 0.005}} for m, lr in enumerate((1., 2., 3.))
] + [
    {'event': 'exploit', 'step': 50, 'env_steps': 500, 'member': 2,
     'parent': 0, 'old_hparams': {'lr': 3., 'tau': 0.005},
     'new_hparams': {'lr': 4., 'tau': 0.005}, 'fitness': -30.0,
     'parent_fitness': -10.0},
    {'event': 'exploit', 'step': 50, 'env_steps': 500, 'member': 0,
     'parent': 1, 'old_hparams': {'lr': 1., 'tau': 0.005},
     'new_hparams': {'lr': 5., 'tau': 0.005}, 'fitness': None,
     'parent_fitness': -5.0},
    {'event': 'exploit', 'step': 90, 'env_steps': 900, 'member': 1,
     'parent': 2, 'old_hparams': {'lr': 2., 'tau': 0.005},
     'new_hparams': {'lr': 6., 'tau': 0.005}, 'fitness': -20.0,
     'parent_fitness': -1.0, 'reason': 'diverged'},
]
# What each slot held (hparams.csv rows at env steps 100, 500, 900, 1000).
SLOT_LR = {0: (1., 5., 5., 5.), 1: (2., 2., 6., 6.), 2: (3., 4., 4., 4.)}
STEPS = ((100, 10), (500, 50), (900, 90), (1000, 100))


def write_hand_run(folder, finished=True, lineage=True):
  """The run folder above (eval_episodes 2): member ``m``'s evaluations
  at env steps 400 and 800 return ``-100 + 10 m`` +- 1 and
  ``-50 + 20 m`` +- 2 (means -100, -90, -80 then -50, -30, -10); the final
  evaluation at 1000 returns -5, -40 and -20 (both episodes alike)."""
  os.makedirs(os.path.join(folder, 'members'))
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump({'rule': 'pbt', 'env': 'Pendulum-v1', 'population_size': 3,
               'eval_episodes': 2, 'interval_unit': 'env steps per member'},
              f)
  final = (-5.0, -40.0, -20.0)
  for m in range(3):
    lines = [EPISODE_HEADER,
             f'1.5,200,0,{m},{-1000.25 - m},200,False',
             f'2.5,400,30,{m},{-101 + 10 * m},200,True',
             f'2.5,400,30,{m},{-99 + 10 * m},200,True',
             f'3.0,600,50,{m},-800.5,200,False',
             f'4.0,800,80,{m},{-52 + 20 * m},200,True',
             f'4.0,800,80,{m},{-48 + 20 * m},200,True']
    if finished:
      lines += [f'5.0,1000,100,{m},{final[m]},200,True'] * 2
    else:
      lines += [f'5.0,1000,100,{m},-1.0,200,True']  # half an evaluation
    with open(os.path.join(folder, 'members', f'member_{m:03d}.csv'),
              'w') as f:
      f.write('\n'.join(lines) + '\n')
  with open(os.path.join(folder, 'hparams.csv'), 'w') as f:
    f.write('env_steps,update_steps,member,lr,tau\n')
    for k, (env, update) in enumerate(STEPS):
      for m in range(3):
        f.write(f'{env},{update},{m},{SLOT_LR[m][k]},0.005\n')
  with open(os.path.join(folder, 'rule.csv'), 'w') as f:
    f.write('env_steps,update_steps,name,value\n'
            '100,10,exploits,0.0\n'
            '500,50,exploits,2.0\n500,50,best_fitness,-5.0\n'
            '900,90,exploits,3.0\n900,90,best_fitness,-1.0\n')
  if lineage:
    with open(os.path.join(folder, 'lineage.jsonl'), 'w') as f:
      f.writelines(json.dumps(e) + '\n' for e in LINEAGE)
  if finished:
    with open(os.path.join(folder, 'final_returns.json'), 'w') as f:
      json.dump({'env_steps': 1000, 'eval_episodes': 2,
                 'final_returns': list(final)}, f)
  return folder


def test_the_exports():
  assert fastpbrl.load_run is run_data.load_run
  assert fastpbrl.RunData is run_data.RunData
  assert 'load_run' in fastpbrl.__all__ and 'RunData' in fastpbrl.__all__


def test_a_hand_written_run_folder(tmp_path):
  run = fastpbrl.load_run(write_hand_run(str(tmp_path / 'run')))
  assert run.finished and run.population_size == 3
  assert run.config['eval_episodes'] == 2
  assert len(run.episodes) == 3 * 8
  assert run.episodes['evaluation'].sum() == 3 * 6
  assert run.episodes.loc[0, 'episode_return'] == -1000.25
  # Mean of each pair of evaluation episodes, at their env steps.
  assert run.evaluations.values.tolist() == [
      [0, 400, 2.5, -100.], [0, 800, 4.0, -50.], [0, 1000, 5.0, -5.],
      [1, 400, 2.5, -90.], [1, 800, 4.0, -30.], [1, 1000, 5.0, -40.],
      [2, 400, 2.5, -80.], [2, 800, 4.0, -10.], [2, 1000, 5.0, -20.]]
  assert run.final_returns.tolist() == [-5.0, -40.0, -20.0]
  assert run.best_member == 0 == fastpbrl.best_member(run.run_dir)
  assert run.hparams['lr'].tolist() == [
      SLOT_LR[m][k] for k in range(4) for m in range(3)]
  assert run.rule.index.tolist() == [100, 500, 900]
  assert run.rule['exploits'].tolist() == [0., 2., 3.]
  assert run.rule['best_fitness'].tolist()[1:] == [-5., -1.]
  assert math.isnan(run.rule['best_fitness'][100])  # not written yet
  lineage = run.lineage
  assert lineage['event'].tolist() == ['init'] * 3 + ['exploit'] * 3
  assert lineage['member'].tolist() == [0, 1, 2, 2, 0, 1]
  assert lineage['parent'].tolist()[3:] == [0, 1, 2]
  assert lineage['parent'].isna().tolist() == [True] * 3 + [False] * 3
  assert lineage['update_steps'].tolist() == [10] * 3 + [50, 50, 90]
  assert lineage['lr'].tolist() == [1., 2., 3., 4., 5., 6.]
  assert math.isnan(lineage['fitness'][4])  # null in the file
  assert lineage['reason'].tolist()[5] == 'diverged'
  for table in (run.episodes, run.evaluations, run.hparams, run.lineage):
    assert not any(t == object for c, t in table.dtypes.items()
                   if c not in ('event', 'reason')), table.dtypes


def test_the_schedule_follows_copies_worked_out_by_hand(tmp_path):
  run = fastpbrl.load_run(write_hand_run(str(tmp_path / 'run')))

  def lr(member):
    table = run.hparam_schedule(member)
    assert table.index.name == 'env_steps'
    assert list(table.columns) == ['update_steps', 'lr', 'tau']
    return list(zip(table.index, table['update_steps'], table['lr']))

  # 1 copied 2 at 900, which had copied 0 at 500 (0's line BEFORE its own
  # copy of 1 in the same call: its init, lr 1).
  assert lr(1) == [(100, 10, 1.), (500, 50, 4.), (900, 90, 6.)]
  assert lr(0) == [(100, 10, 2.), (500, 50, 5.)]  # copied 1 at 500
  assert lr(2) == [(100, 10, 1.), (500, 50, 4.)]
  assert lr(None) == lr(0)  # the best member


def test_without_a_lineage_a_schedule_is_the_slots_rows(tmp_path):
  run = fastpbrl.load_run(write_hand_run(str(tmp_path / 'run'),
                                         lineage=False))
  assert run.lineage.empty and run.lineage_events == []
  assert 'parent' in run.lineage.columns
  table = run.hparam_schedule(1)  # where slot 1's row changes
  assert table.index.tolist() == [100, 900]
  assert table['lr'].tolist() == [2., 6.]


def test_a_lineage_without_env_steps_takes_them_from_hparams_csv(tmp_path):
  folder = write_hand_run(str(tmp_path / 'run'))
  with open(os.path.join(folder, 'lineage.jsonl'), 'w') as f:
    f.writelines(json.dumps({k: v for k, v in e.items() if k != 'env_steps'})
                 + '\n' for e in LINEAGE)
  run = fastpbrl.load_run(folder)
  assert str(run.lineage['env_steps'].dtype) == 'Int64'
  assert run.hparam_schedule(1).index.tolist() == [100, 500, 900]


def test_a_run_stopped_before_its_final_evaluation(tmp_path):
  run = fastpbrl.load_run(write_hand_run(str(tmp_path / 'run'),
                                         finished=False))
  assert not run.finished and run.final_returns.empty
  # The half evaluation at 1000 is left out; the last ones are -50, -30,
  # -10: member 2's is best.
  assert run.evaluations.groupby('member')['env_steps'].max().tolist() == [
      800] * 3
  assert run.best_member == 2
  assert run.hparam_schedule().equals(run.hparam_schedule(2))


def test_errors_name_the_folder_or_the_member(tmp_path):
  with pytest.raises(ConfigError, match='no folder .*nowhere'):
    fastpbrl.load_run(str(tmp_path / 'nowhere'))
  with pytest.raises(ConfigError, match=r'no config\.json'):
    fastpbrl.load_run(str(tmp_path))
  run = fastpbrl.load_run(write_hand_run(str(tmp_path / 'run')))
  with pytest.raises(ConfigError, match=r'member 3 is out of range'):
    run.hparam_schedule(3)
  bare = str(tmp_path / 'bare')  # started, nothing logged yet
  os.makedirs(bare)
  with open(os.path.join(bare, 'config.json'), 'w') as f:
    json.dump({'rule': 'seeds', 'population_size': 2}, f)
  run = fastpbrl.load_run(bare)
  assert run.best_member is None and run.episodes.empty
  assert run.rule.empty and run.hparams.empty
  with pytest.raises(ConfigError, match='no evaluation yet'):
    run.hparam_schedule()


# ---------------------------------------------------------------------------
# A tiny real PBT run
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def pbt_run(tmp_path_factory):
  # Two members: each decision, the worse copies the better (truncation
  # at 30% of 2 is one member); decisions every 200 env steps.
  run_dir = str(tmp_path_factory.mktemp('run_data') / 'pbt')
  fastpbrl.train('pbt', env='Pendulum-v1', population_size=2,
                 env_steps=1000, warmup_steps=200, ready_after=200,
                 eval_every=200, eval_episodes=2, steps_per_call=10,
                 num_actors=1, hidden_sizes=(16, 16), batch_size=16,
                 replay_capacity=5000, progress=False, run_dir=run_dir)
  return run_dir


def read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def test_tables_match_the_raw_files(pbt_run):
  run = fastpbrl.load_run(pbt_run)
  with open(os.path.join(pbt_run, 'config.json')) as f:
    assert run.config == json.load(f)
  # Episodes: every CSV line, parsed by Python.
  raw = [r for m in range(2) for r in read_csv(
      os.path.join(pbt_run, 'members', f'member_{m:03d}.csv'))]
  # Pendulum reports no true objective: the column is empty, read as NaN.
  assert [r['true_objective'] for r in raw] == [''] * len(raw)
  assert run.episodes['true_objective'].isna().all()
  assert run.episodes.drop(columns='true_objective').to_dict('records') == [
      {'wall_time': float(r['wall_time']), 'env_steps': int(r['env_steps']),
       'update_steps': int(r['update_steps']), 'member': int(r['member']),
       'episode_return': float(r['episode_return']),
       'episode_length': int(r['episode_length']),
       'evaluation': r['evaluation'] == 'True'} for r in raw]
  # Evaluations: consecutive pairs of a member's evaluation episodes.
  expected = []
  for m in range(2):
    evals = [r for r in raw if r['member'] == str(m)
             and r['evaluation'] == 'True']
    assert len(evals) % 2 == 0
    for a, b in zip(evals[::2], evals[1::2]):
      expected.append((m, int(b['env_steps']), (float(a['episode_return'])
                                                + float(b['episode_return'])) / 2))
  got = run.evaluations
  assert list(zip(got['member'], got['env_steps'])) == [
      (m, steps) for m, steps, _ in expected]
  assert got['mean_return'].tolist() == pytest.approx(
      [mean for _, _, mean in expected], rel=1e-12)
  # The last evaluation of each member is its final one.
  with open(os.path.join(pbt_run, 'final_returns.json')) as f:
    final = json.load(f)['final_returns']
  assert run.final_returns.tolist() == final
  last = run.evaluations.groupby('member')['mean_return'].last()
  assert last.tolist() == pytest.approx(final, rel=1e-9)
  assert run.best_member == fastpbrl.best_member(pbt_run)
  # hparams.csv, exactly (repr of floats reads back to the same floats).
  raw_hparams = read_csv(os.path.join(pbt_run, 'hparams.csv'))
  assert run.hparams.to_dict('records') == [
      {k: int(v) if k in ('env_steps', 'update_steps', 'member') else float(v)
       for k, v in r.items()} for r in raw_hparams]
  # Lineage: each event's fields and the hyperparameters it set.
  with open(os.path.join(pbt_run, 'lineage.jsonl')) as f:
    events = [json.loads(line) for line in f]
  assert len(run.lineage) == len(events)
  for row, e in zip(run.lineage.to_dict('records'), events):
    assert (row['event'], row['member'], row['update_steps'],
            row['env_steps']) == (e['event'], e['member'], e['step'],
                                  e['env_steps'])
    for name, value in e.get('new_hparams', e.get('hparams')).items():
      assert row[name] == value
    if e['event'] == 'exploit':
      assert row['parent'] == e['parent']
      fitness = math.nan if e['fitness'] is None else e['fitness']
      assert row['fitness'] == pytest.approx(fitness, nan_ok=True)
  # rule.csv: every value at its env steps.
  for r in read_csv(os.path.join(pbt_run, 'rule.csv')):
    assert run.rule.loc[int(r['env_steps']), r['name']] == float(r['value'])
  assert str(run.rule.index.dtype) == 'int64'


def owner(events, member, env_steps):
  """Whose slot held the weights that became ``member``'s final ones at
  ``env_steps``: back through the copies, latest first (a copy at ``t``
  reads its parent as it was before ``t``)."""
  copies = [e for e in events if e['event'] == 'exploit']
  current, before = member, math.inf
  while True:
    own = [e for e in copies if e['member'] == current
           and e['env_steps'] < before]
    if not own or own[-1]['env_steps'] <= env_steps:
      return current
    current, before = own[-1]['parent'], own[-1]['env_steps']


def test_schedules_are_the_hparams_each_ancestor_held(pbt_run):
  run = fastpbrl.load_run(pbt_run)
  events = run.lineage_events
  exploits = [e for e in events if e['event'] == 'exploit']
  assert exploits, 'PBT never exploited: raise env_steps in the fixture'
  rows = read_csv(os.path.join(pbt_run, 'hparams.csv'))
  names = [k for k in rows[0] if k not in ('env_steps', 'update_steps',
                                           'member')]
  for member in range(2):
    schedule = run.hparam_schedule(member)
    assert list(schedule.columns) == ['update_steps', *names]
    assert schedule.index.is_monotonic_increasing
    for r in rows:  # hparams.csv starts at the lineage's init events
      at = int(r['env_steps'])
      if int(r['member']) != owner(events, member, at):
        continue
      in_force = schedule[schedule.index <= at].iloc[-1]
      assert [in_force[n] for n in names] == [float(r[n]) for n in names]
  # The last member replaced: its parent's schedule before the copy, its
  # own new hyperparameters from it on.
  e = exploits[-1]
  schedule, parent = run.hparam_schedule(e['member']), run.hparam_schedule(
      e['parent'])
  before = schedule[schedule.index < e['env_steps']]
  assert before.equals(parent[parent.index < e['env_steps']])
  after = schedule[schedule.index >= e['env_steps']]
  assert len(after) == 1 and after.index[0] == e['env_steps']
  assert after.iloc[0][list(e['new_hparams'])].to_dict() == e['new_hparams']


def test_the_getting_started_example_runs(pbt_run, capsys):
  with open(os.path.join(ROOT, 'docs', 'getting-started.md')) as f:
    page = f.read()
  section = page[page.index("### Reading a run's results"):]
  code = re.search(r'```python\n(.*?)```', section, re.DOTALL).group(1)
  code = re.sub(r"'runs/[^']*'", repr(pbt_run), code)
  exec(compile(code, 'getting-started.md', 'exec'), {})  # noqa: S102
  assert 'final_return' in capsys.readouterr().out
  assert isinstance(fastpbrl.load_run(pbt_run).episodes, pd.DataFrame)
