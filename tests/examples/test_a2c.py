"""The A2C of examples/a2c.py: GAE against values worked out by hand, its
update against an independent computation, the population call against a
per-member loop, its registration."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from examples import a2c
from fastpbrl import agents
from fastpbrl.agents import ppo
from fastpbrl.core.types import Rollout
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import numerics
from tests.agents.helpers import env_spec, member, random_batch

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SMALL = a2c.A2CConfig(hidden_sizes=(8,), rollout_length=3, num_envs=2)


def random_rollout(spec, leading, seed):
  """A ``Rollout`` of random steps (shape ``[*leading, ...]``) as numpy."""
  t = random_batch(spec, leading, seed=seed, terminated_fraction=0.2,
                   truncated_fraction=0.2)
  log_prob = np.random.default_rng(seed).standard_normal(leading, np.float32)
  return Rollout(*t, log_prob=log_prob)


def test_gae_worked_out_by_hand():
  # One env, T = 3, gamma 0.5, lambda 0.5. Step 1 is truncated: its delta
  # still bootstraps from V(s'_1) = 4 but A_2 is not carried back; step 2
  # terminates: no bootstrap.
  # A2C takes PPO's gae: checked here as A2C's update uses it.
  adv = ppo.gae(reward=jnp.array([[1.0], [2.0], [5.0]]),
                value=jnp.array([[1.0], [2.0], [3.0]]),
                next_value=jnp.array([[2.0], [4.0], [8.0]]),
                terminated=jnp.array([[0.0], [0.0], [1.0]]),
                truncated=jnp.array([[0.0], [1.0], [0.0]]), discount=0.5,
                gae_lambda=0.5)
  # delta = [1 + 0.5*2 - 1, 2 + 0.5*4 - 2, 5 - 3] = [1, 2, 2] (step 2 would
  # be 6 if it bootstrapped through its termination)
  # A_2 = 2; A_1 = 2 (done: A_2 not carried, or 2.5); A_0 = 1 + 0.25 * 2
  np.testing.assert_allclose(adv[:, 0], [1.5, 2.0, 2.0], rtol=0)


def _mlp(params, x):
  """SB3's MlpPolicy written out by hand: tanh between linear layers."""
  names = sorted((k for k in params if 'linear' in k),
                 key=lambda k: int(k.rsplit('_', 1)[1]))
  for i, name in enumerate(names):
    x = x @ params[name]['w'] + params[name]['b']
    if i < len(names) - 1:
      x = jnp.tanh(x)
  return x


@pytest.mark.parametrize('env_id', ['CartPole-v1', 'Pendulum-v1'])
def test_update_matches_an_independent_computation(env_id):
  agent = agents.make_agent('examples.a2c:A2C', env_spec(env_id), SMALL)
  discrete = env_id == 'CartPole-v1'
  with numerics.float64():
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    hp = numerics.as_float64(a2c.default_hparams())._replace(
        learning_rate=f64(1e-3), discount=f64(0.9), gae_lambda=f64(0.8),
        entropy_coef=f64(0.01), max_grad_norm=f64(1e6))
    state = numerics.as_float64(agent.init(jax.random.PRNGKey(0), hp))
    if not discrete:  # a log-std apart from 0, so a wrong sign shows
      state.params['pi']['~']['log_std'] = jnp.full((1,), -0.5)
    r = jax.tree.map(jnp.asarray, numerics.as_float64(
        random_rollout(agent.env_spec, (3, 2), seed=1)))
    new, metrics = jax.jit(agent.update)(state, hp, r)

    p = state.params
    v = lambda o: _mlp(p['v'], o)[..., 0]  # noqa: E731
    vs, vn = np.asarray(v(r.observation)), np.asarray(v(r.next_observation))
    # GAE by a Python loop over time, per env (COMMON's recursion).
    adv = np.zeros((3, 2))
    for e in range(2):
      carry = 0.0
      for t in reversed(range(3)):
        delta = (r.reward[t, e] + 0.9 * (1 - r.terminated[t, e]) * vn[t, e]
                 - vs[t, e])
        done = max(r.terminated[t, e], r.truncated[t, e])
        carry = delta + 0.9 * 0.8 * (1 - done) * carry
        adv[t, e] = carry
    returns = adv + vs

    def loss(params):
      out = _mlp(params['pi'], r.observation)
      if discrete:
        logits = out - jax.scipy.special.logsumexp(out, -1, keepdims=True)
        logp = jnp.take_along_axis(logits, r.action[..., None], -1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logits) * logits, -1)
      else:
        s = params['pi']['~']['log_std']
        logp = jax.scipy.stats.norm.logpdf(r.action, out, jnp.exp(s))[..., 0]
        entropy = (0.5 * jnp.log(2 * jnp.pi * jnp.e) + s[0]) * jnp.ones((3, 2))
      value_loss = jnp.mean((returns - _mlp(params['v'], r.observation)[..., 0])
                            ** 2)
      return (-jnp.mean(adv * logp) + 0.5 * value_loss
              - 0.01 * jnp.mean(entropy))

    grads = jax.grad(loss)(p)
    # RMSprop's first step from nu = 0: nu = 0.01 g^2, so the step is
    # lr g / (0.1 |g| + 1e-5) (PyTorch's RMSprop, alpha 0.99, eps 1e-5).
    expected = jax.tree.map(
        lambda w, g: w - 1e-3 * g / (0.1 * jnp.abs(g) + 1e-5), p, grads)
    expected_loss = loss(p)
  # Rule 1 in float64: a few hundred roundings through two 8-wide layers.
  np.testing.assert_allclose(metrics['loss'], expected_loss,
                             rtol=numerics.rounding_rtol(500, np.float64))
  # Rule 2: one RMSprop step; a wrong gradient term moves a weight by ~lr.
  chex.assert_trees_all_close(new.params, expected, **numerics.TRAJECTORY)
  assert int(new.step) == 1


