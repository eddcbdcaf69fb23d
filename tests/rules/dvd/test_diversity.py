"""DvD: the determinant diversity loss, its shared-critic plug-in and the
host-side lambda schedule, bandit and round scores over array state."""

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme import specs

from fastpbrl.agents import td3
from fastpbrl.learner import SharedCriticLearner, population_hparams
from fastpbrl import rng as rng_lib
from fastpbrl.rules.dvd import diversity as dvd
from fastpbrl.rules.dvd import DvDRunConfig
from tests import numerics
from tests.rules.conftest import pendulum_spec, random_batch, tiny_td3

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SIGMA = 1.5
JITTER = 1e-4


def logdet_atol(n: int, ops: int, dtype=np.float64) -> float:
  """Bound on -log det(M), M = K + jitter I, between two routes whose
  entries of M (<= 1) differ by rule 1's bound for ``ops`` operations: log det
  moves by tr(M^-1 dM) <= n^2 max|dM_ij| / jitter (``||M^-1|| <= 1 /
  jitter``). In float32 it is ~1 for 4 members (k = 64): hence float64."""
  return n ** 2 / JITTER * numerics.rounding_rtol(ops, dtype)


def logdet_grad_atol(n: int, d: int, ops: int) -> float:
  """The same in float64 for the gradient, ``2 / (sigma^2 D) sum_j (M^-1 o
  K)_kj (phi_k - phi_j)`` with ``|phi_k - phi_j| <= 2``: ``M^-1``'s entries
  move by up to ``||M^-1||^2 ||dM|| <= n max|dM_ij| / jitter^2``."""
  return 4 * n ** 2 / (SIGMA ** 2 * d * JITTER ** 2) * numerics.rounding_rtol(
      ops, np.float64)


# Rule 1's k for the entries of M, counted generously: a squared distance
# over D <= 16 entries, an exp, Cholesky's n + 1 steps (or the reference's LU).
KERNEL_OPS = 64


def np_loss(actions: np.ndarray, sigma: float = SIGMA,
            jitter: float = JITTER) -> float:
  """Direct float64 formula: -log det(K + jitter I), with the squared
  distance divided by the embedding size D (the scaled kernel of issue 9;
  this reference used to encode the unscaled one)."""
  phi = actions.reshape(actions.shape[0], -1).astype(np.float64)
  n, d = phi.shape
  k = np.array([[np.exp(-np.sum((phi[i] - phi[j]) ** 2) / (2 * sigma ** 2 * d))
                 for j in range(n)] for i in range(n)])
  sign, logdet = np.linalg.slogdet(k + jitter * np.eye(n))
  assert sign > 0
  return -logdet


def np_grad(actions: np.ndarray, sigma: float = SIGMA,
            jitter: float = JITTER) -> np.ndarray:
  """Analytic gradient: dL/dphi_k = (2 / (sigma^2 D)) sum_j (M^-1 o K)_kj
  (phi_k - phi_j), with M = K + jitter I (from dL = -tr(M^-1 dK))."""
  phi = actions.reshape(actions.shape[0], -1).astype(np.float64)
  d = phi.shape[1]
  d2 = ((phi[:, None] - phi[None]) ** 2).sum(-1)
  k = np.exp(-d2 / (2 * sigma ** 2 * d))
  w = np.linalg.inv(k + jitter * np.eye(len(phi))) * k
  g = 2 / (sigma ** 2 * d) * (w.sum(1)[:, None] * phi - w @ phi)
  return g.reshape(actions.shape)


@pytest.fixture(scope='module')
def actions():
  return np.random.default_rng(0).uniform(-1, 1, (4, 3, 2)).astype(np.float32)


