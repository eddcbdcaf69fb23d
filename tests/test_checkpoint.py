"""Checkpoints: a whole population round-trips exactly; a half-written one
is never picked up; an empty directory is a clear error."""

import os

import chex
import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.checkpoint import Checkpointer
from fastpbrl.learner import PopulationLearner, population_hparams
from fastpbrl.types import make_env_spec


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
  assert meta == {'counters': {'calls': 7}}
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
  os.makedirs(os.path.join(ckpt.directory, '2.orbax-checkpoint-tmp-123'))
  assert Checkpointer(str(tmp_path)).latest_step() == 1
