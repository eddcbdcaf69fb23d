"""The declared data path (``fastpbrl.datapath.factory``): both paths implement
``DataPath`` (each method with the protocol's parameters, and
``isinstance`` of built ones), ``datapath.create`` picks the path from the
env kind, ``random_states`` is DvD's probe-state algorithm (checked against
an independent copy of it on gymnasium's Pendulum-v1) and ``evaluate``
gives ``[N, episodes]`` on either path."""

import contextlib
import inspect

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.config.derived import resolved
from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import make_env_spec
from fastpbrl.datapath import factory as datapath
from fastpbrl.datapath import protocol
from fastpbrl.datapath.actor_replay import Pipeline
from fastpbrl.datapath.device_replay import DevicePipeline
from fastpbrl.learner.population import PopulationLearner, population_hparams

PROTOCOL_NAMES = sorted(
    {n for n in vars(protocol.DataPath) if not n.startswith('_')}
    | set(protocol.DataPath.__annotations__))


@pytest.mark.parametrize('cls', [Pipeline, DevicePipeline])
def test_both_paths_have_every_method_with_the_protocols_parameters(cls):
  for name in PROTOCOL_NAMES:
    declared = getattr(protocol.DataPath, name, None)
    if name in protocol.DataPath.__annotations__:
      continue  # an attribute set in __init__: checked on instances below
    assert hasattr(cls, name), f'{cls.__name__} lacks {name}'
    if inspect.isfunction(declared):
      want = list(inspect.signature(declared).parameters)
      got = list(inspect.signature(getattr(cls, name)).parameters)
      assert got == want, (cls.__name__, name)


def probe_states_of_dvd(env_id, num_states, seed):
  """The algorithm of ``rules/dvd.py``'s ``_probe_states``, with
  ``gym.make``, written out again."""
  rng = np.random.default_rng(seed)
  env = gym.make(env_id)
  states = []
  obs, _ = env.reset(seed=seed)
  space = env.action_space
  while len(states) < num_states:
    states.append(np.asarray(obs, np.float32))
    obs, _, terminated, truncated, _ = env.step(
        rng.uniform(space.low, space.high).astype(space.dtype))
    if terminated or truncated:
      obs, _ = env.reset(seed=int(rng.integers(2**31)))
  env.close()
  return np.stack(states)


def small_run(env, env_spec, n=2):
  config = resolved(RunConfig(
      env=env, agent='td3', population_size=n, warmup_steps=20, num_actors=1,
      replay_capacity=1000, eval_every=10**6, eval_episodes=1,
      env_steps=1000, hidden_sizes=(16,), batch_size=8, steps_per_call=5,
      replay_location='host'))
  agent = agents.make_agent('td3', env_spec, agents.get('td3').config(
      hidden_sizes=(16,), batch_size=8, steps_per_call=5))
  learner = PopulationLearner(agent)
  hparams = population_hparams(agent, n)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  return config, agent, learner, state, hparams


def test_actor_path_random_states_and_evaluate():
  config, agent, learner, state, hparams = small_run(
      'Pendulum-v1', make_env_spec(gym.make('Pendulum-v1')))
  with contextlib.closing(datapath.create(config, agent, learner,
                                          shared_replay=False)) as data:
    assert isinstance(data, Pipeline)
    assert isinstance(data, protocol.DataPath)
  # Both need no actor: they work on a closed path.
  states = data.random_states(250, seed=3)  # past a 200-step time limit
  assert states.shape == (250, 3) and states.dtype == np.float32
  np.testing.assert_array_equal(states, data.random_states(250, seed=3))
  np.testing.assert_array_equal(states, probe_states_of_dvd('Pendulum-v1',
                                                            250, 3))
  assert not np.array_equal(states, data.random_states(250, seed=4))
  returns, lengths, _ = data.evaluate(learner.policy_params(state), hparams,
                                   episodes=2, seed=0)
  assert returns.shape == lengths.shape == (2, 2)
  assert (lengths == 200).all()


def test_device_path_random_states_and_evaluate():
  pytest.importorskip('gymnax')
  from fastpbrl.envs import jax_envs  # noqa: PLC0415
  env = 'gymnax:Pendulum-v1'
  config, agent, learner, state, hparams = small_run(
      env, jax_envs.make(env).env_spec)
  with contextlib.closing(datapath.create(config, agent, learner,
                                          shared_replay=False)) as data:
    assert isinstance(data, DevicePipeline)
    assert isinstance(data, protocol.DataPath)
    states = data.random_states(250, seed=3)
    assert states.shape == (250, 3) and states.dtype == np.float32
    np.testing.assert_array_equal(states, data.random_states(250, seed=3))
    assert not np.array_equal(states, data.random_states(250, seed=4))
    # cos, sin of the angle; a new episode after the 200-step limit.
    np.testing.assert_allclose(states[:, 0]**2 + states[:, 1]**2, 1,
                               atol=1e-5)
    assert np.abs(np.diff(states[:, 2])).max() > 0
  returns, lengths, _ = data.evaluate(learner.policy_params(state), hparams,
                                   episodes=2, seed=0)
  assert returns.shape == lengths.shape == (2, 2)
  assert (np.asarray(lengths) == 200).all()