def test_loss_matches_direct_formula(actions):
  # In float64: K + jitter I's conditioning leaves float32 no useful bound.
  with numerics.float64():
    a64 = actions.astype(np.float64)
    got = jax.jit(dvd.diversity_loss, static_argnames='jitter')(
        a64, SIGMA, jitter=JITTER)
    np.testing.assert_allclose(got, np_loss(actions), rtol=0,
                               atol=logdet_atol(4, KERNEL_OPS))
    # More spread, more volume, lower loss (2.26 against 5.81).
    assert float(dvd.diversity_loss(2 * a64, SIGMA)) < float(got)


def test_gradient_matches_analytic_and_finite_differences(actions):
  a64 = actions.astype(np.float64)
  # In float64, as the loss (float32's bound exceeds the gradient itself).
  with numerics.float64():
    g = np.asarray(jax.grad(dvd.diversity_loss)(a64, SIGMA))
  grad_atol = logdet_grad_atol(4, 6, KERNEL_OPS)
  np.testing.assert_allclose(g, np_grad(actions), rtol=0, atol=grad_atol)
  # Central differences of the float64 formula.
  fd = np.zeros_like(a64)
  h = 1e-5
  for idx in np.ndindex(a64.shape):
    e = np.zeros_like(a64)
    e[idx] = h
    fd[idx] = (np_loss(a64 + e) - np_loss(a64 - e)) / (2 * h)
  # The formula's rounding over h (2.3e-4) and h^2 f'''/6 (1e-10: the error
  # is 1.3e-6 at h = 1e-3, measured).
  np.testing.assert_allclose(
      g, fd, rtol=0, atol=logdet_atol(4, KERNEL_OPS) / h + grad_atol)


def test_identical_policies_are_finite():
  n = 5
  same = np.broadcast_to(np.random.default_rng(1).uniform(-1, 1, (1, 8, 2)),
                         (n, 8, 2)).astype(np.float32)
  loss, g = jax.value_and_grad(dvd.diversity_loss)(same, SIGMA)
  # K = all ones: eigenvalues n + jitter (once) and jitter (n - 1 times).
  expected = -np.log(n + JITTER) - (n - 1) * np.log(JITTER)
  # float32: M = 1 + jitter I is exact but for k = 8 roundings (1 + jitter,
  # Cholesky's n + 1 steps); logdet_atol: 0.24 of 35.2.
  np.testing.assert_allclose(loss, expected, rtol=0,
                             atol=logdet_atol(n, 8, np.float32))
  # Exactly 0: every term carries a pairwise difference phi_i - phi_j = 0.
  assert np.all(np.isfinite(g)) and np.all(np.asarray(g) == 0)
  # Nearly identical: still finite, and the gradient pushes members apart.
  near = same + 1e-3 * np.random.default_rng(2).standard_normal(
      same.shape).astype(np.float32)
  loss, g = jax.value_and_grad(dvd.diversity_loss)(near, SIGMA)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  # The step lowers the loss by ~1e-3, below float32's bound (0.24, above):
  # both losses in float64, where logdet_atol(5, 8) is 4e-10.
  with numerics.float64():
    near64, g64 = numerics.as_float64((near, np.asarray(g)))
    assert float(dvd.diversity_loss(near64 - 1e-4 * g64, SIGMA)) < float(
        dvd.diversity_loss(near64, SIGMA))


def test_kernel_does_not_depend_on_the_embedding_size():
  """The squared distance is divided by D = states x actions: the same
  behaviour on the states repeated 3 times (D x 3) gives the same kernel,
  and actions that differ by exactly sigma everywhere give exp(-1/2)."""
  rng = np.random.default_rng(4)
  acts = rng.uniform(-1, 1, (3, 5, 2)).astype(np.float32)
  # Sums of 30 and 10 squared gaps and the scaling (k = 48) in an exponent <=
  # 2^2 / (2 0.7^2) = 4.1, which scales them, plus exp's ulps: k = 48 4.1 + 4.
  np.testing.assert_allclose(dvd.kernel_matrix(np.tile(acts, (1, 3, 1)), 0.7),
                             dvd.kernel_matrix(acts, 0.7),
                             rtol=numerics.rounding_rtol(48 * 4.1 + 4))
  pair = np.stack([np.zeros((20, 17)), np.full((20, 17), 0.3)]).astype(
      np.float32)
  # A sum of 340 squares and the scaling (k = 344) in an exponent of 1/2,
  # plus exp's ulps: rule 1 with k = 180.
  np.testing.assert_allclose(dvd.kernel_matrix(pair, 0.3)[0, 1],
                             np.exp(-0.5), rtol=numerics.rounding_rtol(180))


