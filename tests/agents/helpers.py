"""Shared test helpers: small env specs, random batches, a per-member loop."""

from __future__ import annotations

import functools

import chex
import gymnasium as gym
import jax
import numpy as np
from acme import specs

from fastpbrl.learner.population import PopulationLearner
from fastpbrl.core.types import make_env_spec
from fastpbrl.core.types import random_transitions as random_batch  # noqa: F401
from tests import numerics


@functools.lru_cache(maxsize=None)
def env_spec(env_id: str) -> specs.EnvironmentSpec:
  env = gym.make(env_id)
  try:
    return make_env_spec(env)
  finally:
    env.close()


def member(tree, i: int):
  return jax.tree.map(lambda x: x[i], tree)


def assert_population_matches_loop(agent, hparams, num_steps: int,
                                   batch_size: int, seed: int = 0):
  """One vectorized call vs N members each stepped alone, step by step.

  The loop uses the single-member ``jit(agent.update)`` (no vmap, no scan) on
  the same batches and the same member keys the population was built with.
  Both routes run in float64 and agree to ``numerics.TRAJECTORY``: in
  float32 Adam can turn a rounding-level gradient difference into a
  parameter difference of ``2 lr`` per step (``tests/numerics.py``). The
  population and metrics returned are float64.
  """
  n = hparams[0].shape[0]
  batch = random_batch(agent.env_spec, (n, num_steps, batch_size), seed=seed)
  learner = PopulationLearner(agent, num_steps)
  key = jax.random.PRNGKey(seed)
  member_keys = jax.random.split(key, n)
  with numerics.float64():
    hparams, batch = numerics.as_float64((hparams, batch))
    population = numerics.as_float64(learner.init(key, hparams))
    # Copy before the call: the learner donates the state it is given.
    initial = jax.tree.map(np.array, population)
    population, metrics = learner.update(population, hparams, batch)

    single_update = jax.jit(agent.update)
    for i in range(n):
      state = numerics.as_float64(agent.init(member_keys[i],
                                             member(hparams, i)))
      # Initial parameters: a few float32 operations per entry (a
      # truncated normal), vectorized against not (rule 1).
      chex.assert_trees_all_close(state, member(initial, i),
                                  rtol=numerics.rounding_rtol(16),
                                  atol=numerics.rounding_rtol(16))
      # The loop starts where the population did: a float32 rounding
      # difference at the start would otherwise run through every step.
      state = member(initial, i)
      member_metrics = []
      for s in range(num_steps):
        state, m = single_update(state, member(hparams, i),
                                 jax.tree.map(lambda x: x[i, s], batch))
        member_metrics.append(m)
      chex.assert_trees_all_close(state, member(population, i),
                                  **numerics.TRAJECTORY)
      for name, values in metrics.items():
        if name == 'finite':  # the learner's own per-member flag
          assert bool(values[i]) == all(
              np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(
                  (state, member_metrics)) if np.issubdtype(
                      np.asarray(x).dtype, np.inexact)), f'member {i}'
          continue
        np.testing.assert_allclose(
            values[i], np.stack([m[name] for m in member_metrics]),
            err_msg=f'metric {name} of member {i}', **numerics.TRAJECTORY)
  return learner, population, metrics
