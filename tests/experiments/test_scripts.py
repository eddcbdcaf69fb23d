"""Each experiment script end to end at a tiny budget: logs, checkpoints,
plot, summary; and a killed PBT run resumed from its checkpoint."""

import json
import logging
import os

import numpy as np
import pytest

from experiments import cemrl, dvd, hypertrick, pbt, seeds
from fastpbrl.logs.logging import read_member_csvs, read_rule_csv
from fastpbrl.rules import pbt as pbt_lib

TINY = ['--env', 'Pendulum-v1', '--env-steps', '1200', '--warmup-steps', '200',
        '--hidden-sizes', '16', '16', '--batch-size', '16',
        '--steps-per-call', '10', '--eval-every', '200', '--num-actors', '1',
        '--replay-capacity', '5000', '--checkpoint-every', '200',
        '--eval-episodes', '1',
        '--no-progress']

pytestmark = pytest.mark.slow


def _assert_run_outputs(run_dir, population_size):
  members = read_member_csvs(run_dir)
  assert len(members) == population_size
  for rows in members:
    assert any(r['evaluation'] == 'True' for r in rows), 'no evaluation episode'
    assert all(np.isfinite(float(r['episode_return'])) for r in rows)
  assert os.listdir(os.path.join(run_dir, 'tensorboard'))
  assert os.path.getsize(os.path.join(run_dir, 'returns.png')) > 1000
  assert os.path.exists(os.path.join(run_dir, 'summary.txt'))
  assert os.listdir(os.path.join(run_dir, 'checkpoints'))


def test_pbt_runs_exploits_and_resumes_with_its_perturbed_hparams(tmp_path):
  run_dir = str(tmp_path / 'pbt')
  first = pbt.main(TINY + ['--population-size', '4', '--ready-after', '200',
                           '--fraction', '0.5', '--run-dir', run_dir])
  _assert_run_outputs(run_dir, 4)
  events = pbt_lib.read_lineage(os.path.join(run_dir, 'lineage.jsonl'))
  inits = [e for e in events if e['event'] == 'init']
  exploits = [e for e in events if e['event'] == 'exploit']
  assert len(inits) == 4 and exploits, 'PBT never exploited'
  # The lineage's newest hyperparameters of each member are its final ones.
  latest = {e['member']: e['hparams'] for e in inits}
  latest.update({e['member']: e['new_hparams'] for e in exploits})
  # Exact: the lineage's JSON holds each float32 value's repr, which reads
  # back to the same number as the result's float() of that float32.
  for member, values in latest.items():
    for name, value in values.items():
      assert first.hparams[member][name] == value

  # What a run killed after its last checkpoint leaves behind: log lines
  # the resumed run redoes. They must be cut, not kept twice.
  with open(os.path.join(run_dir, 'lineage.jsonl'), 'a') as f:
    f.write('{"event": "exploit", "member": 0, "step": 123456789}\n')
  with open(os.path.join(run_dir, 'members', 'member_000.csv'), 'a') as f:
    f.write('1.0,123456789,123456789,0,-1.0,200,False\n')
  # Resume: no further exploit (no source can beat a member by 1e9), so
  # the hyperparameters must stay exactly those the first run ended with.
  second = pbt.main(['--resume', run_dir, '--env-steps', '1600',
                     '--min-gap-absolute', '1e9', '--no-progress'])
  assert second.calls > first.calls
  with open(os.path.join(run_dir, 'lineage.jsonl')) as f:
    assert "123456789" not in f.read()
  with open(os.path.join(run_dir, 'members', 'member_000.csv')) as f:
    assert "123456789" not in f.read()
  # The budget counts the steps before the checkpoint: the resumed run
  # collects the missing 400 per member (plus a re-warm), not 1600 more.
  assert 1600 <= second.env_steps < 1600 + 200
  for rows in read_member_csvs(run_dir):
    steps = [int(r['env_steps']) for r in rows if r['evaluation'] == 'False']
    assert steps == sorted(steps) and steps[-1] < 1600 + 200
    assert len(steps) <= 9  # 200-step Pendulum episodes in ~1600 steps
  assert second.update_steps == second.calls * 10
  # Exact: the checkpoint restores the float32 arrays bit for bit.
  for before, after in zip(first.hparams, second.hparams):
    assert before == after
  # Exact too: an unchanged value is a copy of the init event's float32;
  # an explore step moves it by a factor 0.8 or 1.2 (or resamples it).
  initial = [{k: v for k, v in e['hparams'].items()} for e in inits]
  assert any(before != init
             for before, init in zip(second.hparams, initial))
  with open(os.path.join(run_dir, 'config.json')) as f:
    assert json.load(f)['population_size'] == 4