def _spec(obs_dim: int, action_dim: int) -> specs.EnvironmentSpec:
  return specs.EnvironmentSpec(
      observations=specs.Array((obs_dim,), np.float32),
      actions=specs.BoundedArray((action_dim,), np.float32, -1.0, 1.0),
      rewards=specs.Array((), np.float32),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0))


def _tree_norm(tree) -> float:
  return float(jnp.sqrt(sum(jnp.sum(jnp.square(x))
                            for x in jax.tree.leaves(tree))))


# Observation sizes of Pendulum-v1, HalfCheetah-v5 and Humanoid-v5.
@pytest.mark.parametrize('obs_dim, action_dim', [(3, 1), (17, 6), (348, 17)])
def test_diversity_term_is_active_at_initialisation(obs_dim, action_dim):
  """Issue 9: with the driver's defaults and freshly initialised 256x256
  policies, the kernel is neither the identity (members look infinitely far
  apart, gradient 0) nor all ones, and the diversity gradient is within two
  orders of magnitude of the TD3 policy-loss gradient (random critic), for
  1, 6 and 17 actions. The unscaled kernel failed this for 6 and 17
  actions: largest entry ~1e-4 and ~1e-13, gradient ~1e-6 and exactly 0."""
  defaults = DvDRunConfig()
  nets = td3.make_networks(_spec(obs_dim, action_dim), td3.TD3Config())
  critic = nets.critic.init(jax.random.PRNGKey(1), jnp.zeros((1, obs_dim)),
                            jnp.zeros((1, action_dim)))
  obs = jax.random.normal(jax.random.PRNGKey(2), (256, obs_dim))
  states = obs[:defaults.embedding_states]

  def population_policy_loss(policies):
    return jnp.sum(jax.vmap(
        lambda p: td3.policy_loss(nets, p, critic, obs))(policies))

  def term(policies):
    actions = jax.vmap(nets.policy.apply, (0, None))(policies, states)
    return dvd.diversity_loss(actions, defaults.kernel_sigma)

  @jax.jit
  def measure(policies):
    actions = jax.vmap(nets.policy.apply, (0, None))(policies, states)
    return (dvd.kernel_matrix(actions, defaults.kernel_sigma),
            jax.grad(term)(policies),
            jax.grad(population_policy_loss)(policies))

  for n in (2, 5):
    policies = jax.vmap(lambda k: nets.policy.init(k, obs[:1]))(
        jax.random.split(jax.random.PRNGKey(n), n))
    k, g_div, g_policy = measure(policies)
    off = np.asarray(k)[~np.eye(n, dtype=bool)]
    # Thresholds of the design, not of rounding: the entries lie in ~[0.4,
    # 0.99], and their float32 error is ~1e-5 (rule 1, a few hundred ops).
    assert off.min() > 1e-3, (n, off)
    assert off.max() < 1 - 1e-3, (n, off)
    ratio = _tree_norm(g_div) / _tree_norm(g_policy)
    assert 1e-2 < ratio < 1e2, (n, ratio)


