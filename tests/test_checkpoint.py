"""Checkpoints: a whole population round-trips exactly; a half-written one
is never picked up; an empty directory is a clear error."""

import collections
import dataclasses
import os
import shutil
import types

import chex
import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import make_replay, transition_fields
from fastpbrl.run import resume
from fastpbrl.run.checkpoint import CheckpointError, Checkpointer


@pytest.fixture(scope='module')
def population():
  agent = td3.make_agent(make_env_spec(gym.make('Pendulum-v1')),
                         td3.TD3Config(hidden_sizes=(8,)))
  hparams = population_hparams(agent, 3, policy_lr=[1e-4, 3e-4, 1e-3])
  learner = PopulationLearner(agent)
  return learner, hparams


def test_state_hparams_and_meta_round_trip_exactly(tmp_path, population):
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  other = learner.init(jax.random.PRNGKey(1), hparams)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(7, state, {'hparams': hparams}, {'counters': {'calls': 7}})
  # The template only gives shapes: values come from disk.
  got_state, got_extra, meta = ckpt.restore(other, {'hparams': hparams})
  chex.assert_trees_all_equal(got_state, jax.device_get(state))
  chex.assert_trees_all_equal(got_extra['hparams'], jax.device_get(hparams))
  assert meta == {'counters': {'calls': 7}, 'has_replay': False,
                  'has_data_path': False}
  assert ckpt.latest_step() == 7


def test_unfinished_save_is_ignored_and_empty_dir_is_an_error(tmp_path,
                                                              population):
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  ckpt = Checkpointer(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='nothing to resume'):
    ckpt.restore(state, {'hparams': hparams})
  ckpt.save(1, state, {'hparams': hparams}, {})
  # What a run killed mid-save leaves: orbax's temporary directory.
  tmp = os.path.join(ckpt.directory, '2.orbax-checkpoint-tmp-123')
  os.makedirs(os.path.join(tmp, 'state'))
  reopened = Checkpointer(str(tmp_path))
  assert reopened.latest_step() == 1
  # ... and the next run that opens the folder removes it.
  assert not os.path.exists(tmp)
  assert os.listdir(ckpt.directory) == ['1']


def test_replay_round_trips_with_the_checkpoint(tmp_path, population):
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  replay = make_replay('per_member', transition_fields(
      learner.agent.env_spec), 3, capacity=100)
  rng = np.random.default_rng(0)
  chunk = {k: rng.normal(size=(3, 30, *shape)).astype(dtype)
           for k, (shape, dtype) in replay.fields.items()}
  replay.insert([0, 1, 2], chunk)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(4, state, {'hparams': hparams}, {'replay_rows': 30},
            replay=replay.state_dict())
  meta = ckpt.restore_meta()
  assert meta['has_replay'] and meta['replay_rows'] == 30
  _, _, meta = ckpt.restore(state, {'hparams': hparams},
                            replay_template=replay.state_template(30))
  chex.assert_trees_all_equal(meta['replay'], replay.state_dict())


def filled_replay(learner, members, rows, seed):
  replay = make_replay('per_member', transition_fields(
      learner.agent.env_spec), members, capacity=100)
  rng = np.random.default_rng(seed)
  chunk = {k: rng.normal(size=(members, rows, *shape)).astype(dtype)
           for k, (shape, dtype) in replay.fields.items()}
  replay.insert(list(range(members)), chunk)
  return replay


def test_a_process_replay_goes_to_its_own_file_with_its_members(
    tmp_path, population):
  """Over several processes (``replay_members`` given) the replay goes to
  this process's file, not into orbax's checkpoint; it reads back exactly
  for the same members, and is refused for others. Files of checkpoints
  orbax no longer keeps, or whose save never completed, are removed."""
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  ckpt = Checkpointer(str(tmp_path), max_to_keep=2)
  files = ckpt.replay_files
  # A save killed between this process's file and orbax's rename.
  stale = files.path(9)
  os.makedirs(os.path.dirname(stale))
  open(stale + '.partial', 'wb').close()
  replays = {}
  for step in (1, 2, 3):
    replays[step] = filled_replay(learner, 2, 10 * step, step).state_dict()
    ckpt.save(step, state, {'hparams': hparams}, {},
              replay=replays[step], replay_members=slice(2, 4))
  meta = ckpt.restore_meta()
  assert meta['has_replay'] and meta['replay_processes'] == 1
  assert not os.path.exists(os.path.join(ckpt.directory, '3', 'replay'))
  assert sorted(os.listdir(files.root)) == ['2', '3']
  for step in (2, 3):
    chex.assert_trees_all_equal(
        ckpt.restore_process_replay(slice(2, 4), step), replays[step])
  assert ckpt.replay_files.nbytes(3) > 0
  with pytest.raises(ValueError, match='holds members 2-3, this process '
                     'runs 0-1'):
    ckpt.restore_process_replay(slice(0, 2))


