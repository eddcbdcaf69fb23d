"""The population evaluator against a plain per-member episode loop."""

import functools

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.core.types import make_env_spec, scale_action
from fastpbrl.datapath.evaluation import evaluate_population, evaluation_seeds
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric


def test_lockstep_evaluation_equals_one_episode_at_a_time():
  env_fn = functools.partial(gym.make, 'Pendulum-v1', max_episode_steps=30)
  spec = make_env_spec(env_fn())
  agent = agents.make_agent('td3', spec, TD3Config(hidden_sizes=(8,)))
  n, k = 3, 2
  hparams = population_hparams(agent, n)
  state = PopulationLearner(agent).init(jax.random.PRNGKey(0), hparams)
  # The policies in float64: the two routes' actions then agree to ~1e-14.
  with numerics.float64():
    params, hparams = numerics.as_float64((state.policy, hparams))
    returns, lengths, _ = evaluate_population(agent, env_fn, params, hparams, k,
                                           seed=7)
    assert returns.shape == lengths.shape == (n, k)
    np.testing.assert_array_equal(lengths, 30)
    for m in range(n):
      p = jax.tree.map(lambda x: x[m], params)
      for e, seed in enumerate(evaluation_seeds(7, m, k)):
        env = env_fn()
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
          a = np.asarray(agent.act(p, obs[None].astype(np.float32),
                                   jax.random.PRNGKey(0),
                                   agent.default_hparams(), False))[0]
          obs, r, term, trunc, _ = env.step(scale_action(a, spec.actions))
          total += float(r)
          done = term or trunc
        # Actions within 64 float64 roundings of sums of size <= 16 (2e-13,
        # rule 1); Pendulum's returns move by less than the actions' relative
        # change (one float32 ulp of every action moves them by < 1e-7), so
        # 1e-9 leaves 10^3 to spare; another member or seed is off by > 1e-3.
        np.testing.assert_allclose(returns[m, e], total, rtol=1e-9)
  # Members differ (different weights), seeds differ per member and episode:
  # these returns lie > 5 apart, far beyond the 1e-3 they are rounded to.
  assert len({round(float(r), 3) for r in returns.ravel()}) == n * k


def test_scale_action_is_the_clipped_affine_map():
  """``scale_action`` clips by two ufuncs: the values of ``np.clip`` then
  the affine map, bit for bit, NaN and signed zero included, in the
  action's float type."""
  spec = make_env_spec(gym.make('Pendulum-v1')).actions  # [-2, 2]
  values = np.array([[-3.0], [-1.0], [-0.0], [0.3], [1.0], [7.5], [np.nan]])
  for dtype in (np.float32, np.float64):
    a = values.astype(dtype)
    got = scale_action(a, spec)
    want = spec.minimum + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (
        spec.maximum - spec.minimum)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