def test_policy_term_uses_shared_states():
  nets = td3.make_networks(pendulum_spec(), td3.TD3Config(hidden_sizes=(8, 8)))
  n, b = 3, 5
  policies = jax.jit(jax.vmap(nets.policy.init, (0, None)))(
      jax.random.split(jax.random.PRNGKey(0), n), jnp.zeros((1, 3)))
  obs = jax.random.normal(jax.random.PRNGKey(1), (n, b, 3))
  term = jax.jit(dvd.make_policy_term(nets.policy.apply, 0.7, SIGMA))
  # In float64 (test_loss_matches_direct_formula); the two forward passes'
  # actions (in [-1, 1], k = 32) move M's entries by < 4x that: k = 64 + 128.
  with numerics.float64():
    policies64, obs64 = numerics.as_float64((policies, obs))
    acts = np.asarray(jax.jit(jax.vmap(nets.policy.apply, (0, None)))(
        policies64, obs64[0]))
    np.testing.assert_allclose(term(policies64, obs64), 0.7 * np_loss(acts),
                               rtol=0, atol=0.7 * logdet_atol(n, 192))
  # Other members' batches do not enter: one program on the same states
  # gives the same bits.
  other = obs.at[1:].set(0.0)
  np.testing.assert_array_equal(term(policies, other), term(policies, obs))
  # Identical policies: finite gradient through the networks.
  same = jax.tree.map(lambda x: jnp.broadcast_to(x[:1], x.shape), policies)
  g = jax.jit(jax.grad(term))(same, obs)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g))


def test_with_diversity_traces_lambda_once():
  agent = tiny_td3()
  nets = td3.make_networks(agent.env_spec, agent.config)
  n, steps = 3, 2
  agent_hp = population_hparams(agent, n)
  batch = random_batch(agent.env_spec, (n, steps, 4), seed=0)

  diverse = SharedCriticLearner(
      dvd.with_diversity(agent.shared_critic, nets.policy.apply, SIGMA), steps)
  plain = SharedCriticLearner(agent.shared_critic, steps)
  key = jax.random.PRNGKey(0)

  # Two Adam steps along two programs: compared in float64 (rule 2).
  with numerics.float64():
    agent_hp, batch = numerics.as_float64((agent_hp, batch))
    hp0 = numerics.as_float64(dvd.dvd_hparams(agent_hp, 0.0))
    out0, _ = diverse.update(numerics.as_float64(diverse.init(key, hp0)), hp0,
                             batch)
    ref, _ = plain.update(numerics.as_float64(plain.init(key, agent_hp)),
                          agent_hp, batch)
    chex.assert_trees_all_close(out0, ref, **numerics.TRAJECTORY)

    hp1 = dvd.set_lambda(hp0, 5.0)
    out1, _ = diverse.update(numerics.as_float64(diverse.init(key, hp1)), hp1,
                             batch)
  assert diverse.compilations == 1  # a new lambda did not recompile
  delta = jax.tree.map(
      lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
      out1.policy, out0.policy)
  # And it acts on the policies: Adam's step moves them by ~lr = 3e-4 (6e-4
  # here), far above 1e-6, itself far above float64's rounding.
  assert max(jax.tree.leaves(delta)) > 1e-6
  # Lambda enters the policy loss only: with policy_update_fraction 0.5 the
  # policies (and targets) move on the second step, so both critic steps saw the same
  # target policies and the critics agree, bit for bit (one program, the
  # same inputs to the critic's steps).
  chex.assert_trees_all_equal(out1.critic, out0.critic)


def test_mean_pairwise_action_distance_by_hand():
  # Members 0 and 1 differ by (3, 4) on state 0 and not on state 1: mean
  # gap 2.5; member 2 sits 1 from member 0 on both states, so 1 from it and
  # (sqrt(2^2 + 4^2) + 1) / 2 from member 1.
  acts = np.array([[[0., 0.], [1., 1.]],
                   [[3., 4.], [1., 1.]],
                   [[1., 0.], [2., 1.]]], np.float32)
  expected = (2.5 + 1.0 + (np.sqrt(20.0) + 1.0) / 2) / 3
  # Positive terms, no cancellation: squares, a sum, a sqrt, means over 2
  # states and 9 pairs, a division: rule 1 with k = 16.
  np.testing.assert_allclose(dvd.mean_pairwise_action_distance(acts),
                             expected, rtol=numerics.rounding_rtol(16))
  assert float(dvd.mean_pairwise_action_distance(acts[[0, 0, 0]])) == 0.0
  with pytest.raises(ValueError, match='>= 2 members'):
    dvd.mean_pairwise_action_distance(acts[:1])