def test_a_resume_takes_the_replay_only_from_the_split_that_saved_it(
    tmp_path, population):
  """Each process reads its own file back; a resume over another number
  of processes than saved the replay (files or orbax's), or with other
  members in this process, is one ConfigError naming the way out."""
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  ckpt = Checkpointer(str(tmp_path))
  saved = filled_replay(learner, 2, 5, 0).state_dict()
  ckpt.save(1, state, {'hparams': hparams}, {}, replay=saved,
            replay_members=slice(0, 2))
  config = types.SimpleNamespace(resume=str(tmp_path))
  one = types.SimpleNamespace(count=1, local=slice(0, 2))
  chex.assert_trees_all_equal(resume.restore_process_replay(
      ckpt, config, ckpt.restore_meta(), one), saved)
  # Saved in the orbax checkpoint, by one process: orbax restores it.
  assert resume.restore_process_replay(
      ckpt, config, {'has_replay': True}, one) is None
  two = types.SimpleNamespace(count=2, local=slice(0, 2))
  for meta, processes, message in (
      ({'replay_processes': 2}, one, 'saved by 2 processes and this run '
       'has 1; resume over 2'),
      ({'has_replay': True}, two, 'saved by 1 process and this run has 2'),
      (ckpt.restore_meta(), types.SimpleNamespace(count=1, local=slice(1, 3)),
       'holds members 0-1, this process runs 1-2')):
    with pytest.raises(ConfigError, match=message) as error:
      resume.restore_process_replay(ckpt, config, meta, processes)
    assert '--no-checkpoint-replay' in str(error.value)


def test_a_save_that_would_not_fit_is_refused_before_writing(
    tmp_path, population, monkeypatch):
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.check_space()  # nothing to compare with yet
  ckpt.save(1, state, {'hparams': hparams}, {})
  ckpt.check_space()  # plenty of space here
  usage = shutil.disk_usage(ckpt.directory)
  monkeypatch.setattr(shutil, 'disk_usage',
                      lambda path: usage._replace(free=4096))
  with pytest.raises(CheckpointError, match=r'No space left on device\); '
                     r'the checkpoint of call 1 is intact'):
    ckpt.check_space()


def test_each_process_cuts_its_own_logs_back(tmp_path):
  """A checkpoint keeps every process's log sizes (process p writes its
  own copies); a resume cuts each process's files to its own. A checkpoint
  that kept only process 0's leaves the others' files as they are."""
  meta = {'log_sizes': {'hparams.csv': 3},
          'process_log_sizes': [{'hparams.csv': 3}, {'hparams.csv': 5}]}
  assert resume.own_log_sizes(meta, 0) == {'hparams.csv': 3}
  assert resume.own_log_sizes(meta, 1) == {'hparams.csv': 5}
  old = {'log_sizes': {'hparams.csv': 3}}
  assert resume.own_log_sizes(old, 0) == {'hparams.csv': 3}
  assert resume.own_log_sizes(old, 1) == {}
  path = tmp_path / 'hparams.csv'
  path.write_text('a\nbcdefg\n')
  resume.truncate_logs(str(tmp_path), resume.own_log_sizes(meta, 1))
  assert path.read_text() == 'a\nbcd'


def test_a_checkpoint_from_before_td3s_rename_is_one_clear_line(tmp_path,
                                                                population):
  learner, hparams = population
  state = learner.init(jax.random.PRNGKey(0), hparams)
  old_fields = tuple('policy_delay' if f == 'policy_update_fraction' else f
                     for f in hparams._fields)
  old = collections.namedtuple('TD3HParams', old_fields)(*hparams)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(3, state, {'hparams': old, 'rule': ()},
            {'rule_format': resume.RULE_FORMAT, 'counters': {'calls': 3}})
  config = RunConfig(agent='td3', resume=str(tmp_path))
  rule = types.SimpleNamespace(name='seeds', state_version=1)
  fresh = resume.Restored(state, hparams, (), resume.FRESH_COUNTERS, None)
  with pytest.raises(ConfigError) as info:
    resume.restore(ckpt, config, rule, None, learner, fresh, None)
  message = str(info.value)
  assert '\n' not in message
  assert message.startswith(f'--resume {str(tmp_path)!r}: its checkpoint was '
                            'written before hyperparameter policy_delay was '
                            'renamed')


def test_a_resume_carries_what_the_loops_env_steps_earned():
  """The update steps a checkpoint had not taken, carried into the resumed
  run: those its loop's env steps earned (the budget it counts on from),
  not those of the members' own counts, which the actors had run ahead
  of it, or the resumed run would end past one never stopped."""
  counters = {'calls': 12, 'env_steps': 400, 'update_steps': 350,
              'member_env_steps': [432, 464]}
  config = RunConfig(env='Pendulum-v1', population_size=2, warmup_steps=100,
                     update_to_data_ratio=0.5)
  # 400 env steps earn 200 update steps at ratio 0.5 (the warm-up's
  # counted as data); 350 taken are 700 env steps' worth: nothing owed.
  np.testing.assert_array_equal(
      resume.carried_env_steps(config, counters), [0.0, 0.0])
  counters['update_steps'] = 150  # 300 env steps' worth: 100 carried
  np.testing.assert_array_equal(
      resume.carried_env_steps(config, counters), [100.0, 100.0])
  # Without the warm-up's steps as data, its 100 earn nothing.
  config = dataclasses.replace(config, warmup_counts_as_data=False)
  np.testing.assert_array_equal(
      resume.carried_env_steps(config, counters), [0.0, 0.0])
  counters['update_steps'] = 100  # 200 env steps' worth, of 300 counted
  np.testing.assert_array_equal(
      resume.carried_env_steps(config, counters), [100.0, 100.0])
