"""CEM-RL's diagonal cross-entropy method."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.rules.cemrl import cem
from tests import numerics
from tests.rules.conftest import pendulum_spec

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

# float32 elite weights: two logs (2 ulps each) whose difference cancels by
# < 5 for K <= 3 (20 eps), as much for their sum, a division: rule 1, k = 64.
WEIGHTS_OPS = 64


def test_elite_weights_by_hand():
  # K = 3: log(4) - log(i) = log 4, log 2, log(4/3), normalised.
  raw = np.array([math.log(4), math.log(2), math.log(4 / 3)])
  # The float64 reference is exact to float32: the weights' error alone.
  np.testing.assert_allclose(cem.elite_weights(3), raw / raw.sum(),
                             rtol=numerics.rounding_rtol(WEIGHTS_OPS))
  assert cem.num_elites(10, 0.5) == 5 and cem.num_elites(3, 0.5) == 1


def test_update_matches_hand_computation():
  # D = 2, N = 4, K = 2 elites: sample 1 (fitness 4) then sample 3 (3).
  # w1 = log 3 / (log 3 + log 1.5) = 0.7304227, w2 = 0.2695773.
  # mean' = w1 [3, -1] + w2 [0, 4] = [2.1912681, 0.3478865]
  # around the OLD mean [1, -1]: z1 - m = [2, 0], z2 - m = [-1, 5]
  # var' = w1 [4, 0] + w2 [1, 25] + eps' = [3.1912681, 6.7394325] + eps'
  # eps' = 0.95 * 1e-2 + 0.05 * 1e-5 = 0.0095005
  state = cem.CEMState(mean=jnp.array([1.0, -1.0]),
                       var=jnp.array([0.3, 0.3]),
                       extra_noise=jnp.asarray(1e-2, jnp.float32))
  samples = jnp.array([[1., 2.], [3., -1.], [-2., 0.], [0., 4.]])
  fitness = jnp.array([1., 4., 2., 3.])
  new = jax.jit(cem.update)(state, samples, fitness)
  w1 = math.log(3) / (math.log(3) + math.log(1.5))
  w2 = 1 - w1
  # The constant is w1 to 7 decimals (within 5e-8).
  assert w1 == pytest.approx(0.7304227, abs=1e-7)
  eps = 0.95 * 1e-2 + 0.05 * 1e-5
  # w @ z: the weights' error, a 2-term dot, a float32 reference's 3 ops (rule
  # 1, k = 72) of sum |w_i z_i| <= max|z| = 4 (absolute: mean'[1] cancels).
  mean_atol = 4 * numerics.rounding_rtol(WEIGHTS_OPS + 8)
  np.testing.assert_allclose(new.mean, [3 * w1, -w1 + 4 * w2], rtol=0,
                             atol=mean_atol)
  # The constants are printed to 7 decimals (within 5e-8).
  np.testing.assert_allclose(new.mean, [2.1912681, 0.3478865], rtol=0,
                             atol=mean_atol + 5e-8)
  # var' sums non-negative terms (no cancellation): the weights' error, the
  # dot product and the extra noise (k = 5, below): rule 1, k = 72.
  var_rtol = numerics.rounding_rtol(WEIGHTS_OPS + 8)
  np.testing.assert_allclose(new.var, [4 * w1 + w2 + eps, 25 * w2 + eps],
                             rtol=var_rtol)
  # The constants are printed to 8 and 7 significant digits (within 5e-7).
  np.testing.assert_allclose(new.var, [3.2007686, 6.748933], rtol=var_rtol,
                             atol=5e-7)
  # 0.01 and 0.95 as float32, a product, 5e-7 as float32 and a sum of
  # positive terms: rule 1 with k = 5, counted as 8.
  assert float(new.extra_noise) == pytest.approx(
      eps, rel=numerics.rounding_rtol(8))
  # Not the variance around the NEW mean, which is smaller by (mean' -
  # mean)^2 = [1.4, 1.8], far beyond allclose's rtol of 1e-5.
  around_new = w1 * (samples[1] - new.mean) ** 2 + w2 * (
      samples[3] - new.mean) ** 2 + eps
  assert not np.allclose(new.var, around_new)
  # NaN fitness ranks last. The other elites give a mean [-0.54, 2.92]
  # against [2.19, 0.35]: far beyond allclose's rtol of 1e-5.
  nan_fit = fitness.at[1].set(jnp.nan)
  assert not np.allclose(cem.update(state, samples, nan_fit).mean, new.mean)
  np.testing.assert_allclose(
      cem.update(state, samples, nan_fit).mean, w1 * samples[3] + w2 * samples[2],
      rtol=0, atol=mean_atol)  # as for mean' above


def test_extra_noise_decays_towards_the_floor():
  state = cem.init(jnp.zeros(3))
  # 1e-2 as float32: one rounding.
  assert float(state.extra_noise) == pytest.approx(
      1e-2, rel=numerics.rounding_rtol(1))
  samples = jnp.zeros((4, 3))
  noises = []
  for _ in range(200):
    state = cem.update(state, samples, jnp.arange(4.0))
    noises.append(float(state.extra_noise))
  # eps_t - 1e-5 = 0.95^t (1e-2 - 1e-5). Each step's 4 roundings (0.95, 5e-7,
  # a product, a sum) carry on with weight 0.95^j: rule 1, k = 4 max(20, t).
  np.testing.assert_allclose(noises[9], 1e-5 + 0.95 ** 10 * (1e-2 - 1e-5),
                             rtol=numerics.rounding_rtol(4 * 20))
  np.testing.assert_allclose(noises[-1], 1e-5 + 0.95 ** 200 * (1e-2 - 1e-5),
                             rtol=numerics.rounding_rtol(4 * 200))
  # Approaches the floor, never below: 1.035e-5 is >= 5e-3 (relative) from
  # either bound, 50 times the rounding allowed above.
  assert 1e-5 < noises[-1] < 1.04e-5
  # Identical elites at the mean: the variance is the extra noise alone,
  # exactly (w @ 0 = 0, and 0 + eps' = eps').
  np.testing.assert_array_equal(state.var, np.full(3, noises[-1], np.float32))


def test_mirrored_sampling():
  state = cem.CEMState(mean=jnp.array([1.0, -2.0, 0.5]),
                       var=jnp.array([0.01, 1.0, 4.0]),
                       extra_noise=jnp.asarray(0.0))
  s = cem.sample(jax.random.PRNGKey(0), state, 6)
  # fl(m + e) + fl(m - e): three roundings of values <= max|s| (rule 1,
  # k = 4, absolute).
  np.testing.assert_allclose(s[:3] + s[3:], 2 * np.broadcast_to(
      state.mean, (3, 3)), rtol=0,
                             atol=numerics.rounding_rtol(4) * np.abs(s).max())
  # Mirrored rows differ by 2 e, up to 4 here: far beyond allclose's 1e-5.
  assert not np.allclose(s[:3], s[3:])
  big = cem.sample(jax.random.PRNGKey(1), state, 20000)
  # Pairs cancel but for each sample's rounding (eps/2 |x|); averaged in
  # float64: rule 1, k = 1 of max|x|. Unmirrored: off by sd >= 7e-4.
  np.testing.assert_allclose(np.asarray(big, np.float64).mean(0), state.mean,
                             rtol=0,
                             atol=numerics.rounding_rtol(1) * np.abs(big).max())
  # Statistical: 10000 independent e^2 (the mirrored half repeats them),
  # whose mean has relative sd sqrt(2 / 10000) = 0.014; 5 sd.
  np.testing.assert_allclose(big.var(0), state.var,
                             rtol=5 * np.sqrt(2 / (20000 // 2)))
  with pytest.raises(ValueError, match='even n'):
    cem.sample(jax.random.PRNGKey(0), state, 5)
  odd = cem.sample(jax.random.PRNGKey(0), state, 5, mirrored=False)
  assert odd.shape == (5, 3)


def test_cem_climbs_a_quadratic():
  target = jnp.array([0.5, -0.3, 0.2, 0.1])
  state = cem.init(jnp.zeros(4), initial_var=0.1)
  key = jax.random.PRNGKey(0)

  @jax.jit
  def step(state, key):
    x = cem.sample(key, state, 10)
    return cem.update(state, x, -jnp.sum((x - target) ** 2, axis=1))

  for k in jax.random.split(key, 60):
    state = step(state, k)
  # Statistical: the final mean's error has sd 0.007 (measured over 2000
  # seeds): 0.05 is 7 sd; a mean that did not climb misses by >= 0.1.
  np.testing.assert_allclose(state.mean, target, rtol=0, atol=0.05)


def test_flatten_roundtrip_and_load_policies():
  nets = td3.make_networks(pendulum_spec(), td3.TD3Config(hidden_sizes=(8, 8)))
  obs = jnp.zeros((1, 3))
  policies = jax.jit(jax.vmap(nets.policy.init, (0, None)))(
      jax.random.split(jax.random.PRNGKey(0), 4), obs)
  flat, unravel = cem.flatten_population(policies)
  d = sum(x[0].size for x in jax.tree.leaves(policies))
  assert flat.shape == (4, d)
  chex.assert_trees_all_equal(cem.unflatten_population(flat, unravel),
                              policies)
  # Row i is member i's parameters, and init from a pytree gives the same D.
  np.testing.assert_array_equal(
      flat[2], jax.flatten_util.ravel_pytree(
          jax.tree.map(lambda x: x[2], policies))[0])
  state = cem.init(jax.tree.map(lambda x: x[0], policies))
  np.testing.assert_array_equal(state.mean, flat[0])
  new = cem.sample(jax.random.PRNGKey(1), state, 4)
  shared = td3.SharedTD3State(
      policy=policies, target_policy=policies, policy_opt=(), critic={},
      target_critic={}, critic_opt=(), key=jnp.zeros((4, 2), jnp.uint32),
      step=jnp.zeros((), jnp.int32))
  loaded = cem.load_policies(shared, new, unravel)
  np.testing.assert_array_equal(cem.flatten_population(loaded.policy)[0], new)
  np.testing.assert_array_equal(
      cem.flatten_population(loaded.target_policy)[0], new)
  # Separate buffers per field: the learner donates the whole state, and XLA
  # refuses to donate one buffer twice.
  pointers = [x.unsafe_buffer_pointer() for x in
              jax.tree.leaves((loaded.policy, loaded.target_policy))]
  assert len(set(pointers)) == len(pointers)
  jax.jit(lambda s: s, donate_argnums=0)((loaded.policy,
                                          loaded.target_policy))
  with pytest.raises(ValueError, match='actor'):
    cem.load_policies(shared, new, unravel, fields=('actor',))


# ---------------------------------------------------------------------------
# The RL half's shared-critic update on a traced schedule
# ---------------------------------------------------------------------------


def _rl_population(n=4, num_rl=2, steps=5, train_until=0):
  from fastpbrl.learner.population import (SharedCriticLearner,
                                           population_hparams)
  from tests.rules.conftest import tiny_td3
  agent = tiny_td3(batch_size=4, steps_per_call=steps)
  learner = SharedCriticLearner(
      cem.with_rl_schedule(agent.shared_critic, num_rl), steps)
  hparams = cem.rl_hparams(
      population_hparams(agent, n, policy_update_fraction=1.0), train_until)
  return agent, learner, hparams, learner.init(jax.random.PRNGKey(0), hparams)


def test_rl_schedule_steps_exactly_up_to_its_bound():
  from tests.rules.conftest import random_batch
  _, learner, hparams, state = _rl_population(train_until=7)
  copy = lambda t: jax.tree.map(jnp.copy, t)
  batch = lambda seed: random_batch(pendulum_spec(), (4, 5, 4), seed)
  state, m1 = learner.update(state, hparams, batch(1))
  state, m2 = learner.update(state, hparams, batch(2))
  # 5 + 2 active steps: the second call stops at the bound mid-call.
  assert int(state.step) == 7 and int(state.critic_opt[0].count) == 7
  np.testing.assert_array_equal(
      np.concatenate([m1['critic_updated'], m2['critic_updated']], 1),
      np.broadcast_to([1.] * 7 + [0.] * 3, (4, 10)))
  policy_steps = m1['policy_updated'].sum(1) + m2['policy_updated'].sum(1)
  np.testing.assert_array_equal(policy_steps, [7, 7, 0, 0])
  np.testing.assert_array_equal(state.policy_opt[0].count, [7, 7, 0, 0])
  # At the bound a call changes nothing, keys and counters included.
  before = copy(state)
  state, m3 = learner.update(state, hparams, batch(3))
  chex.assert_trees_all_equal(state, before)
  assert not np.asarray(m3['critic_updated']).any()
  # A new bound is a new traced value: no recompilation.
  state, _ = learner.update(state, cem.set_train_until(hparams, 12), batch(4))
  assert int(state.step) == 12
  assert learner.compilations == 1


def test_rl_schedule_is_the_shared_update_of_the_rl_half_alone():
  from tests.rules.conftest import random_batch
  head = lambda t: jax.tree.map(lambda x: x[:2], t)
  tail = lambda t: jax.tree.map(lambda x: x[2:], t)
  # An Adam step along two programs: in float32 a rounding-level gradient
  # difference can flip a step's sign, so compare in float64 (rule 2).
  with numerics.float64():
    agent, learner, hparams, state = _rl_population(steps=1, train_until=1)
    hparams, state = numerics.as_float64((hparams, state))
    batch = numerics.as_float64(random_batch(pendulum_spec(), (4, 1, 4), 5))
    # The other route: the agent's own shared-critic update on a population
    # made of the two RL members only.
    rl_only = state._replace(**{f: head(getattr(state, f))
                                for f in cem.MEMBER_FIELDS})
    expected, _ = jax.jit(agent.shared_critic.update)(
        rl_only, head(hparams.agent),
        jax.tree.map(lambda x: x[:2, 0], batch))
    members = jax.tree.map(jnp.copy, tuple(getattr(state, f)
                                           for f in cem.MEMBER_FIELDS))
    got, _ = learner.update(state, hparams, batch)
  chex.assert_trees_all_close(
      (got.critic, got.target_critic, got.critic_opt, got.step),
      (expected.critic, expected.target_critic, expected.critic_opt,
       expected.step), **numerics.TRAJECTORY)
  for f in cem.MEMBER_FIELDS:
    chex.assert_trees_all_close(head(getattr(got, f)), getattr(expected, f),
                                **numerics.TRAJECTORY)
  chex.assert_trees_all_equal(
      tail(tuple(getattr(got, f) for f in cem.MEMBER_FIELDS)), tail(members))


def test_load_policies_resets_the_given_fields():
  _, _, _, state = _rl_population()
  fresh = jax.tree.map(jnp.copy, state.policy_opt)
  stepped = state._replace(policy_opt=jax.tree.map(lambda x: x + 1,
                                                   state.policy_opt))
  flat, unravel = cem.flatten_population(state.policy)
  loaded = cem.load_policies(stepped, flat + 1.0, unravel,
                             reset={'policy_opt': fresh})
  chex.assert_trees_all_equal(loaded.policy_opt, fresh)
  np.testing.assert_array_equal(cem.flatten_population(loaded.policy)[0],
                                flat + 1.0)
  pointers = [x.unsafe_buffer_pointer() for x in
              jax.tree.leaves((loaded.policy_opt, fresh))]
  assert len(set(pointers)) == len(pointers)  # donating one keeps the other
  with pytest.raises(ValueError, match='policy_optimizer'):
    cem.load_policies(state, flat, unravel, reset={'policy_optimizer': fresh})
  with pytest.raises(ValueError, match='tree structure'):
    cem.load_policies(state, flat, unravel, reset={'policy_opt': fresh[0]})
