"""TD3: population vs per-member loop, traced hyperparameters, shared critic,
termination vs truncation, shapes on a real MuJoCo spec."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.agents.base import periodic_flag
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)
from tests import numerics
from tests.agents.helpers import (assert_population_matches_loop, env_spec,
                                  member, random_batch)

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SMALL = td3.TD3Config(hidden_sizes=(32, 32), batch_size=16, steps_per_call=50)


@pytest.fixture(scope='module')
def agent():
  return td3.make_agent(env_spec('HalfCheetah-v5'), SMALL)


def test_spec_from_mujoco_env_and_shapes(agent):
  spec = agent.env_spec
  assert spec.observations.shape == (17,) and spec.actions.shape == (6,)
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  obs = jnp.zeros((5, 17), jnp.float32)
  for explore in (False, True):
    action = agent.act(state.policy, obs, jax.random.PRNGKey(1),
                       agent.default_hparams(), explore)
    chex.assert_shape(action, (5, 6))
    chex.assert_type(action, jnp.float32)
    assert np.all(np.abs(action) <= 1.0)
  chex.assert_shape(state.step, ())
  chex.assert_type(state.step, jnp.int32)


def test_population_call_matches_per_member_loop(agent):
  hparams = population_hparams(
      agent, 3, policy_lr=[1e-4, 3e-4, 1e-3], critic_lr=[3e-4, 1e-3, 3e-4],
      discount=[0.99, 0.9, 0.95], policy_update_fraction=[0.5, 1.0, 0.25],
      target_noise=[0.2, 0.0, 0.5])
  _, population, metrics = assert_population_matches_loop(
      agent, hparams, num_steps=50, batch_size=16)
  chex.assert_shape(metrics['critic_loss'], (3, 50))
  # Delays 2, 1 and 4: 25, 50 and 12 policy updates over 50 steps.
  np.testing.assert_array_equal(
      np.sum(metrics['policy_updated'], axis=1), [25, 50, 12])
  np.testing.assert_array_equal(population.step, [50, 50, 50])


def test_per_member_hparams_differ_and_never_recompile(agent):
  learner = PopulationLearner(agent, num_steps=5)
  hparams = population_hparams(agent, 2)
  batch = random_batch(agent.env_spec, (2, 5, 16))
  # Both members start from the same parameters: only the learning rate differs.
  state = learner.init(jax.random.PRNGKey(0), hparams)
  state = jax.tree.map(lambda x: jnp.stack([x[0], x[0]]), state)
  state, _ = learner.update(
      state, hparams._replace(policy_lr=jnp.array([1e-4, 1e-2]),
                              critic_lr=jnp.array([1e-4, 1e-2])), batch)
  leaves = jax.tree.leaves(state.critic)
  # Five Adam steps of 1e-2 against 1e-4 set every leaf 2e-2 to 5e-2 apart,
  # far beyond allclose's default 1e-5 |x| + 1e-8 (|x| < 1 here).
  assert all(not np.allclose(x[0], x[1]) for x in leaves)
  for lr in (3e-4, 1e-3, 5e-3):
    state, _ = learner.update(state, population_hparams(agent, 2, critic_lr=lr,
                                                        discount=0.9), batch)
  assert learner.compilations == 1


def test_truncated_transition_bootstraps_terminated_does_not(agent):
  nets = td3.make_networks(agent.env_spec, SMALL)
  hp = agent.default_hparams()._replace(target_noise=jnp.float32(0.0),
                                        discount=jnp.float32(0.9))
  state = agent.init(jax.random.PRNGKey(3), hp)
  base = random_batch(agent.env_spec, (2,), seed=4)
  # Row 0 was cut by a time limit, row 1 ended in a terminal state.
  batch = base._replace(truncated=np.array([1.0, 0.0], np.float32),
                        terminated=np.array([0.0, 1.0], np.float32))
  next_action = nets.policy.apply(state.target_policy, batch.next_observation)
  nq1, nq2 = nets.critic.apply(state.target_critic, batch.next_observation,
                               next_action)
  expected_target = np.array([batch.reward[0] + 0.9 * min(nq1[0], nq2[0]),
                              batch.reward[1]])
  q1, q2 = nets.critic.apply(state.critic, batch.observation, batch.action)
  expected_loss = (np.mean((np.asarray(q1) - expected_target) ** 2)
                   + np.mean((np.asarray(q2) - expected_target) ** 2))
  loss, _ = td3.critic_loss(nets, state.critic, state.target_critic,
                            state.target_policy, batch, jax.random.PRNGKey(0), hp)
  # Rule 1: policy (17+32+32 terms, tanh) then critic (23+32+32) on the
  # target's path, then a few loss ops: <= 200 roundings, on a sum of squares.
  rtol = numerics.rounding_rtol(200)
  np.testing.assert_allclose(loss, expected_loss, rtol=rtol)
  # The truncation flag never changes the target; the termination flag does.
  flipped, _ = td3.critic_loss(
      nets, state.critic, state.target_critic, state.target_policy,
      batch._replace(truncated=np.zeros(2, np.float32)), jax.random.PRNGKey(0), hp)
  # critic_loss never reads ``truncated``: the same ops on the same inputs.
  np.testing.assert_array_equal(flipped, loss)
  bootstrapped, _ = td3.critic_loss(
      nets, state.critic, state.target_critic, state.target_policy,
      batch._replace(terminated=np.zeros(2, np.float32)), jax.random.PRNGKey(0), hp)
  # Bootstrapping row 1 adds 0.9 min(Q') to its target, which moves the loss
  # by a third, far beyond the rounding allowed above (2.4e-5 relative).
  assert not np.isclose(bootstrapped, loss, rtol=rtol, atol=0)


def test_periodic_flag_is_every_dth_step():
  steps = jnp.arange(12)
  np.testing.assert_array_equal(periodic_flag(steps, 0.5),
                                [s % 2 == 1 for s in range(12)])
  np.testing.assert_array_equal(periodic_flag(steps, 1 / 3),
                                [s % 3 == 2 for s in range(12)])
  assert int(jnp.sum(periodic_flag(jnp.arange(1000), 0.3))) == 300


def test_periodic_flag_keeps_its_pattern_past_2_to_the_25_steps():
  # float32 arithmetic gave no flag at all from 2**25 on (t f rounds to the
  # same value for t and t + 1); the pattern must hold at any int32 step.
  for start in (2**24 - 7, 2**25 + 3, 2**30 + 1, 2**31 - 100):
    steps = jnp.arange(start, start + 24, dtype=jnp.int32)
    t = np.arange(start, start + 24, dtype=np.int64)
    np.testing.assert_array_equal(periodic_flag(steps, 0.5), t % 2 == 1)
    np.testing.assert_array_equal(periodic_flag(steps, 0.25), t % 4 == 3)
    np.testing.assert_array_equal(periodic_flag(steps, 1.0), np.ones(24, bool))
    # Any fraction: the exact rational floor of the fixed-point fraction.
    for f in (1 / 3, 0.3, 0.2, 0.77):
      q = int(np.ceil(np.float32(f) * 2**24))
      expected = (t + 1) * q // 2**24 > t * q // 2**24
      np.testing.assert_array_equal(periodic_flag(steps, f), expected)
  # The rate over a long window past 2**25 is the fraction.
  steps = jnp.arange(2**25, 2**25 + 100_000, dtype=jnp.int32)
  assert int(jnp.sum(periodic_flag(steps, 0.3))) in (30_000, 30_001)


def test_shared_critic_gradient_is_population_mean(agent):
  nets = td3.make_networks(agent.env_spec, SMALL)
  n = 3
  hparams = population_hparams(agent, n, discount=[0.99, 0.9, 0.95],
                               target_noise=[0.2, 0.1, 0.3])
  learner = SharedCriticLearner(agent.shared_critic, num_steps=1)
  batch = random_batch(agent.env_spec, (n, 1, 16), seed=1)
  # In float64: gradient entries are sums over the batch that cancel to near
  # zero, where float32 keeps no relative digit.
  with numerics.float64():
    hparams, batch = numerics.as_float64((hparams, batch))
    state = numerics.as_float64(learner.init(jax.random.PRNGKey(0), hparams))
    # Independent route: each member's TD3 critic gradient alone, then the mean.
    noise_keys = jax.vmap(jax.random.split)(state.key)[:, 1]
    grads = [
        jax.grad(lambda c: td3.critic_loss(
            nets, c, state.target_critic, member(state.target_policy, i),
            jax.tree.map(lambda x: x[i, 0], batch), noise_keys[i],
            member(hparams, i))[0])(state.critic) for i in range(n)]
    mean_grad = jax.tree.map(lambda *g: sum(g) / n, *grads)
    critic_before = jax.tree.map(np.array, state.critic)
    state, metrics = learner.update(state, hparams, batch)
    # After one Adam step the first moment is (1 - b1) * gradient = 0.1 * g.
    used_grad = jax.tree.map(lambda mu: mu / 0.1, state.critic_opt[0].mu)
  # Rule 1 in float64: forward and backward through policy and critic, a mean
  # over 16 samples and 3 members: <= 1000 roundings, of terms of size <= 1
  # (atol, for entries that cancel); another member's batch or key is off by ~g.
  tol = numerics.rounding_rtol(1000, np.float64)
  chex.assert_trees_all_close(used_grad, mean_grad, rtol=tol, atol=tol)
  # One Adam step moves every weight with a nonzero gradient by ~3e-4 (the
  # learning rate), far beyond allclose's default 1e-5 |w| + 1e-8 (|w| < 1).
  assert not np.allclose(jax.tree.leaves(critic_before)[0],
                         jax.tree.leaves(state.critic)[0])
  chex.assert_shape(metrics['critic_loss'], (n, 1))


def test_shared_critic_policies_match_independent_td3_policy_step(agent):
  """Given the updated shared critic, each member's policy takes the plain
  TD3 step; the population-level extra term adds its own gradient."""
  nets = td3.make_networks(agent.env_spec, SMALL)
  n = 2
  hparams = population_hparams(agent, n, policy_lr=[1e-3, 1e-4],
                               policy_update_fraction=1.0)
  # In float64, as above: policy gradients that cancel to near zero.
  batch = numerics.as_float64(random_batch(agent.env_spec, (n, 1, 16), seed=2))

  def extra(policies, observations):
    actions = jax.vmap(nets.policy.apply)(policies, observations)
    return 0.5 * jnp.sum(jnp.square(actions))

  for extra_term in (None, extra):
    shared = agent.shared_critic
    if extra_term is not None:
      shared = shared.with_policy_loss(extra_term)
    learner = SharedCriticLearner(shared, num_steps=1)
    with numerics.float64():
      hp64 = numerics.as_float64(hparams)
      state = numerics.as_float64(learner.init(jax.random.PRNGKey(5), hp64))
      policies_before = jax.tree.map(np.array, state.policy)
      state, _ = learner.update(state, hp64, batch)
      for i in range(n):
        obs = batch.observation[i, 0]

        def loss(p, i=i, obs=obs):
          total = td3.policy_loss(nets, p, state.critic, obs)
          if extra_term is not None:
            others = jax.tree.map(lambda a, b: jnp.asarray(a).at[i].set(b),
                                    policies_before, p)
            total = total + extra_term(others, batch.observation[:, 0])
          return total

        g = jax.grad(loss)(member(policies_before, i))
        mu = jax.tree.map(lambda x: x[i], state.policy_opt[0].mu)
        # Rule 1 in float64: policy and critic forward and back, a mean over
        # 16 samples: <= 1000 roundings of terms of size <= 1; a missing
        # extra term or another member's batch is off by ~g.
        tol = numerics.rounding_rtol(1000, np.float64)
        chex.assert_trees_all_close(mu, jax.tree.map(lambda x: 0.1 * x, g),
                                    rtol=tol, atol=tol)


def test_bad_batch_shape_is_a_clear_error(agent):
  learner = PopulationLearner(agent, num_steps=5)
  hparams = population_hparams(agent, 2)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  with pytest.raises(ValueError, match='num_steps'):
    learner.update(state, hparams, random_batch(agent.env_spec, (2, 4, 16)))
  with pytest.raises(ValueError, match='population axis'):
    learner.update(state, hparams, random_batch(agent.env_spec, (3, 5, 16)))
  with pytest.raises(ValueError, match='unknown td3 hyperparameters'):
    population_hparams(agent, 2, learning_rate=1e-3)


def test_same_seed_and_batches_give_bitwise_equal_states(agent):
  """The learner is deterministic on CPU: what the docs promise for a
  fixed seed and fixed batches."""
  learner = PopulationLearner(agent, num_steps=5)
  hparams = population_hparams(agent, 2, exploration_noise=[0.1, 0.3])
  batch = random_batch(agent.env_spec, (2, 5, 16), seed=3)
  runs = []
  for _ in range(2):
    state = learner.init(jax.random.PRNGKey(7), hparams)
    for _ in range(2):
      state, _ = learner.update(state, hparams, batch)
    runs.append(jax.device_get(state))
  chex.assert_trees_all_equal(*runs)
  other = jax.device_get(learner.init(jax.random.PRNGKey(8), hparams))
  assert not np.array_equal(jax.tree.leaves(other)[0],
                            jax.tree.leaves(runs[0])[0])


def test_policy_step_stays_a_real_cond_under_the_population_vmap(agent):
  """Under the learner's named vmap the delayed policy step is a ``cond`` on
  a population-wide predicate (skipped when no member updates); a plain vmap
  turns it into a select that always runs it."""
  from fastpbrl.agents.base import POPULATION_AXIS, any_member
  hparams = population_hparams(agent, 2)
  state = jax.vmap(agent.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                               hparams)
  batch = random_batch(agent.env_spec, (2, 16))
  named = str(jax.make_jaxpr(jax.vmap(agent.update, axis_name=POPULATION_AXIS))(
      state, hparams, batch))
  plain = str(jax.make_jaxpr(jax.vmap(agent.update))(state, hparams, batch))
  assert 'cond[' in named and 'pmax' in named
  assert 'cond[' not in plain
  # any_member: OR over the population inside, the flag itself outside.
  flags = jnp.array([False, True, False])
  np.testing.assert_array_equal(
      jax.vmap(any_member, axis_name=POPULATION_AXIS)(flags), [True] * 3)
  np.testing.assert_array_equal(jax.vmap(any_member)(flags), flags)


def test_inactive_members_keep_their_state_with_one_compilation(agent):
  learner = PopulationLearner(agent)
  hparams = population_hparams(agent, 3)
  batch = random_batch(agent.env_spec, (3, SMALL.steps_per_call, 16))
  start = learner.init(jax.random.PRNGKey(0), hparams)
  copy = lambda s: jax.tree.map(jnp.copy, s)  # the learner donates its input
  full, _ = learner.update(copy(start), hparams, batch)
  masked, _ = learner.update(copy(start), hparams, batch,
                             np.array([True, False, True]))
  for f, m, s in zip(jax.tree.leaves(full), jax.tree.leaves(masked),
                     jax.tree.leaves(start)):
    np.testing.assert_array_equal(m[1], s[1])  # discarded
    np.testing.assert_array_equal(m[0], f[0])
    np.testing.assert_array_equal(m[2], f[2])
  assert learner.compilations == 1
  with pytest.raises(ValueError, match=r'active must be \[3\]'):
    learner.update(copy(start), hparams, batch, np.ones(2, bool))