def test_pbt_rerun_of_one_members_schedule(tmp_path):
  run_dir = str(tmp_path / 'pbt')
  pbt.main(TINY + ['--population-size', '2', '--ready-after', '200',
                   '--fraction', '0.5', '--run-dir', run_dir])
  steps = pbt_lib.schedule(os.path.join(run_dir, 'lineage.jsonl'), 1)
  rerun = pbt.main(TINY + ['--rerun-lineage',
                           os.path.join(run_dir, 'lineage.jsonl'),
                           '--rerun-member', '1',
                           '--run-dir', str(tmp_path / 'rerun')])
  final = steps[-1][1]
  # Exact: the lineage's repr of a float32 value rounds back to that float32.
  for name, value in final.items():
    assert rerun.hparams[0][name] == value


def test_dvd_script(tmp_path):
  run_dir = str(tmp_path / 'dvd')
  result = dvd.main(TINY + ['--population-size', '3', '--bandit-every', '200',
                            '--embedding-states', '8', '--run-dir', run_dir])
  _assert_run_outputs(run_dir, 3)
  assert all(np.isfinite(r['diversity_weight']) for r in result.hparams)
  # rule.csv holds the rule's scalars over the run; its last row is the
  # result's, at the run's final env steps.
  curves = read_rule_csv(run_dir)
  assert set(curves) == set(result.rule_scalars)
  for name, value in result.rule_scalars.items():
    steps, last = curves[name][-1]
    # Exact: the csv module writes a float's repr, which reads back exactly.
    assert last == value
    assert steps == result.env_steps
  distances = [v for _, v in curves['mean_pairwise_action_distance']]
  assert len(distances) >= 2 and all(d >= 0 for d in distances)
  assert [s for s, _ in curves['diversity_weight']] == sorted(
      s for s, _ in curves['diversity_weight'])


def test_cemrl_script(tmp_path):
  run_dir = str(tmp_path / 'cemrl')
  # --total-env-steps is the population's budget: 2 x 1200 per member (TINY).
  cemrl.main(TINY + ['--population-size', '2', '--total-env-steps', '2400',
                     '--run-dir', run_dir])
  with open(os.path.join(run_dir, 'mean_policy.csv')) as f:
    rows = [r.split(',') for r in f.read().splitlines()]
  assert rows[0] == ['generation', 'total_env_steps', 'actor_steps',
                     'mean_policy_return']
  assert len(rows) >= 2, 'no CEM generation finished'
  assert np.isfinite(float(rows[-1][-1]))
  # Algorithm 1: no RL in generation 1; then each RL actor trains as many
  # steps as the previous generation's fitness episodes took (2 x 200 on
  # Pendulum).
  assert [int(r[2]) for r in rows[1:]] == [0] + [400] * (len(rows) - 2)


def test_hypertrick_script(tmp_path):
  run_dir = str(tmp_path / 'ht')
  hypertrick.main(TINY + ['--population-size', '2', '--num-workers', '4',
                          '--num-phases', '2', '--phase-env-steps', '200',
                          '--run-dir', run_dir])
  with open(os.path.join(run_dir, 'summary.txt')) as f:
    text = f.read()
  assert 'HyperTrick:' in text and 'best: configuration' in text


