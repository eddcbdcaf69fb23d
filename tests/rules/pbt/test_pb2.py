"""PB2's GP bandit against worked computations: the kernel, a two-point
posterior and its likelihood written out by hand, UCB choices recomputed
from those formulas, GP-BUCB's spreading, and the encoding of the search
space."""

import math

import numpy as np
import pytest

from fastpbrl.core import search_space as ss
from fastpbrl.rules.pbt import pb2

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


def history(t, x, change, start=None):
  """PB2's data; every interval started from fitness 0 unless ``start``
  says otherwise (one starting fitness adds nothing to the distances, so
  the GP is the one over ``(t, x)`` worked out above)."""
  t = np.asarray(t, np.float64)
  start = np.zeros(len(t)) if start is None else np.asarray(start, float)
  return pb2.History(t, start, np.asarray(x, np.float64),
                     np.asarray(change, np.float64))


def test_beta_is_the_authors_schedule_over_the_data_rows():
  assert pb2.beta(20) == pytest.approx(0.2 + math.log(8.0), rel=TOL)
  # Under 3 rows the logarithm is negative and counts as 0.
  assert pb2.beta(2) == pb2.beta(1) == pb2.beta(0) == 0.2


def test_changes_are_standardised_and_clipped():
  change = np.array([0.0] * 9 + [100.0])  # one collapse (or leap)
  mean, sd = 10.0, 30.0  # np.std of the ten values
  np.testing.assert_allclose(pb2.standardise(change),
                             [-mean / sd] * 9 + [pb2.CLIP], rtol=TOL)
  np.testing.assert_array_equal(pb2.standardise(np.array([3.0, 3.0])),
                                [0.0, 0.0])


def test_ucb_choice_is_the_argmax_of_the_hand_computed_bound(monkeypatch):
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = np.array([[0.0], [0.2], [0.45], [0.6], [0.95]])
  # Outputs already standardised (mean 0, sd 1), so select keeps them.
  y = np.array([1.0, -1.0])
  kappa = math.sqrt(pb2.beta(2))
  bounds = []
  for p in points[:, 0]:
    mean, variance = hand_posterior(2.0, p, y)
    bounds.append(mean + kappa * math.sqrt(max(variance, 0.0)))
  chosen = pb2.select(history(T, X, y), 2, [0.0], points)
  np.testing.assert_array_equal(chosen, points[[int(np.argmax(bounds))]])


def test_several_choices_spread_out_by_the_shrinking_variance(monkeypatch):
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = pb2.candidates(1, seed=0)
  # Flat data: the mean is the same everywhere, so the variance decides
  # and no point is picked twice.
  chosen = pb2.select(history(T, X, [0.3, 0.3]), 2, [0.0] * 3, points)
  assert len({float(c) for c in chosen[:, 0]}) == 3
  # Without data, the first choice is the first Sobol point (all tie).
  first = pb2.select(history([], np.zeros((0, 1)), []), 1, [0.0, 0.0],
                     points)
  np.testing.assert_array_equal(first[0], points[0])
  assert abs(first[1, 0] - first[0, 0]) > 0.1


def test_the_choice_follows_the_data():
  """Intervals trained with a larger x gained more: the next choice is in
  the upper half (the mean dominates the bound there)."""
  t = np.repeat(np.arange(5.0), 8)
  x = np.tile(np.linspace(0.0, 1.0, 8), 5)[:, None]
  chosen = pb2.select(history(t, x, 3.0 * x[:, 0]), 5, [0.0],
                      pb2.candidates(1, seed=1))
  assert chosen[0, 0] > 0.5


def test_the_choice_depends_on_the_fitness_it_starts_from():
  """Members that started low gained most with a large x, those that
  started high with a small one: a copy of a high parent gets a small x,
  of a low one a large x (a model without the starting fitness sees a
  flat average and cannot tell them apart)."""
  grid = np.linspace(0.0, 1.0, 8)
  t = np.repeat(np.arange(6.0), 16)
  x = np.tile(np.concatenate([grid, grid]), 6)[:, None]
  start = np.tile(np.repeat([-500.0, -100.0], 8), 6)
  change = np.where(start < -300.0, x[:, 0], 1.0 - x[:, 0])
  data = history(t, x, change, start)
  points = pb2.candidates(1, seed=2)
  assert pb2.select(data, 6, [-500.0], points)[0, 0] > 0.6
  assert pb2.select(data, 6, [-100.0], points)[0, 0] < 0.4


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
  rows = pb2.append(rows, 0, np.array([-5.0, -7.0]), np.array([[0.1], [0.2]]),
                    np.array([np.nan, 2.0]))
  got = pb2.data(rows)
  np.testing.assert_array_equal(got.t, [0.0])
  np.testing.assert_array_equal(got.start, [-7.0])
  np.testing.assert_array_equal(got.x, [[0.2]])
  np.testing.assert_array_equal(got.change, [2.0])
  for step in range(1, pb2.WINDOW + 5):
    rows = pb2.append(rows, step, np.array([1.0]), np.array([[0.5]]),
                      np.array([1.0 * step]))
  got = pb2.data(rows)
  assert len(got.t) == pb2.WINDOW and got.t[-1] == pb2.WINDOW + 4
  assert got.t[0] == 5 and got.change[0] == 5.0


