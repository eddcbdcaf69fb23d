"""update_from_replay (sampling inside the compiled call) against update on
the batch that ``fastpbrl.replay.device.sample`` draws with the same key.

The two are different programs (XLA fuses the sampling into one), so their
3 Adam steps compare in float64, to ``numerics.TRAJECTORY``
(``tests/numerics.py``, rule 2); the replay holds float32 transitions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.core.types import random_transitions
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)
from fastpbrl.replay import device, transition_fields
from fastpbrl.replay.device import DeviceReplay
from tests import numerics
from tests.agents.helpers import env_spec

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

STEPS, BATCH, N = 3, 8, 3
SMALL = td3.TD3Config(hidden_sizes=(16, 16), batch_size=BATCH,
                      steps_per_call=STEPS)


@pytest.fixture(scope='module')
def agent():
  return td3.make_agent(env_spec('HalfCheetah-v5'), SMALL)


def filled_replay(agent, layout, sizes):
  replay = DeviceReplay(layout, transition_fields(agent.env_spec), N, 32)
  for m, s in enumerate(sizes):
    if s:
      data = random_transitions(agent.env_spec, (1, s), seed=m)
      replay.insert([m], data._asdict())
  return replay.flush()


copy = lambda s: jax.tree.map(jnp.copy, s)  # the learners donate the state


def test_update_from_replay_equals_update_on_the_same_sample(agent):
  learner = PopulationLearner(agent)
  assert (learner.num_steps, learner.batch_size) == (STEPS, BATCH)
  replay = filled_replay(agent, 'per_member', [20, 5, 0])
  active = np.array([True, True, False])  # member 2: empty and inactive
  key = jax.random.PRNGKey(7)
  batch = device.sample(replay, key, STEPS, BATCH, ~active)
  with numerics.float64():
    hparams = numerics.as_float64(
        population_hparams(agent, N, discount=[0.99, 0.9, 0.95]))
    start = numerics.as_float64(learner.init(jax.random.PRNGKey(0), hparams))
    expected, expected_metrics = learner.update(copy(start), hparams, batch,
                                                active)
    got, metrics = learner.update_from_replay(copy(start), hparams, replay,
                                              key, active)
    chex.assert_trees_all_close(got, expected, **numerics.TRAJECTORY)
    chex.assert_trees_all_close(metrics, expected_metrics,
                                **numerics.TRAJECTORY)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[2], got),
                                jax.tree.map(lambda x: x[2], start))
    # The replay state is not donated: it is still usable.
    assert np.asarray(replay.size).tolist() == [20, 5, 0]
    compiled = learner.compilations
    for seed in range(3):  # new keys, masks and states: no new trace
      got, _ = learner.update_from_replay(got, hparams, replay,
                                          jax.random.PRNGKey(seed),
                                          np.array([True, seed > 0, False]))
  assert learner.compilations == compiled == 2  # update + update_from_replay


def test_update_from_replay_checks_its_arguments(agent):
  learner = PopulationLearner(agent)
  hparams = population_hparams(agent, N)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  replay = filled_replay(agent, 'per_member', [4, 4, 4])
  with pytest.raises(ValueError, match=r'active must be \[3\]'):
    learner.update_from_replay(state, hparams, replay, jax.random.PRNGKey(0),
                               np.ones(2, bool))
  with pytest.raises(ValueError, match='DeviceReplayState'):
    learner.update_from_replay(state, hparams, {'data': 1},
                               jax.random.PRNGKey(0))
  small = DeviceReplay('per_member', transition_fields(agent.env_spec), 2,
                       8).flush()
  with pytest.raises(ValueError, match='2 member rings but hparams 3'):
    learner.update_from_replay(state, hparams, small, jax.random.PRNGKey(0))


def test_shared_critic_update_from_replay_equals_update(agent):
  learner = SharedCriticLearner(agent.shared_critic, STEPS, BATCH)
  replay = filled_replay(agent, 'shared', [6, 9, 3])
  key = jax.random.PRNGKey(11)
  batch = device.sample(replay, key, STEPS, BATCH, num_members=N)
  with numerics.float64():
    hparams = numerics.as_float64(population_hparams(agent, N))
    start = numerics.as_float64(learner.init(jax.random.PRNGKey(0), hparams))
    expected, expected_metrics = learner.update(copy(start), hparams, batch)
    got, metrics = learner.update_from_replay(copy(start), hparams, replay,
                                              key)
    chex.assert_trees_all_close(got, expected, **numerics.TRAJECTORY)
    chex.assert_trees_all_close(metrics, expected_metrics,
                                **numerics.TRAJECTORY)
    learner.update_from_replay(got, hparams, replay, jax.random.PRNGKey(1))
  assert learner.compilations == 2
  with pytest.raises(ValueError, match='batch_size'):
    SharedCriticLearner(agent.shared_critic, STEPS).update_from_replay(
        start, hparams, replay, key)
