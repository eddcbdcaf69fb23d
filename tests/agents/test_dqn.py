"""DQN: population vs per-member loop (MLP and Nature CNN), the Huber TD loss
by hand with termination vs truncation, target refreshes, grouped conv."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from acme import specs

from fastpbrl.agents import dqn
from fastpbrl.agents import networks as nets_lib
from fastpbrl.learner.population import population_hparams
from tests import numerics
from tests.agents.helpers import assert_population_matches_loop, env_spec, random_batch

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

MLP = dqn.DQNConfig(mlp_hidden_sizes=(32, 32), batch_size=16, steps_per_call=50)
ATARI_SPEC = specs.EnvironmentSpec(
    observations=specs.Array((84, 84, 4), np.uint8),
    actions=specs.DiscreteArray(6),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0))


@pytest.fixture(scope='module')
def agent():
  return dqn.make_agent(env_spec('CartPole-v1'), MLP)


def test_population_call_matches_per_member_loop(agent):
  hparams = population_hparams(agent, 3, lr=[1e-4, 1e-3, 3e-4],
                               discount=[0.99, 0.9, 0.95],
                               target_update_period=[7, 10, 50])
  _, population, metrics = assert_population_matches_loop(
      agent, hparams, num_steps=50, batch_size=16)
  np.testing.assert_array_equal(np.sum(metrics['target_refreshed'], axis=1),
                                [7, 5, 1])


def test_nature_cnn_population_matches_per_member_loop():
  agent = dqn.make_agent(ATARI_SPEC, dqn.DQNConfig(batch_size=4))
  hparams = population_hparams(agent, 2, lr=[2.5e-4, 1e-3])
  # Two steps (the second starts from the first's update): XLA:CPU runs
  # these float64 convolutions at seconds a step; the MLP test above runs
  # the 50-step trajectory.
  _, population, _ = assert_population_matches_loop(
      agent, hparams, num_steps=2, batch_size=4)
  chex.assert_type(population.step, jnp.int32)


def test_vmapped_conv_is_one_grouped_convolution():
  """vmap over members' kernels lowers to a single grouped convolution
  (feature_group_count = N), which is what a hand-written grouped conv is."""
  net = nets_lib.nature_q_network(6)
  n = 4
  params = jax.vmap(lambda k: net.init(k, jnp.zeros((1, 84, 84, 4), jnp.uint8)))(
      jax.random.split(jax.random.PRNGKey(0), n))
  frames = jnp.zeros((n, 2, 84, 84, 4), jnp.uint8)
  hlo = jax.jit(jax.vmap(net.apply)).lower(params, frames).as_text()
  assert hlo.count('feature_group_count = 4') == 3  # the three conv layers


def test_huber_target_bootstraps_on_truncation_only(agent):
  hp = agent.default_hparams()._replace(discount=jnp.float32(0.5))
  state = agent.init(jax.random.PRNGKey(1), hp)
  net = nets_lib.mlp_q_network(2, MLP.mlp_hidden_sizes)
  base = random_batch(agent.env_spec, (2,), seed=3)
  batch = base._replace(reward=np.array([1.0, 4.0], np.float32),
                        truncated=np.array([1.0, 0.0], np.float32),
                        terminated=np.array([0.0, 1.0], np.float32))
  q = np.asarray(net.apply(state.params, batch.observation))
  next_q = np.asarray(net.apply(state.target_params, batch.next_observation))
  target = np.array([1.0 + 0.5 * next_q[0].max(), 4.0])
  err = q[np.arange(2), batch.action] - target
  huber = np.where(np.abs(err) <= 1, 0.5 * err ** 2, np.abs(err) - 0.5)
  _, metrics = jax.jit(agent.update)(state, hp, batch)
  # Rule 1: the MLP (5 + 33 + 33 terms), the target, Huber and the mean:
  # <= 100 roundings; err does not cancel (rewards 1 and 4, |Q| < 1).
  np.testing.assert_allclose(metrics['loss'], huber.mean(),
                             rtol=numerics.rounding_rtol(100))


def _greedy(agent, params, obs):
  hp = agent.default_hparams()._replace(eval_epsilon=jnp.float32(0.0))
  return agent.act(params, obs, jax.random.PRNGKey(7), hp, False)


def test_epsilon_greedy(agent):
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  obs = jnp.asarray(np.random.default_rng(0).standard_normal((2000, 4)),
                    jnp.float32)
  greedy = _greedy(agent, state.params, obs)
  chex.assert_shape(greedy, (2000,))
  chex.assert_type(greedy, jnp.int32)
  np.testing.assert_array_equal(
      greedy, jnp.argmax(nets_lib.mlp_q_network(2, MLP.mlp_hidden_sizes).apply(
          state.params, obs), axis=-1))
  hp = agent.default_hparams()._replace(epsilon=jnp.float32(0.5))
  explored = agent.act(state.params, obs, jax.random.PRNGKey(1), hp, True)
  # Half the actions are random, half of those differ from the greedy one:
  # 25%, binomial std 1.0% over 2000 draws, so +-5% is 5 standard errors.
  assert 0.2 < float(jnp.mean(explored != greedy)) < 0.3


def test_evaluation_acts_at_nature_eval_epsilon(agent):
  """``act(explore=False)`` is Nature's evaluation policy: epsilon-greedy
  at 0.05 (Extended Data Table 1), not the greedy one."""
  # Exactly 0.05 rounded to float32 once (how the hyperparameters are stored).
  assert float(agent.default_hparams().eval_epsilon) == float(np.float32(0.05))
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  obs = jnp.asarray(np.random.default_rng(0).standard_normal((20000, 4)),
                    jnp.float32)
  greedy = _greedy(agent, state.params, obs)
  hp = agent.default_hparams()._replace(epsilon=jnp.float32(0.9))
  evaluated = agent.act(state.params, obs, jax.random.PRNGKey(1), hp, False)
  # 5% random actions, half of which (2 actions) differ from the greedy one:
  # 2.5%, whatever the exploration epsilon; binomial std 0.11%, so +-0.5%
  # is 4.5 standard errors.
  assert 0.02 < float(jnp.mean(evaluated != greedy)) < 0.03


def test_epsilon_schedule_is_nature_linear_anneal_per_member(agent):
  """1.0 at a member's first env step, linear down to its final epsilon at
  ``epsilon_decay_steps`` of its own, then constant (Mnih et al. 2015,
  Extended Data Table 1: 1.0 -> 0.1 over 1,000,000 steps)."""
  hp = population_hparams(agent, 3, epsilon=[0.1, 0.01, 0.5],
                          epsilon_decay_steps=[1e6, 100, 0])
  steps = jnp.array([[0, 250_000, 500_000, 1_000_000, 5_000_000],
                     [0, 25, 50, 100, 101],
                     [0, 1, 2, 3, 4]], jnp.uint32)
  got = jax.jit(jax.vmap(jax.vmap(dqn.epsilon_at, (None, 0))))(hp, steps)
  # epsilon + (1 - epsilon) * max(0, 1 - t / decay), by hand:
  expected = [[1.0, 0.775, 0.55, 0.1, 0.1],  # 0.1 + 0.9 * (1, .75, .5, 0, 0)
              [1.0, 0.7525, 0.505, 0.01, 0.01],  # 0.01 + 0.99 * (...)
              [0.5] * 5]  # no anneal: the final epsilon from the start
  # Rule 1: epsilon's float32 rounding, then t / decay, 1 - x, 1 - epsilon,
  # the product and the sum: <= 8 roundings of values <= 1.
  atol = numerics.rounding_rtol(8)
  np.testing.assert_allclose(got, expected, rtol=0, atol=atol)
  # What the actor acts with: only epsilon moves. The same formula, in an
  # eager vmap rather than the jitted one above (which may fuse it): rule 1.
  acting = jax.vmap(dqn.acting_hparams)(hp, steps[:, 1])
  np.testing.assert_allclose(acting.epsilon, got[:, 1], rtol=0, atol=atol)
  chex.assert_trees_all_equal(acting._replace(epsilon=hp.epsilon), hp)


def test_default_anneal_lengths():
  # Atari frames: Nature's 1,000,000 steps from 1.0 to 0.1.
  atari = dqn.make_agent(ATARI_SPEC).default_hparams()
  # Exactly 0.1 rounded to float32 once (how the hyperparameters are stored).
  assert (float(atari.epsilon), float(atari.epsilon_decay_steps)) == (
      float(np.float32(0.1)), 1e6)
  assert float(dqn.default_hparams().epsilon_decay_steps) == 1e6
  # Vector observations: 10,000 steps, so CartPole runs get past it.
  cartpole = dqn.make_agent(env_spec('CartPole-v1')).default_hparams()
  assert float(cartpole.epsilon_decay_steps) == 1e4


def test_wrong_action_space_is_a_clear_error():
  with pytest.raises(ValueError, match='Discrete action space'):
    dqn.make_agent(env_spec('Pendulum-v1'))
  from fastpbrl.agents import td3
  with pytest.raises(ValueError, match='continuous'):
    td3.make_agent(env_spec('CartPole-v1'))