def test_piecewise_linear_schedule():
  sched = dvd.PiecewiseLinear(((0, 0.5), (100, 0.0), (200, 0.2)))
  assert sched(-5) == 0.5 and sched(0) == 0.5
  # np.interp in float64: a slope, a product and a sum (rule 1, k = 4).
  assert sched(50) == pytest.approx(0.25, rel=numerics.rounding_rtol(
      4, np.float64))
  assert sched(150) == pytest.approx(0.1, rel=numerics.rounding_rtol(
      4, np.float64)) and sched(1000) == 0.2
  with pytest.raises(ValueError, match='increase'):
    dvd.PiecewiseLinear(((0, 0.5), (0, 0.1)))


def test_thompson_bandit_prefers_the_better_arm():
  # Thompson sampling itself: no burn-in, no window (a stationary bandit).
  bandit = dvd.ThompsonBandit(arms=(0.0, 0.5), window=None, burn_in=0)
  state = bandit.init(np.random.default_rng(0))
  rewards = np.random.default_rng(1)
  success = {0: 0.2, 1: 0.7}
  pulls = np.zeros(2)
  for _ in range(400):
    state, arm, lam = bandit.select(state)
    assert lam == (0.0, 0.5)[arm]
    pulls[arm] += 1
    state = bandit.update(state, arm, float(rewards.uniform() < success[arm]))
  assert pulls[1] > 3 * pulls[0]
  # Statistical: a success rate over pulls[1] draws, sd sqrt(0.7 0.3 /
  # pulls[1]) = 0.024; 5 sd, plus the Beta(1, 1) prior's pull (1 / pulls[1]).
  np.testing.assert_allclose(
      bandit.means(state)[1], 0.7, rtol=0,
      atol=5 * np.sqrt(0.7 * 0.3 / pulls[1]) + 1 / pulls[1])
  # Beta counts: alpha - 1 + beta - 1 = pulls, sums of 0/1 rewards: exact.
  alpha, beta = bandit.posterior(state)
  np.testing.assert_array_equal(alpha + beta - 2, pulls)
  with pytest.raises(ValueError, match='reward'):
    bandit.update(state, 0, 2.0)
  with pytest.raises(ValueError, match='arm'):
    bandit.update(state, 2, 1.0)


def test_bandit_defaults_follow_the_authors_code():
  """Arms {0, 0.5}, Beta(1, 1) priors, 5 uniform choices first, posteriors
  over the last 50 rewards (``bandits.py`` of the authors' DvD-ES code)."""
  bandit = dvd.ThompsonBandit()
  assert bandit.arms == (0.0, 0.5) and bandit.burn_in == 5
  assert bandit.prior == (1.0, 1.0) and bandit.window == 50
  state = bandit.init(np.random.default_rng(0))
  for got in bandit.posterior(state):
    np.testing.assert_array_equal(got, [1.0, 1.0])
  # Window: 100 successes of arm 0, then 50 failures; only the failures
  # remain in the posterior, so arm 0 now looks bad.
  for reward in [1.0] * 100 + [0.0] * 50:
    state = bandit.update(state, 0, reward)
  alpha, beta = bandit.posterior(state)
  np.testing.assert_array_equal(alpha, [1.0, 1.0])
  np.testing.assert_array_equal(beta, [51.0, 1.0])
  assert bandit.history(state) == [(0, 0.0)] * 50
  unwindowed = dvd.ThompsonBandit(window=None)
  other = unwindowed.init(np.random.default_rng(0))
  for reward in [1.0] * 100 + [0.0] * 50:
    other = unwindowed.update(other, 0, reward)
  np.testing.assert_array_equal(unwindowed.posterior(other)[0], [101.0, 1.0])
  # Ties count half.
  state = bandit.update(state, 1, 0.5)
  np.testing.assert_array_equal(bandit.posterior(state)[0], [1.0, 1.5])