def test_explore_is_a_function_of_its_seed():
  rows = pb2.append(pb2.empty_history(3), 0, np.array([0.0, 1.0, 2.0, 3.0]),
                    np.full((4, 3), 0.5), np.array([1.0, 2.0, 0.5, -1.0]))
  a = pb2.explore(SPACE, rows, 1, [3.0, 1.0], seed=7)
  b = pb2.explore(SPACE, rows, 1, [3.0, 1.0], seed=7)
  c = pb2.explore(SPACE, rows, 1, [3.0, 1.0], seed=8)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])
    assert len(a[name]) == 2
  assert any(not np.array_equal(a[n], c[n]) for n in a)


def test_the_choice_keeps_away_from_the_members_still_running(monkeypatch):
  """Flat data: the bound is highest where the variance is, so a member
  running at 0.5 next interval, from the same fitness, pushes the choice
  away from 0.5 (and it would not without it)."""
  monkeypatch.setattr(pb2, 'fit_params', lambda t, x, y: PARAMS)
  points = np.linspace(0.0, 1.0, 101)[:, None]
  flat = history(T, X, [0.3, 0.3])
  alone = pb2.select(flat, 2, [0.0], points)
  beside = pb2.select(flat, 2, [0.0], points,
                      running=pb2.Pending(np.zeros(1), np.array([[0.5]])))
  mean_free = pb2.select(flat, 2, [0.0], points,
                         running=pb2.Pending(np.zeros(1), alone[:1]))
  assert abs(beside[0, 0] - 0.5) > 0.2
  assert abs(mean_free[0, 0] - alone[0, 0]) > 0.1


def test_fitness_is_scaled_over_everything_the_decision_knows():
  """No data yet: a member running from a fitness close to the copy's
  (-110 against -100, on a spread of 200) counts as near it, so the
  choice keeps away from its value 0.1; in raw units (10 apart, against
  a length scale of 0.2) it would count for nothing, and the first of
  the tied points, 0.0, would be taken."""
  points = np.linspace(0.0, 1.0, 101)[:, None]
  running = pb2.Pending(np.array([-110.0, -300.0]), np.array([[0.1], [0.9]]))
  chosen = pb2.select(history([], np.zeros((0, 1)), []), 1, [-100.0], points,
                      running)
  assert chosen[0, 0] > 0.5


def test_contexts_are_scaled_to_the_unit_interval_beside_x():
  scale = pb2.start_scale(np.array([-300.0, -100.0, -200.0]))
  assert scale == (-300.0, 200.0)
  np.testing.assert_allclose(
      pb2.inputs(np.array([-200.0, -100.0]), np.array([[0.2], [0.7]]), scale),
      [[0.5, 0.2], [1.0, 0.7]], rtol=TOL)
  # One value (or one but for rounding): a span of 1, not a blown-up one.
  assert pb2.start_scale(np.array([5.0, 5.0 + 1e-12]))[1] == 1.0
  assert pb2.start_scale(np.zeros(0)) == (0.0, 1.0)


def test_length_scale_is_capped_as_the_authors_cap_it():
  """Their kernel is exp(-d^2 / l) with l <= 1; ours exp(-d^2 / (2 l^2))."""
  assert pb2.LENGTHSCALE_BOUNDS[1] == pytest.approx(1 / math.sqrt(2), rel=TOL)


def test_each_choice_of_a_batch_is_pending_at_its_own_context(monkeypatch):
  """Flat data: a second copy from the same parent context keeps away from
  the first copy's choice; one from a context far off (a distance of 1
  against a length scale of 0.1) does not, and takes the same point."""
  monkeypatch.setattr(pb2, 'fit_params',
                      lambda t, x, y: PARAMS._replace(lengthscale=0.1))
  points = np.linspace(0.0, 1.0, 101)[:, None]
  flat = history(T, X, [0.3, 0.3], start=[-500.0, -100.0])
  same = pb2.select(flat, 2, [-100.0, -100.0], points)
  apart = pb2.select(flat, 2, [-100.0, -500.0], points)
  assert abs(same[1, 0] - same[0, 0]) > 0.1
  one = pb2.select(flat, 2, [-500.0], points)
  np.testing.assert_array_equal(apart[1], one[0])
