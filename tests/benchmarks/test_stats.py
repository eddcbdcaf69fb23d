"""The learning report's statistics against values worked out by hand and
against a brute-force bootstrap."""

import math

import numpy as np
import pytest

from benchmarks import stats


def test_sample_std_divides_by_n_minus_one():
  # mean 2; squared deviations 1 + 0 + 1 = 2; 2 / (3 - 1) = 1.
  assert stats.sample_std([1.0, 2.0, 3.0]) == pytest.approx(1.0, rel=1e-12)
  assert math.isnan(stats.sample_std([5.0]))


def test_iqm_is_the_mean_of_the_middle_half():
  # 8 values, sorted -50 1 2 3 4 5 6 100: drop the 2 lowest and the 2
  # highest, mean of 2, 3, 4, 5 = 3.5.
  assert stats.iqm([100, 1, 2, 3, 4, 5, 6, -50]) == pytest.approx(3.5)
  # 5 values: floor(1.25) = 1 trimmed at each end: mean of 2, 3, 4.
  assert stats.iqm([1, 2, 3, 4, 1000]) == pytest.approx(3.0)


def test_probability_of_improvement_counts_pairs_and_halves_ties():
  # Pairs (x, y): (3,1) (3,2) (3,3) (0,1) (0,2) (0,3): wins 2, tie 1 of 6.
  assert stats.probability_of_improvement([3, 0], [1, 2, 3]) == (
      pytest.approx(2.5 / 6))
  assert stats.probability_of_improvement([5, 6], [1, 2]) == 1.0
  assert stats.probability_of_improvement([1, 2], [1, 2]) == 0.5


def brute_force_interval(x, y, resamples, seed):
  """Percentile bootstrap, written out: resample each side's seeds with
  replacement, recompute P(X > Y), take the 2.5th and 97.5th percentiles."""
  rng = np.random.default_rng(seed)
  values = []
  for _ in range(resamples):
    xs = rng.choice(x, size=len(x), replace=True)
    ys = rng.choice(y, size=len(y), replace=True)
    values.append(stats.probability_of_improvement(xs, ys))
  return np.percentile(values, [2.5, 97.5])


def test_improvement_interval_matches_a_brute_force_bootstrap():
  x = [-110.0, -120.0, -95.0, -130.0, -101.0]
  y = [-150.0, -140.0, -125.0, -160.0, -118.0]
  interval = stats.improvement_interval(x, y)
  low, high = brute_force_interval(x, y, 4000, seed=1)
  # Two independent Monte Carlo estimates of the same percentiles: each
  # endpoint is a multiple of 1/50 (pairs of 5 x 5 seeds, ties halved),
  # and 10,000 / 4,000 resamples put them within one or two steps.
  assert interval.value == pytest.approx(0.88)
  assert abs(interval.low - low) <= 0.06 and abs(interval.high - high) <= 0.06
  assert stats.verdict(interval, 5) == 'better'
  assert stats.verdict(interval, 4) == 'too few seeds (< 5)'


def test_verdict_needs_the_interval_to_exclude_one_half():
  assert stats.verdict(stats.Interval(0.7, 0.4, 0.9), 5) == (
      'not distinguishable')
  assert stats.verdict(stats.Interval(0.1, 0.0, 0.45), 6) == 'worse'
  assert stats.verdict(stats.Interval(0.9, math.nan, math.nan), 9) == (
      'too few seeds (< 5)')
  assert math.isnan(stats.improvement_interval([1.0], [0.0, 2.0]).low)


def test_iqm_interval_brackets_the_iqm_and_is_reproducible():
  values = [-120.0, -110.0, -160.0, -115.0, -105.0, -300.0]
  first, again = stats.iqm_interval(values), stats.iqm_interval(values)
  assert first == again  # a fixed resampling seed
  assert first.low <= first.value <= first.high
  assert min(values) <= first.low and first.high <= max(values)
  assert math.isnan(stats.iqm_interval([1.0]).low)


def test_two_seeds_a_side_are_called_better_only_when_separated():
  # By hand: with 2 against 2 and one pair crossed (P = 3/4, rule {1, 3},
  # baseline {0, 2}), the resample rule {1, 1} against baseline {2, 2}
  # (chance 1/16 > 2.5%) has P = 0, so the interval reaches below 1/2.
  assert stats.improvement_interval([1, 3], [0, 2]).low < 0.5
  assert stats.smallest_decisive_probability(2, 2) == 1.0


def test_smallest_decisive_probability_splits_real_returns_at_five_seeds():
  """Returns drawn from normals (not ranks): at 5 seeds a side, the
  verdict is "better" exactly where P reaches the threshold."""
  threshold = stats.smallest_decisive_probability(5, 5)
  assert threshold == 21 / 25
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(60):
    x, y = rng.normal(1.5, 1.0, 5), rng.normal(0.0, 1.0, 5)
    interval = stats.improvement_interval(x, y)
    better = stats.verdict(interval, 5) == 'better'
    assert better == (interval.value >= threshold), (x, y, interval)
    seen.add(better)
  assert seen == {True, False}  # both sides of the threshold were drawn


def test_normal_gap_inverts_the_probability_of_improvement():
  # P(X > Y) for X ~ N(gap, 1), Y ~ N(0, 1) is Phi(gap / sqrt(2)).
  for gap in (0.0, 0.5, 1.41):
    p = 0.5 * (1.0 + math.erf(gap / 2.0))
    assert abs(stats.normal_gap(p) - gap) < 1e-9


def test_fmt_value_never_rounds_a_nonzero_value_to_zero():
  assert stats.fmt_value(-284.4) == '-284'
  assert stats.fmt_value(0.0) == '0'
  # Below half a unit of the last decimal: two significant digits.
  assert stats.fmt_value(-1.94e-6) == '-1.9e-06'
  assert stats.fmt_value(-0.4) == '-0.4'
  assert stats.fmt_value(0.004, 2) == '0.004'
  assert stats.fmt_value(0.5, 2) == '0.50'
  assert stats.fmt_interval(stats.Interval(-2e-6, -3e-6, -1e-6)) == (
      '-2e-06 [-3e-06, -1e-06]')