def test_bandit_burn_in_picks_uniformly_whatever_the_evidence():
  """During burn-in the arm is uniform even when the posterior is sure; after
  it, Thompson sampling follows the posterior."""
  bandit = dvd.ThompsonBandit(burn_in=5, window=None)
  first, later = [], []
  for seed in range(200):
    state = bandit.init(np.random.default_rng(seed))
    for _ in range(40):
      state = bandit.update(state, 0, 1.0)
      state = bandit.update(state, 1, 0.0)
    for _ in range(5):
      state, arm, _ = bandit.select(state)
      first.append(arm)
    later.append(bandit.select(state)[1])
  # Arm 1 about half the time: 1000 fair picks, sd 0.016; 0.1 is 6 sd.
  assert 0.4 < np.mean(first) < 0.6
  # Then (almost) never: P(Beta(1, 41) > Beta(41, 1)) ~ 1e-24 per pick; 0.02
  # allows 4 of 200.
  assert np.mean(later) < 0.02


def test_bandit_state_copy_continues_identically_and_inputs_stay():
  bandit = dvd.ThompsonBandit(burn_in=2)
  a = bandit.init(np.random.default_rng(3))
  for _ in range(4):
    a, arm, _ = bandit.select(a)
    a = bandit.update(a, arm, 1.0 if arm else 0.0)
  # What a checkpoint keeps: the arrays (tests/rules/dvd/test_rule.py writes
  # them through orbax).
  b = jax.tree.map(np.array, a)
  before = jax.tree.map(np.array, a)
  picks = []
  for state in (a, b):
    got = []
    for _ in range(20):
      state, arm, lam = bandit.select(state)
      state = bandit.update(state, arm, 0.5)
      got.append((arm, lam))
    picks.append(got)
  assert picks[0] == picks[1]
  # select and update returned new states: the one they were given is
  # unchanged (exact: the same arrays).
  jax.tree.map(np.testing.assert_array_equal, a, before)


class _OldThompsonBandit:
  """The bandit as it was before its state became arrays (a numpy
  ``Generator`` and a deque of ``(arm, reward)``): the reference the array
  state must draw exactly like."""

  def __init__(self, rng, arms, window, burn_in):
    self.rng, self.arms, self.burn_in = rng, tuple(arms), burn_in
    self.history = collections.deque(maxlen=window)
    self.selections = 0

  def posterior(self):
    a, b = np.ones(len(self.arms)), np.ones(len(self.arms))
    for arm, reward in self.history:
      a[arm] += reward
      b[arm] += 1.0 - reward
    return a, b

  def select(self):
    if self.selections < self.burn_in:
      arm = int(self.rng.integers(len(self.arms)))
    else:
      arm = int(np.argmax(self.rng.beta(*self.posterior())))
    self.selections += 1
    return arm, self.arms[arm]

  def update(self, arm, reward):
    self.history.append((arm, reward))


