"""SAC: population vs per-member loop, the tanh-Gaussian log-density, the
temperature, termination vs truncation in the soft target."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import sac
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import numerics
from tests.agents.helpers import assert_population_matches_loop, env_spec, random_batch

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SMALL = sac.SACConfig(hidden_sizes=(32, 32), batch_size=16, steps_per_call=50)


@pytest.fixture(scope='module')
def agent():
  return sac.make_agent(env_spec('Hopper-v5'), SMALL)


def test_population_call_matches_per_member_loop(agent):
  hparams = population_hparams(
      agent, 3, policy_lr=[1e-4, 3e-4, 1e-3], alpha_lr=[3e-4, 3e-3, 1e-4],
      target_entropy_scale=[1.0, 0.2, 2.0], reward_scale=[1.0, 5.0, 0.1])
  _, population, metrics = assert_population_matches_loop(
      agent, hparams, num_steps=50, batch_size=16)
  # Different target entropies drive the temperatures apart.
  alphas = np.exp(np.asarray(population.log_alpha))
  # Rounded to 1e-6: far below how far apart 50 Adam steps of 1e-4 to 3e-3
  # on log alpha, towards three different targets, set them (> 1e-3).
  assert len(set(np.round(alphas, 6))) == 3
  chex.assert_shape(metrics['alpha'], (3, 50))


def test_tanh_gaussian_log_density_matches_change_of_variables():
  # In float64: arctanh amplifies the action's last-bit rounding by
  # 1 / (1 - a^2), which float32 would turn into ~1e-4 of the log-density.
  with numerics.float64():
    mean = jnp.array([[0.3, -1.2], [2.0, 0.0]], jnp.float64)
    log_std = jnp.array([[-0.5, 0.2], [0.1, -1.0]], jnp.float64)
    action, logp = sac.sample_tanh_gaussian(mean, log_std,
                                            jax.random.PRNGKey(0))
  action = np.asarray(action)
  u = np.arctanh(np.clip(action, -1 + 1e-12, 1 - 1e-12))
  std = np.exp(np.asarray(log_std))
  normal_logp = (-0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std)
                 - 0.5 * np.log(2 * np.pi))
  expected = np.sum(normal_logp - np.log(1 - np.tanh(u) ** 2), axis=-1)
  # Rule 1 in float64: ~30 roundings a side on terms up to ~15 |logp| (the
  # sums cancel), and the action's last-bit rounding, which arctanh grows by
  # 1 / (1 - a^2) (7.6e2 at a = 0.9993 here) and logp's slope (<= 5) carries
  # on: within 64 eps / (1 - a^2); a wrong or missing term is off by O(1).
  amplification = np.max(1 / (1 - action ** 2))
  np.testing.assert_allclose(
      logp, expected,
      rtol=numerics.rounding_rtol(64, np.float64) * amplification)


def test_temperature_moves_towards_target_entropy(agent):
  """A too-high target entropy raises alpha; a too-low one lowers it."""
  learner = PopulationLearner(agent, num_steps=20)
  hparams = population_hparams(agent, 2, target_entropy_scale=[-20.0, 20.0],
                               alpha_lr=1e-2)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  batch = random_batch(agent.env_spec, (2, 20, 16))
  state, metrics = learner.update(state, hparams, batch)
  # Scale -20: target entropy +60 nats, far above the policy's: alpha grows.
  assert metrics['alpha'][0, -1] > 1.0 > metrics['alpha'][1, -1]


def test_act_shapes_and_bounds(agent):
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  obs = jnp.zeros((4, 11), jnp.float32)
  for explore in (False, True):
    action = agent.act(state.policy, obs, jax.random.PRNGKey(1),
                       agent.default_hparams(), explore)
    chex.assert_shape(action, (4, 3))
    assert np.all(np.abs(action) <= 1.0)
