"""The population evaluator against a plain per-member episode loop."""

import functools

import gymnasium as gym
import jax
import numpy as np

from fastpbrl import agents
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.evaluation import evaluate_population, evaluation_seeds
from fastpbrl.learner import PopulationLearner, population_hparams
from fastpbrl.types import make_env_spec, scale_action


def test_lockstep_evaluation_equals_one_episode_at_a_time():
  env_fn = functools.partial(gym.make, 'Pendulum-v1', max_episode_steps=30)
  spec = make_env_spec(env_fn())
  agent = agents.make_agent('td3', spec, TD3Config(hidden_sizes=(8,)))
  n, k = 3, 2
  hparams = population_hparams(agent, n)
  state = PopulationLearner(agent).init(jax.random.PRNGKey(0), hparams)
  params = state.policy
  returns, lengths = evaluate_population(agent, env_fn, params, hparams, k,
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
                                 jax.random.PRNGKey(0), agent.default_hparams(),
                                 False))[0]
        obs, r, term, trunc, _ = env.step(scale_action(a, spec.actions))
        total += float(r)
        done = term or trunc
      np.testing.assert_allclose(returns[m, e], total, rtol=1e-5)
  # Members differ (different weights), seeds differ per member and episode.
  assert len({round(float(r), 3) for r in returns.ravel()}) == n * k
