"""Tiny TD3 populations shared by the population-rule tests."""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import pytest

from fastpbrl import agents
from fastpbrl.agents import td3
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import Transition, make_env_spec, random_transitions
from fastpbrl.learner.population import population_hparams


@functools.lru_cache(maxsize=None)
def pendulum_spec():
  env = gym.make('Pendulum-v1')
  try:
    return make_env_spec(env)
  finally:
    env.close()


@functools.lru_cache(maxsize=None)
def tiny_td3(batch_size: int = 4, steps_per_call: int = 2):
  config = td3.TD3Config(hidden_sizes=(8, 8), batch_size=batch_size,
                         steps_per_call=steps_per_call)
  return td3.make_agent(pendulum_spec(), config)


def distinct_population(agent, n: int, seed: int = 0):
  """A TD3 population whose members differ on EVERY leaf (keys included):
  fresh init, then member ``i``'s leaves shifted by ``i`` (optimizer counts
  and step counters too), so that a copy is visible on any leaf."""
  hparams = population_hparams(agent, n)
  state = jax.jit(jax.vmap(agent.init))(
      jax.random.split(jax.random.PRNGKey(seed), n), hparams)
  offsets = jnp.arange(n)

  def shift(x):
    if x.dtype == jnp.uint32:  # keys already differ per member
      return x
    return x + offsets.reshape((n,) + (1,) * (x.ndim - 1)).astype(x.dtype) * (
        1 if jnp.issubdtype(x.dtype, jnp.integer) else 0.5)

  return jax.tree.map(shift, state), hparams


def random_batch(spec, leading: tuple, seed: int = 0) -> Transition:
  """Random transitions with no episode ends."""
  return random_transitions(spec, leading, seed, terminated_fraction=0.0,
                            truncated_fraction=0.0)


@pytest.fixture(scope='session')
def td3_agent():
  return tiny_td3()


@pytest.fixture(scope='session')
def td3_population(td3_agent):
  """``(state, hparams)``: 10 distinct tiny TD3 members, hyperparameters
  drawn from the TD3 prior (one compilation for the whole session)."""
  n = 10
  state, hparams = distinct_population(td3_agent, n)
  hparams = ss.sample(jax.random.PRNGKey(1),
                      agents.get('td3').default_search_space, hparams, n)
  return state, hparams
