"""PB2's GP bandit against worked computations: the kernel, a two-point
posterior and its likelihood written out by hand, UCB choices recomputed
from those formulas, GP-BUCB's spreading, and the encoding of the search
space."""

import math

import numpy as np
import pytest

from fastpbrl import search_space as ss
from fastpbrl.population import pb2

PARAMS = pb2.KernelParams(variance=1.3, lengthscale=0.5, epsilon=0.2,
                          noise=0.1)
# Two intervals: (t, x, change of fitness).
T = np.array([0.0, 1.0])
X = np.array([[0.2], [0.6]])
Y = np.array([1.0, -0.5])
# A handful of double-precision operations on values of order 1: the
# results agree to rounding, far below 1e-12.
TOL = 1e-12


def k(t1, x1, t2, x2):
  """The kernel, written out for one pair of 1-D points."""
  return (PARAMS.variance * math.exp(-(x1 - x2) ** 2 / (2 * 0.5**2))
          * 0.8 ** (abs(t1 - t2) / 2))


def hand_posterior(t, x, y=Y):
  """Mean and variance at (t, x), given outputs ``y`` at (T, X), from the
  explicit inverse of the 2x2 matrix K + n2 I."""
  a = k(0, 0.2, 0, 0.2) + 0.1
  b = k(0, 0.2, 1, 0.6)
  d = k(1, 0.6, 1, 0.6) + 0.1
  det = a * d - b * b
  inv = np.array([[d, -b], [-b, a]]) / det
  ks = np.array([k(t, x, 0, 0.2), k(t, x, 1, 0.6)])
  return ks @ inv @ y, PARAMS.variance - ks @ inv @ ks


def test_kernel_is_the_product_of_its_parts():
  got = pb2.kernel(T, X, T, X, PARAMS)
  for i in range(2):
    for j in range(2):
      assert got[i, j] == pytest.approx(
          k(T[i], X[i, 0], T[j], X[j, 0]), rel=TOL)
  # Equal hyperparameters, intervals 4 apart: (1 - eps)^2 of the variance.
  far = pb2.kernel(np.array([0.0]), X[:1], np.array([4.0]), X[:1], PARAMS)
  assert far[0, 0] == pytest.approx(1.3 * 0.64, rel=TOL)


@pytest.mark.parametrize('t,x', [(2.0, 0.6), (1.0, 0.2), (5.0, 0.9)])
def test_posterior_matches_the_hand_worked_two_point_gp(t, x):
  gp = pb2.posterior(T, X, Y, PARAMS)
  mean, variance = pb2.predict(gp, np.array([t]), np.array([[x]]))
  want_mean, want_variance = hand_posterior(t, x)
  assert mean[0] == pytest.approx(want_mean, abs=TOL)
  assert variance[0] == pytest.approx(want_variance, abs=TOL)


def test_log_marginal_likelihood_matches_its_formula():
  a, b, d = k(0, .2, 0, .2) + 0.1, k(0, .2, 1, .6), k(1, .6, 1, .6) + 0.1
  det = a * d - b * b
  quad = (d * Y[0] ** 2 - 2 * b * Y[0] * Y[1] + a * Y[1] ** 2) / det
  want = -0.5 * quad - 0.5 * math.log(det) - math.log(2 * math.pi)
  got = pb2.log_marginal_likelihood(T, X, Y, PARAMS)
  assert got == pytest.approx(want, abs=TOL)


def test_fitted_settings_are_within_bounds_and_beat_every_start():
  rng = np.random.default_rng(0)
  t = np.repeat(np.arange(6.0), 4)
  x = rng.uniform(size=(24, 2))
  y = np.sin(4 * x[:, 0]) + 0.1 * rng.normal(size=24)
  y = (y - y.mean()) / y.std()
  fitted = pb2.fit_params(t, x, y)
  best = pb2.log_marginal_likelihood(t, x, y, fitted)
  for start in pb2._STARTS:  # noqa: SLF001
    assert best >= pb2.log_marginal_likelihood(
        t, x, y, pb2.KernelParams(*start)) - 1e-9
  for value, (lo, hi) in zip(fitted, pb2._BOUNDS):  # noqa: SLF001
    assert lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9)
  # Only x's first coordinate matters: the fit finds a smooth function
  # (a length scale well above the noise level of a white-noise fit).
  assert fitted.lengthscale > 0.1


def test_beta_is_srinivas_finite_set_bound_scaled_by_a_fifth():
  assert pb2.beta(3, 1024) == pytest.approx(
      0.2 * 2 * math.log(1024 * 9 * math.pi**2 / 0.6), rel=TOL)
  assert pb2.beta(0, 10) == pb2.beta(1, 10)  # t counts from 1


def test_ucb_choice_is_the_argmax_of_the_hand_computed_bound(monkeypatch):
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = np.array([[0.0], [0.2], [0.45], [0.6], [0.95]])
  # Outputs already standardised (mean 0, sd 1), so select keeps them.
  y = np.array([1.0, -1.0])
  kappa = math.sqrt(pb2.beta(2, len(points)))
  bounds = []
  for p in points[:, 0]:
    mean, variance = hand_posterior(2.0, p, y)
    bounds.append(mean + kappa * math.sqrt(max(variance, 0.0)))
  chosen = pb2.select(T, X, y, 2, 1, points)
  np.testing.assert_array_equal(chosen, points[[int(np.argmax(bounds))]])


