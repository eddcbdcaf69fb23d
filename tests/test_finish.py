"""The end of a run: ``RunResult``'s best member and throughput, and the
lines ``summary.txt`` adds under the member table, from a run folder built
by hand."""

import os
from types import SimpleNamespace

import numpy as np

from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.logs.logging import RunLogger
from fastpbrl.rules.base import RuleOutputs
from fastpbrl.run import finish


class _Rule:
  space = None  # Rule.space: a rule that draws from no search space

  def hparam_rows(self, hparams):
    return [{'policy_lr': 1e-3, 'tau': 0.005}, {'policy_lr': 3e-4,
                                                'tau': 0.005}]

  def scalars(self, state):
    return {}

  def summary(self, state, run_dir):
    return None

  @classmethod
  def outputs(cls):
    return RuleOutputs()


def _run(tmp_path):
  """Two members, 1000 env steps each in 50 calls of 10 updates; member 1
  evaluates at -40 then -10, member 0 at -30."""
  run_dir = str(tmp_path)
  logger = RunLogger(run_dir, 2, total_env_steps=2000, progress=False,
                     track='none', wall_time_offset=40.0)
  logger.episodes([EpisodeRecord(m, r, 10, True, 500, 1, 1)
                   for m, r in ((0, -30.0), (1, -40.0), (1, -10.0))],
                  env_steps=500, update_steps=250)
  logger.close()
  loop = SimpleNamespace(
      config=RunConfig(population_size=2, eval_episodes=1), env_steps=1000,
      update_steps=500, calls=50, hparams=None, diverged=0,
      member_update_steps=np.array([500, 300]))
  return run_dir, logger, loop


def test_result_names_the_best_final_member_and_the_throughput(tmp_path):
  run_dir, logger, loop = _run(tmp_path)
  outcome = finish.result(loop, _Rule(), None, logger, run_dir, [-25.0, -5.0])
  assert outcome.best_member == 1
  # 2 x 1000 env steps over the wall time (40 s before a resume, and more).
  assert 0 < outcome.env_steps_per_second <= 2000 / 40
  assert outcome.env_steps_per_second == 2000 / outcome.wall_time


def test_summary_has_the_best_member_steps_wall_time_and_throughput(tmp_path):
  run_dir, _, loop = _run(tmp_path)
  outcome = finish.RunResult(
      run_dir=run_dir, best_return=-10.0, env_steps=1000, update_steps=500,
      calls=50, hparams=_Rule().hparam_rows(None), wall_time=125.0,
      final_returns=[-25.0, -5.0], best_member=1, env_steps_per_second=16.0)
  finish.summarize(loop, _Rule(), None, run_dir, outcome)
  with open(os.path.join(run_dir, 'summary.txt')) as f:
    lines = f.read().splitlines()
  assert lines[0].split()[:4] == ['member', 'episodes', 'eval_last',
                                  'eval_best']  # the member table stays
  assert lines[2].split()[:4] == ['1', '2', '-10.0', '-10.0']
  assert lines[3:] == [
      'best member: 1 (final evaluation -5.0, best evaluation -10.0) '
      '{"policy_lr": 0.0003, "tau": 0.005}',
      'env steps: 1000 per member (least over members), 2000 in all',
      'update steps: 500 per member in 50 learner calls; kept by each: '
      '[500, 300]',
      'last checkpoint: checkpoints/50 (learner call 50, 1000 env steps per '
      'member)',
      'wall time: 125.0 s (0:02:05)',
      "env steps per second: 16.0 (the population's, over the wall time)"]
  assert os.path.exists(os.path.join(run_dir, 'returns.png'))


def test_summary_without_a_final_evaluation_takes_the_best_evaluation(
    tmp_path):
  run_dir, _, _ = _run(tmp_path)
  outcome = finish.RunResult(
      run_dir=run_dir, best_return=-10.0, env_steps=1000, update_steps=500,
      calls=50, hparams=[{}, {}], wall_time=1.0)
  text = finish.totals(outcome, 2)
  assert text.splitlines()[0] == 'best member: 1 (best evaluation -10.0)'
  assert 'kept by each' not in text
