"""DvD: the determinant diversity loss and its shared-critic plug-in
(the lambda bandit: ``test_bandit.py``)."""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme import specs

from fastpbrl.agents import td3
from fastpbrl.learner.population import SharedCriticLearner, population_hparams
from fastpbrl.rules.dvd import DvDRunConfig
from fastpbrl.rules.dvd import diversity as dvd
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