@pytest.mark.parametrize('env_id', ['CartPole-v1', 'Pendulum-v1'])
def test_population_call_matches_per_member_loop(env_id):
  agent = agents.make_agent('examples.a2c:A2C', env_spec(env_id), SMALL)
  n, iterations = 2, 3
  learner = PopulationLearner(agent, iterations * 6)
  assert learner.iterations(iterations * 6) == iterations
  rollout = random_rollout(agent.env_spec, (n, iterations, 3, 2), seed=2)
  key = jax.random.PRNGKey(3)
  with numerics.float64():
    hparams, rollout = numerics.as_float64((population_hparams(
        agent, n, learning_rate=[1e-3, 3e-3], entropy_coef=[0.0, 0.01]),
        rollout))
    population = numerics.as_float64(learner.init(key, hparams))
    initial = jax.tree.map(np.array, population)
    population, metrics = learner.update(population, hparams, rollout)
    single = jax.jit(agent.update)
    for i in range(n):
      state = jax.tree.map(jnp.asarray, member(initial, i))
      for it in range(iterations):
        state, m = single(state, member(hparams, i),
                          jax.tree.map(lambda x: x[i, it], rollout))
        np.testing.assert_allclose(metrics['loss'][i, it], m['loss'],
                                   **numerics.TRAJECTORY)
      chex.assert_trees_all_close(member(population, i), state,
                                  **numerics.TRAJECTORY)
  np.testing.assert_array_equal(population.step, [iterations] * n)


def test_behave_and_act():
  agent = agents.make_agent('examples.a2c:A2C', env_spec('Pendulum-v1'),
                            SMALL)
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  pp, hp = agent.policy_params(state), agent.default_hparams()
  obs = jnp.ones((4, 3)) * 3.0
  action, logp = agent.behave(pp, obs, jax.random.PRNGKey(1), hp)
  out = _mlp(pp, obs)
  np.testing.assert_allclose(  # a unit Gaussian around the mean
      logp, jax.scipy.stats.norm.logpdf(action, out, 1.0)[:, 0], rtol=1e-5)
  assert pp is state.params['pi']  # the value network stays out
  greedy = agent.act(pp, obs, jax.random.PRNGKey(1), hp, False)
  np.testing.assert_allclose(greedy, jnp.clip(out, -1, 1), rtol=1e-6)


def test_registered_and_config_derived():
  spec = agents.get('examples.a2c:A2C')
  assert spec is a2c.A2C and spec.learns_from == 'rollout'
  config = a2c.A2CConfig(rollout_length=16, num_envs=4)
  assert config.batch_size == 64 and config.steps_per_call == 64
  assert a2c.A2CConfig(rollout_length=4, num_envs=2,
                       steps_per_call=24).steps_per_call == 24
  with pytest.raises(ValueError, match='batch_size 10: A2C takes one step'):
    a2c.A2CConfig(batch_size=10)