def test_seeds_run_without_an_eval_boundary_or_warmup_catch_up(tmp_path):
  """Two properties checked on one run (each end-to-end run costs the suite
  time). (1) The budget (1200) holds no --eval-every boundary: the final
  evaluation still scores every member, and the summary holds no NaN.
  (2) ``--no-warmup-counts-as-data``: updates start at zero when the
  200-step warm-up ends, one per env step after it (TD3's and SB3's
  loops), where the default grants 200 at once on the random-action data
  (without the flag this run fails the upper bound below: 1120 updates at
  1216 env steps)."""
  run_dir = str(tmp_path / 'seeds')
  argv = [a if a != '200' or i != TINY.index('--eval-every') + 1 else '100000'
          for i, a in enumerate(TINY)]
  result = seeds.main(argv + ['--population-size', '2', '--eval-episodes', '2',
                              '--no-warmup-counts-as-data',
                              '--run-dir', run_dir])
  assert result.env_steps >= 1200
  assert result.update_steps == result.calls * 10
  # The limiter grants at most (least env steps - warm-up) updates. It
  # holds actors back to 72 env steps ((prefetch depth 2 + 2) calls of 10
  # plus a 32-step chunk) past what its grants call for, and its grants
  # run up to 3 calls ahead of the calls done (prefetched, in flight), so
  # the learner ends at most 72 + 30 steps behind the warm-up's end.
  assert result.update_steps <= result.env_steps - 200
  assert result.update_steps >= result.env_steps - 200 - 72 - 30
  _assert_run_outputs(run_dir, 2)
  assert len(result.final_returns) == 2
  assert all(np.isfinite(r) for r in result.final_returns)
  for member, rows in enumerate(read_member_csvs(run_dir)):
    evals = [r for r in rows if r['evaluation'] == 'True']
    assert len(evals) == 2  # one evaluation of 2 episodes, at the end
    assert all(int(r['env_steps']) == result.env_steps for r in evals)
    mean = np.mean([float(r['episode_return']) for r in evals])
    # Exact: the same two float64 returns (written as their repr), summed
    # and halved in the same order on both sides.
    assert mean == result.final_returns[member]
  with open(os.path.join(run_dir, 'summary.txt')) as f:
    assert 'nan' not in f.read()


class _Lines(logging.Handler):
  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


@pytest.mark.parametrize('rule', ['pbt', 'hypertrick', 'cemrl'])
def test_rules_run_with_the_replay_on_the_device(tmp_path, rule):
  """--replay-location device: PBT copying replay data on exploits,
  HyperTrick's restarts emptying rings through the staging area, CEM-RL's
  shared ring; each run ends with its outputs, and says where the replay
  lives."""
  run_dir = str(tmp_path / rule)
  argv = TINY + ['--replay-location', 'device', '--run-dir', run_dir]
  lines = _Lines()  # fastpbrl's logger does not propagate to pytest's
  logging.getLogger('fastpbrl').addHandler(lines)
  try:
    _run_rule_with_device_replay(rule, argv, run_dir)
  finally:
    logging.getLogger('fastpbrl').removeHandler(lines)
  _assert_run_outputs(run_dir, 4 if rule == 'pbt' else 2)
  assert any(line.startswith('replay on the device (requested with '
                             '--replay-location device)')
             for line in lines.lines), lines.lines[:20]


def _run_rule_with_device_replay(rule, argv, run_dir):
  if rule == 'pbt':
    pbt.main(argv + ['--population-size', '4', '--ready-after', '200',
                     '--fraction', '0.5', '--copy-replay'])
    with open(os.path.join(run_dir, 'lineage.jsonl')) as f:
      assert any(json.loads(line)['event'] == 'exploit' for line in f)
  elif rule == 'hypertrick':
    hypertrick.main(argv + ['--population-size', '2', '--num-workers', '4',
                            '--num-phases', '2', '--phase-env-steps',
                            '200'])
  else:
    cemrl.main(argv + ['--population-size', '2', '--total-env-steps',
                       '2400'])