def test_several_choices_spread_out_by_the_shrinking_variance(monkeypatch):
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = pb2.candidates(1, seed=0)
  # Flat data: the mean is the same everywhere, so the variance decides
  # and no point is picked twice.
  chosen = pb2.select(T, X, np.array([0.3, 0.3]), 2, 3, points)
  assert len({float(c) for c in chosen[:, 0]}) == 3
  # Without data, the first choice is the first Sobol point (all tie).
  first = pb2.select(np.zeros(0), np.zeros((0, 1)), np.zeros(0), 1, 2, points)
  np.testing.assert_array_equal(first[0], points[0])
  assert abs(first[1, 0] - first[0, 0]) > 0.1


def test_the_choice_follows_the_data():
  """Intervals trained with a larger x gained more: the next choice is in
  the upper half (the mean dominates the bound there)."""
  t = np.repeat(np.arange(5.0), 8)
  x = np.tile(np.linspace(0.0, 1.0, 8), 5)[:, None]
  y = 3.0 * x[:, 0]
  chosen = pb2.select(t, x, y, 5, 1, pb2.candidates(1, seed=1))
  assert chosen[0, 0] > 0.5


SPACE = ss.SearchSpace({
    'policy_lr': ss.LogUniform(1e-4, 1e-2),
    'tau': ss.Uniform(0.001, 0.1),
    'discount': ss.Discount(0.9, 0.999),
    'batch': ss.Categorical((64, 128, 256)),
})


def test_encoding_is_uniform_in_the_priors_coordinates_and_round_trips():
  assert pb2.continuous_fields(SPACE) == ('policy_lr', 'tau', 'discount')
  values = {'policy_lr': np.array([1e-4, 1e-3, 1e-2]),
            'tau': np.array([0.001, 0.0505, 0.1]),
            'discount': np.array([0.9, 0.99, 0.999])}
  x = pb2.encode(SPACE, values)
  # Bounds at 0 and 1; the log-scale middles at 0.5: 1e-3 between 1e-4 and
  # 1e-2, 1 - 0.99 between 1e-3 and 1e-1. A discount is encoded by its
  # 1 - gamma, so 0.9 (1 - gamma = 0.1, the largest) is at 1.
  np.testing.assert_allclose(x, [[0, 0, 1], [0.5, 0.5, 0.5], [1, 1, 0]],
                             atol=1e-12)
  back = pb2.decode(SPACE, x)
  for name, want in values.items():
    np.testing.assert_allclose(back[name], want, rtol=1e-12)
  clipped = pb2.encode(SPACE, {'policy_lr': np.array([1.0]),
                               'tau': np.array([-1.0]),
                               'discount': np.array([0.5])})
  np.testing.assert_array_equal(clipped, [[1.0, 0.0, 1.0]])


def test_history_keeps_the_newest_known_changes():
  rows = pb2.empty_history(1)
  rows = pb2.append(rows, 0, np.array([[0.1], [0.2]]),
                    np.array([np.nan, 2.0]))
  t, x, y = pb2.data(rows)
  np.testing.assert_array_equal(t, [0.0])
  np.testing.assert_array_equal(x, [[0.2]])
  np.testing.assert_array_equal(y, [2.0])
  for step in range(1, pb2.WINDOW + 5):
    rows = pb2.append(rows, step, np.array([[0.5]]), np.array([1.0 * step]))
  t, _, y = pb2.data(rows)
  assert len(t) == pb2.WINDOW and t[-1] == pb2.WINDOW + 4 and t[0] == 5


def test_explore_is_a_function_of_its_seed():
  rows = pb2.append(pb2.empty_history(3), 0, np.full((4, 3), 0.5),
                    np.array([1.0, 2.0, 0.5, -1.0]))
  a = pb2.explore(SPACE, rows, 1, [0, 2], seed=7)
  b = pb2.explore(SPACE, rows, 1, [0, 2], seed=7)
  c = pb2.explore(SPACE, rows, 1, [0, 2], seed=8)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])
    assert len(a[name]) == 2
  assert any(not np.array_equal(a[n], c[n]) for n in a)


def test_the_choice_keeps_away_from_the_members_still_running(monkeypatch):
  """Flat data: the bound is highest where the variance is, so a member
  running at 0.5 next interval pushes the choice away from 0.5 (and it
  would not without it)."""
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = np.linspace(0.0, 1.0, 101)[:, None]
  flat = np.array([0.3, 0.3])
  alone = pb2.select(T, X, flat, 2, 1, points)
  beside = pb2.select(T, X, flat, 2, 1, points, running=np.array([[0.5]]))
  mean_free = pb2.select(T, X, flat, 2, 1, points,
                         running=np.array([alone[0]]))
  assert abs(beside[0, 0] - 0.5) > 0.2
  assert abs(mean_free[0, 0] - alone[0, 0]) > 0.1
