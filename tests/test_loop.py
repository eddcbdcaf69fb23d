"""The loop's side of a rule decision (``fastpbrl.run.loop.apply``): episodes
that started under weights a decision replaced leave the rule's
observations, counted from the version the new weights go out as; marks
record the version now acted with; logs and events reach their files and
the callbacks."""

import json

import numpy as np
import pytest

from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.devices.distributed import Processes
from fastpbrl.rules.base import Decision, Rule
from fastpbrl.run import loop as loop_lib
from fastpbrl.run.callbacks import Loop, StopAtReturn, TimeLimit


class Pipeline:
  """Version 6 written; the last call's parameters still with the
  publisher thread: they land as version 7 once waited for."""

  policy_version = 6
  restarted = None

  def wait_published(self, timeout=None):
    self.policy_version = 7
    return True

  def restart_members(self, members):
    self.restarted = list(members)


def _parts(tmp_path):
  rule_run = loop_lib.RuleRun(Rule(RunConfig(population_size=3)), None, 3,
                              str(tmp_path))
  return loop_lib.Parts(rule_run, None, Pipeline(), Processes(None, 3), None,
                        None, None, None, None)


def _loop(episodes):
  return Loop(config=RunConfig(population_size=3), run_dir='', agent=None,
              learner=None, state=None, hparams=None,
              member_update_steps=np.zeros(3, np.int64),
              episodes=[EpisodeRecord(m, 0.0, 1, True, 0, v,
                                      start_policy_version=v)
                        for m, v in episodes])


def test_renewed_members_drop_episodes_started_under_their_old_weights(
    tmp_path):
  parts = _parts(tmp_path)
  loop = _loop([(0, 0), (1, 0)])
  assert len(parts.rule_run.observation(loop).episodes) == 2
  loop_lib.apply(parts, loop, Decision(renewed=np.array([False, True, False]),
                                       mark=np.array([True, False, False])))
  # Member 1's new weights go out as version 8, after the pending version 7
  # of its old weights: episodes started under 7 or older are dropped.
  assert loop.policy_version == 7
  loop = _loop([(0, 5), (1, 7), (1, 8)])
  observation = parts.rule_run.observation(loop)
  assert [(e['member'], e['start_policy_version'])
          for e in observation.episodes] == [(0, 5), (1, 8)]
  assert observation.marked_at.tolist() == [7, 0, 0]
  assert len(loop.episodes) == 3  # the callbacks and logs see every one


def test_restarts_logs_and_events(tmp_path):
  parts = _parts(tmp_path)
  loop = _loop([])
  event = {'event': 'x', 'step': 1, 'env_steps': 2}
  loop_lib.apply(parts, loop, Decision(
      restart=np.array([True, False, True]), events=(event,),
      logs=(('a.jsonl', {'b': 1, 'a': 2}), ('c.csv', {'x': 1, 'y': 0.5}),
            ('c.csv', {'x': 2, 'y': 1.5}))))
  assert parts.data.restarted == [0, 2]
  assert parts.rule_run.take_events() == [event]
  assert parts.rule_run.take_events() == []
  with open(tmp_path / 'a.jsonl') as f:
    assert [json.loads(line) for line in f] == [{'a': 2, 'b': 1}]
  assert (tmp_path / 'c.csv').read_text() == 'x,y\n1,0.5\n2,1.5\n'


def _evaluations(loop, pairs):
  loop.episodes = [EpisodeRecord(m, r, 1, True, 0, 0) for m, r in pairs]
  loop.episodes.append(EpisodeRecord(0, 1e9, 1, False, 0, 0))  # training


def test_stop_at_return_needs_one_whole_evaluation_above_it():
  loop = _loop([])
  loop.config = RunConfig(population_size=3, eval_episodes=3)
  stop = StopAtReturn(-100.0)
  _evaluations(loop, [(1, -90.0), (1, -95.0)])  # 2 of member 1's 3 episodes
  stop.after_call(loop)
  assert loop.stop_reason is None
  _evaluations(loop, [(2, -50.0), (1, -130.0)])  # member 1: mean -105
  stop.after_call(loop)
  assert loop.stop_reason is None
  # Member 1's last 3: -95, -130, -80 -> -101.7; then -130, -80, -60 -> -90.
  _evaluations(loop, [(1, -80.0)])
  stop.after_call(loop)
  assert loop.stop_reason is None
  _evaluations(loop, [(1, -60.0)])
  stop.after_call(loop)
  assert loop.stop_reason == ('member 1 reached a mean evaluation return of '
                              '-90.0 >= -100')
  loop.stop('later')  # the first reason stays
  assert loop.stop_reason.startswith('member 1')


def test_time_limit_counts_from_the_first_call():
  now = [100.0]
  limit = TimeLimit(5, clock=lambda: now[0])
  loop = _loop([])
  limit.after_call(loop)  # the first call starts the clock
  now[0] = 104.9
  limit.after_call(loop)
  assert loop.stop_reason is None
  now[0] = 105.0
  limit.after_call(loop)
  assert loop.stop_reason == 'the time limit of 5 s was reached'
  with pytest.raises(ValueError, match='seconds > 0'):
    TimeLimit(0)


class _Tracker:
  """A tracker that keeps what it is given."""

  def __init__(self):
    self.logged = []

  def scalars(self, values, step):
    self.logged.append((dict(values), step))

  def close(self):
    pass


def test_read_back_logs_each_members_learner_scalars(tmp_path):
  from fastpbrl.logs.logging import RunLogger
  parts = _parts(tmp_path)
  parts.logger = RunLogger(str(tmp_path), 3, total_env_steps=30,
                           progress=False, track='none')
  tracker = _Tracker()
  parts.logger._trackers = [tracker]
  loop = Loop(config=RunConfig(population_size=3), run_dir=str(tmp_path),
              agent=None, learner=None, state=None, hparams=None)
  # [N, steps] losses, a [N] flag, and one metric of no member (shared).
  metrics = {'critic_loss': np.array([[1.0, 3.0], [5.0, 7.0], [0.0, 0.0]]),
             'finite': np.array([True, True, True]),
             'shared_loss': np.array([2.0, 4.0, 6.0, 8.0])}
  done = loop_lib.Finished(10, metrics, 400, {'rule/x': 1.0})
  loop_lib.read_back(parts, loop, loop_lib.Divergence(3), done)
  parts.logger.close()
  (values, step), = tracker.logged
  assert step == 400
  assert values['learner/critic_loss'] == 8 / 3  # the population's mean
  assert [values[f'member_{i:03d}/learner/critic_loss'] for i in range(3)] == [
      2.0, 6.0, 0.0]  # each member's mean over its steps
  assert values['member_001/learner/finite'] == 1.0
  assert values['learner/shared_loss'] == 5.0
  assert not any('shared_loss' in k and k.startswith('member_')
                 for k in values)
  assert values['rule/x'] == 1.0