@pytest.mark.parametrize('window', [None, 1, 7])
def test_bandit_draws_as_the_numpy_generator_it_was_seeded_from(window):
  """The array state (PCG64's state, buffered 32-bit half included, and
  the windowed rewards) gives the draws of the generator-and-deque bandit
  it replaced, bit for bit, with rewards in [0, 1] of any value."""
  arms = (0.0, 0.25, 0.5)
  bandit = dvd.ThompsonBandit(arms, window=window, burn_in=4)
  state = bandit.init(np.random.default_rng(11))
  old = _OldThompsonBandit(np.random.default_rng(11), arms, window, 4)
  rewards = np.random.default_rng(12)
  for t in range(60):
    state, arm, lam = bandit.select(state)
    assert (arm, lam) == old.select(), t
    reward = float(rewards.choice([0.0, 0.5, 1.0, rewards.uniform()]))
    state = bandit.update(state, arm, reward)
    old.update(arm, reward)
    # The same additions in the same order: exact.
    for got, want in zip(bandit.posterior(state), old.posterior()):
      np.testing.assert_array_equal(got, want)
  assert pcg_draws(state.rng) == pcg_draws(
      rng_lib.pcg64_state(old.rng))


def pcg_draws(rng_state) -> list:
  rng = rng_lib.pcg64_generator(rng_state)
  return [int(rng.integers(2)), float(rng.random()), int(rng.integers(7))]


def test_pcg64_state_continues_the_generator_mid_32_bit_draw():
  rng = np.random.default_rng(5)
  rng.integers(2)  # draws 32 bits of a 64-bit output: the other half waits
  state = rng_lib.pcg64_state(rng)
  assert int(state.has_uint32) == 1
  copy = rng_lib.pcg64_generator(state)
  assert [copy.integers(2) for _ in range(9)] + [copy.random()] == [
      rng.integers(2) for _ in range(9)] + [rng.random()]
  with pytest.raises(ValueError, match='PCG64'):
    rng_lib.pcg64_state(np.random.Generator(np.random.MT19937(0)))


def test_improvement_reward_compares_with_the_best_recent_round():
  # No previous round: nothing to compare with, no reward (a first round
  # does not count as an improvement for whichever arm it played).
  assert dvd.improvement_reward([], 9.0) is None
  assert dvd.improvement_reward([-np.inf], 9.0) is None
  assert dvd.improvement_reward([10.0], 12.0) == 1.0
  assert dvd.improvement_reward([10.0], 9.0) == 0.0
  # Above the last round but below the best of the recent ones: no
  # improvement.
  assert dvd.improvement_reward([1.0, 7.0, 3.0], 6.0) == 0.0
  assert dvd.improvement_reward([1.0, 7.0, 3.0], 7.5) == 1.0
  assert dvd.improvement_reward([1.0, 7.0, 3.0], 7.0) == 0.5


def test_relative_gain_reward_compares_the_gain_with_the_recent_median():
  # Fewer than two previous rounds: no previous gain, no reward.
  assert dvd.relative_gain_reward([], 9.0) is None
  assert dvd.relative_gain_reward([10.0], 12.0) is None
  assert dvd.relative_gain_reward([-np.inf, 10.0], 12.0) is None
  # Previous gains 2, 6, 1 (median 2); this round gains 13 - 9 = 4.
  previous = [0.0, 2.0, 8.0, 9.0]
  assert dvd.relative_gain_reward(previous, 13.0) == 1.0
  assert dvd.relative_gain_reward(previous, 10.0) == 0.0  # gains 1 < 2
  assert dvd.relative_gain_reward(previous, 11.0) == 0.5  # gains 2 = 2
  # A new best that gains less than the usual pace earns 0 (improvement_reward
  # pays it 1): what a lambda costs while the population learns shows.
  assert dvd.improvement_reward(previous, 10.0) == 1.0
  # A fall that is smaller than the usual fall earns 1.
  assert dvd.relative_gain_reward([10.0, 6.0, 3.0], 2.0) == 1.0


def test_relative_gain_reward_is_even_for_arms_that_learn_alike():
  # A concave learning curve with noise, two arms that do not matter: each
  # arm's mean reward is near 1/2.
  rng = np.random.default_rng(0)
  scores = 4000 * (1 - np.exp(-np.arange(400) / 150)) + rng.normal(0, 30, 400)
  arms = rng.integers(2, size=400)
  gain = {0: [], 1: []}
  for t in range(6, 400):
    gain[arms[t]].append(dvd.relative_gain_reward(scores[t - 6:t], scores[t]))
  for arm in (0, 1):
    # Statistical: rewards in [0, 1] with mean 1/2, sd <= 0.5 / sqrt(n) per
    # arm (0.028 measured over 300 seeds); 5 sd.
    assert abs(np.mean(gain[arm]) - 0.5) < 5 * 0.5 / np.sqrt(len(gain[arm]))
  # And an arm that gains 20% less than the other is told apart.
  scores = np.zeros(400)
  for t in range(1, 400):
    scores[t] = scores[t - 1] + (8.0 if arms[t] else 10.0) + rng.normal(0, 1)
  gain = {0: [], 1: []}
  for t in range(6, 400):
    gain[arms[t]].append(dvd.relative_gain_reward(scores[t - 6:t], scores[t]))
  # The means are 0.78 and 0.22, sd 0.028 (measured over 300 seeds): the
  # thresholds are 6 sd away.
  assert np.mean(gain[0]) > 0.6 > 0.4 > np.mean(gain[1])


def _round(returns_by_member: dict, capacity: int = 8) -> dvd.RoundReturns:
  """A round with these returns, recorded member by member in dict order."""
  round_ = dvd.round_returns(4, capacity)
  for member, returns in returns_by_member.items():
    for value in returns:
      round_ = dvd.record_return(round_, member, value)
  return round_


def test_round_score_averages_members_then_population():
  returns = _round({0: [1.0, 3.0], 1: [10.0], 2: []})
  # Member means 2 and 10 (member 2 did not evaluate): mean 6, not the
  # episodes' mean 14 / 3.
  # Means of small integers: exact in float64.
  assert dvd.round_score(returns) == 6.0
  assert dvd.round_score(returns, 'mean') == 6.0
  assert dvd.round_score(returns, 'best') == 10.0
  assert dvd.round_score(_round({})) is None
  assert dvd.round_score(_round({3: []}), 'best') is None
  with pytest.raises(ValueError, match='mean.*best'):
    dvd.round_score(returns, 'median')


def test_round_score_is_numpys_mean_of_the_returns_as_they_came():
  """The same bits as the mean of each member's list of returns, members in
  the order they first evaluated (numpy sums 8 values or more pairwise, so
  a running sum would differ), however they interleave; past the capacity,
  the running sum stands in."""
  rng = np.random.default_rng(0)
  order = [2, 0, 3, 2, 1, 0] + list(rng.integers(4, size=40))
  lists, round_ = {}, dvd.round_returns(4, 16)
  for member in order:
    value = float(rng.normal(-1000, 300))
    lists.setdefault(int(member), []).append(value)
    round_ = dvd.record_return(round_, int(member), value)
  assert list(lists) == [2, 0, 3, 1] and all(
      8 <= len(r) <= 16 for r in lists.values())
  expected = float(np.mean([np.asarray(r, np.float64).mean()
                            for r in lists.values()]))
  # Exact: the same numpy reductions of the same values in the same order.
  assert dvd.round_score(round_) == expected
  assert dvd.round_score(round_, 'best') == max(max(r) for r in lists.values())
  # Capacity 4: means of running sums, equal within rounding (rule 1: the
  # sums of <= 16 terms of one sign, a division, and a mean of 4: k = 22).
  small = _round(lists, capacity=4)
  assert dvd.round_score(small) == pytest.approx(
      expected, rel=numerics.rounding_rtol(22, np.float64))
  assert dvd.round_score(small, 'best') == dvd.round_score(round_, 'best')
  # Recording made new arrays: the round it was given is unchanged.
  empty = dvd.round_returns(4, 4)
  dvd.record_return(empty, 1, 5.0)
  assert int(empty.counts.sum()) == 0 and np.isnan(empty.returns).all()
